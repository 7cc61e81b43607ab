"""Faults in the fleet with real components (issue 22): the operator SIGKILLed between two writes
of one reconcile, and the API server restarted under a running operator.

Elsewhere: Prometheus stopped during an analysis is
tests/cluster/test_rollout.py::test_prometheus_down_during_analysis_is_inconclusive_and_never_promotes;
the operator killed mid-rollout is test_rollout.py::test_operator_killed_mid_rollout_resumes_without_repeating_a_step;
an engine restart failing the analysis is tests/service/test_analysis_prometheus.py.
The API-server restart runs last in this module and waits until the shared control plane serves
again, so the tests after it find it healthy.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.cluster import k8s_api_client, unique_namespace, wait_for
from tests.harness.operator import Kubectl, OperatorProcess, manifest

pytestmark = pytest.mark.cluster

SELECTOR = "kvpilot.io/service={name}"


class Env:
    def __init__(self, cluster, tmp: Path) -> None:  # type: ignore[no-untyped-def]
        from kubernetes import client

        self.cluster, self.tmp = cluster, tmp
        self.kubectl = Kubectl(cluster.kubeconfig)
        api_client = k8s_api_client(cluster)
        self.core, self.apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.namespaces: list[str] = []

    def namespace(self) -> str:
        ns = unique_namespace(self.core, "fault")
        self.namespaces.append(ns)
        return ns

    def operator(self, ns: str, kill_after_writes: int = 0) -> OperatorProcess:
        op = OperatorProcess(self.cluster.kubeconfig, ns, self.tmp / f"operator-{ns}-{kill_after_writes}.log")
        old = os.environ.get("KVPILOT_TEST_SIGKILL_AFTER_WRITES")
        os.environ["KVPILOT_TEST_SIGKILL_AFTER_WRITES"] = str(kill_after_writes)
        try:
            op.start()
        finally:
            if old is None:
                os.environ.pop("KVPILOT_TEST_SIGKILL_AFTER_WRITES")
            else:
                os.environ["KVPILOT_TEST_SIGKILL_AFTER_WRITES"] = old
        return op

    def children(self, ns: str, name: str) -> dict[str, list]:
        sel = SELECTOR.format(name=name)
        return {"deployments": self.apps.list_namespaced_deployment(ns, label_selector=sel).items,
                "services": self.core.list_namespaced_service(ns, label_selector=sel).items,
                "configmaps": self.core.list_namespaced_config_map(ns, label_selector=sel).items}

    def service(self, ns: str, name: str) -> dict:
        return self.custom.get_namespaced_custom_object("kvpilot.io", "v1alpha1", ns, "inferenceservices", name)


@pytest.fixture(scope="module")
def env(k8s_cluster, tmp_path_factory) -> Iterator[Env]:  # type: ignore[no-untyped-def]
    e = Env(k8s_cluster, tmp_path_factory.mktemp("faults"))
    e.kubectl.install_crd()
    try:
        yield e
    finally:
        for ns in e.namespaces:
            e.core.delete_namespace(ns)


def assert_complete_and_single(env: Env, ns: str, name: str) -> None:
    """One Deployment (2 replicas, the spec's strategy), API + metrics Services, the lineage
    ConfigMap: each exactly once and owned by the InferenceService (no orphans, no duplicates)."""
    uid = env.service(ns, name)["metadata"]["uid"]
    kids = env.children(ns, name)
    assert sorted(d.metadata.name for d in kids["deployments"]) == [f"{name}-stable"]
    assert sorted(s.metadata.name for s in kids["services"]) == [name, f"{name}-metrics"]
    assert sorted(c.metadata.name for c in kids["configmaps"]) == [f"{name}-lineage"]
    for obj in [o for objs in kids.values() for o in objs]:
        assert [r.uid for r in obj.metadata.owner_references] == [uid], obj.metadata.name
    (dep,) = kids["deployments"]
    assert dep.spec.replicas == 2
    args = dep.spec.template.spec.containers[0].args
    assert args[args.index("--kv-head-groups") + 1] == "4"
    assert dep.spec.template.spec.security_context.run_as_non_root is True


@pytest.mark.parametrize("kill_after_writes", [1, 3])
def test_operator_killed_between_two_writes_leaves_nothing_half_applied(env: Env, kill_after_writes: int) -> None:
    ns, name = env.namespace(), "chat"
    doomed = env.operator(ns, kill_after_writes)
    env.kubectl.apply(manifest(name, ns))
    wait_for(lambda: doomed.proc is not None and doomed.proc.poll() is not None,
             f"the operator SIGKILLed after write {kill_after_writes}", 60)
    assert doomed.proc is not None and doomed.proc.returncode == -9, doomed.text()[-2000:]
    partial = env.children(ns, name)
    written = sum(len(v) for v in partial.values())
    # The Deployment watcher writes status from its own thread once the Deployment exists, so one of
    # the N counted writes may be that status patch (and a status may already be there): the
    # children are the N writes' objects, or one fewer; never more, never a half-written object.
    assert kill_after_writes - 1 <= written <= kill_after_writes, (
        f"{written} children exist after {kill_after_writes} write(s): {partial}")

    survivor = env.operator(ns)
    try:
        wait_for(lambda: survivor.reconciled(name) >= 1, "the restarted operator's reconcile", 90)
        assert_complete_and_single(env, ns, name)
        wait_for(lambda: bool(env.service(ns, name).get("status", {}).get("phase")), "a status phase", 60)
    finally:
        survivor.stop()
    assert "Traceback" not in survivor.text(), survivor.text()[-3000:]


def test_api_server_restart_under_a_running_operator(env: Env) -> None:
    ns, name = env.namespace(), "chat"
    operator = env.operator(ns)
    try:
        env.kubectl.apply(manifest(name, ns))
        wait_for(lambda: operator.reconciled(name) >= 1, "first reconcile", 90)
        assert_complete_and_single(env, ns, name)
        before = operator.reconciled(name)
        down_s = env.cluster.restart_apiserver(down_s=3.0)
        print(f"kube-apiserver unreachable for {down_s:.1f} s")
        assert operator.proc is not None and operator.proc.poll() is None, operator.text()[-3000:]
        # a change made after the restart reaches the children: the operator's watch reconnected
        env.kubectl.apply(manifest(name, ns, strategy={"attention": "gqa", "kvHeadGroups": 2,
                                                       "kvCacheDtype": "bf16", "maxSeqLen": 8192}))

        def regrouped() -> bool:
            deps = env.children(ns, name)["deployments"]
            if len(deps) != 1:
                return False
            args = deps[0].spec.template.spec.containers[0].args
            return args[args.index("--kv-head-groups") + 1] == "2"

        wait_for(regrouped, "the post-restart spec change applied", 120)
        # the log line follows the writes it reports: wait for it rather than race it
        wait_for(lambda: operator.reconciled(name) > before, "the post-restart reconcile's log line", 30)
        kids = env.children(ns, name)
        assert len(kids["deployments"]) == 1 and len(kids["services"]) == 2 and len(kids["configmaps"]) == 1
        assert operator.proc.poll() is None
    finally:
        operator.stop()
    # the shared control plane serves the tests after this one
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(env.cluster.api().node_ready(n) for n in env.cluster.node_names):
        time.sleep(0.5)
    assert all(env.cluster.api().node_ready(n) for n in env.cluster.node_names)
