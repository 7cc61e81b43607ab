"""Gateway API on the session's local control plane.

    def test_x(gateway_api, k8s_cluster):          # session fixture: the standard-channel CRDs
        kube = kube_client(k8s_cluster)            # kvpilot.operator.kube.Kube, admin certificate
        apply_gateway(kube, "infra", "shared-gw")  # a GatewayClass + Gateway (no controller programs it)

`gateway_api` installs the CRDs of `sigs.k8s.io/gateway-api` pinned in tools/gateway-api/go.mod
(kvpilot.cluster.gateway_api: copied from the Go module into ~/.cache/kvpilot/gateway-api/<version>/)
once per session, on top of `k8s_cluster`, and yields their names.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kvpilot.cluster import gateway_api as gw
from kvpilot.cluster.local import LocalCluster

GATEWAY_CLASS = "kvpilot-local"
CONTROLLER_NAME = "kvpilot.io/local-gateway"


@pytest.fixture(scope="session")
def gateway_api(k8s_cluster: LocalCluster) -> Iterator[list[str]]:
    yield gw.install(k8s_cluster.api())


def kube_client(cluster: LocalCluster):  # type: ignore[no-untyped-def]
    """The operator's own REST client (kvpilot.operator.kube.Kube) with the cluster's admin certificate."""
    from kvpilot.operator.kube import Kube

    keys = cluster.pki
    return Kube(cluster.server, ca_file=str(keys.ca_cert), cert=(str(keys.admin_cert), str(keys.admin_key)),
                token=None)


def gateway_class(name: str = GATEWAY_CLASS) -> dict[str, Any]:
    return {"apiVersion": f"{gw.GROUP}/v1", "kind": "GatewayClass", "metadata": {"name": name},
            "spec": {"controllerName": CONTROLLER_NAME}}


def gateway(namespace: str, name: str, class_name: str = GATEWAY_CLASS, port: int = 80) -> dict[str, Any]:
    """A Gateway with one HTTP listener that accepts routes from every namespace."""
    return {"apiVersion": f"{gw.GROUP}/v1", "kind": "Gateway", "metadata": {"name": name, "namespace": namespace},
            "spec": {"gatewayClassName": class_name, "listeners": [
                {"name": "http", "protocol": "HTTP", "port": port, "allowedRoutes": {"namespaces": {"from": "All"}}}]}}


def apply_gateway(kube, namespace: str, name: str, class_name: str = GATEWAY_CLASS) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """Server-side apply the GatewayClass and the Gateway; returns the Gateway as stored."""
    params = {"fieldManager": "kvpilot-tests", "force": "true"}
    apply = "application/apply-patch+yaml"
    kube.request("PATCH", f"/apis/{gw.GROUP}/v1/gatewayclasses/{class_name}", body=gateway_class(class_name),
                 params=params, content_type=apply)
    return kube.request("PATCH", f"/apis/{gw.GROUP}/v1/namespaces/{namespace}/gateways/{name}",
                        body=gateway(namespace, name, class_name), params=params, content_type=apply)
