"""The operator's Kubernetes client follows a rotated service-account token, on the real API server.

Two bound tokens of one ServiceAccount (TokenRequest API), each bound to a Secret: deleting the
Secret revokes its token at once, as expiry would after an hour. The token file is laid out as the
kubelet projects it (`token -> ..data/token`, `..data` swapped atomically on rotation) and named by
a kubeconfig's `tokenFile`. A client that kept the first token (as kube.py did) gets 401; the
file-following one carries on with the second.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from kvpilot.operator.kube import Kube, KubeError, object_path
from tests.harness.cluster import k8s_api_client, unique_namespace, wait_for

pytestmark = pytest.mark.cluster


def project(directory: Path, token: str, generation: int) -> None:
    """Write `token` the way the kubelet does: a new timestamped dir, then swap the ..data symlink."""
    target = directory / f"..gen_{generation}"
    target.mkdir()
    (target / "token").write_text(token)
    tmp = directory / "..data_tmp"
    os.symlink(target.name, tmp)
    os.replace(tmp, directory / "..data")
    if not (directory / "token").is_symlink():
        os.symlink("..data/token", directory / "token")


def test_the_client_follows_a_rotated_token_file(k8s_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from kubernetes import client

    api = k8s_api_client(k8s_cluster)
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    ns = unique_namespace(core, "tok")
    try:
        core.create_namespaced_service_account(ns, {"metadata": {"name": "operator"}})
        rbac.create_namespaced_role(ns, {"metadata": {"name": "read"}, "rules": [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]})
        rbac.create_namespaced_role_binding(ns, {
            "metadata": {"name": "read"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read"},
            "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": ns}]})
        core.create_namespaced_config_map(ns, {"metadata": {"name": "probe"}, "data": {"k": "v"}})

        def bound_token(holder: str) -> str:
            secret = core.create_namespaced_secret(ns, {"metadata": {"name": holder}})
            request = {"spec": {"expirationSeconds": 3600, "boundObjectRef": {
                "kind": "Secret", "apiVersion": "v1", "name": holder, "uid": secret.metadata.uid}}}
            return core.create_namespaced_service_account_token("operator", ns, request).status.token

        first, second = bound_token("holder-1"), bound_token("holder-2")
        assert first != second
        projected = tmp_path / "serviceaccount"
        projected.mkdir()
        project(projected, first, 1)
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "sa",
            "clusters": [{"name": "local", "cluster": {"server": k8s_cluster.server,
                                                       "certificate-authority": str(k8s_cluster.pki.ca_cert)}}],
            "users": [{"name": "operator", "user": {"tokenFile": str(projected / "token")}}],
            "contexts": [{"name": "sa", "context": {"cluster": "local", "user": "operator", "namespace": ns}}],
        }))
        path = object_path("v1", "ConfigMap", ns, "probe")
        following = Kube.from_environment(str(kubeconfig))
        assert following.token_file is not None and following.token_file.path == projected / "token"
        kept = Kube(k8s_cluster.server, ca_file=str(k8s_cluster.pki.ca_cert), cert=None, token=first)
        assert following.get(path)["data"] == {"k": "v"} and kept.get(path)["data"] == {"k": "v"}

        core.delete_namespaced_secret("holder-1", ns)  # the first token is revoked (as if it expired)

        def refused(kube: Kube) -> bool:
            try:
                kube.get(path)
            except KubeError as exc:
                return exc.status == 401
            return False

        wait_for(lambda: refused(kept), "the first token refused (401)", 60)
        project(projected, second, 2)  # the kubelet's rotation
        assert following.get(path)["data"] == {"k": "v"}
        assert following.token_file.reads == 2
        assert refused(kept)  # what the client did before: the token it read at start, now dead
        for _ in range(3):  # and it stays on the second token without reading the file again
            assert following.get(path)["data"] == {"k": "v"}
        assert following.token_file.reads == 2
        following.close()
        kept.close()
    finally:
        core.delete_namespace(ns)
