"""The Helm chart on a real control plane: lint and render across value combinations, server-side
dry-run, one install shared by the module, the operator run out of cluster with the chart's
ServiceAccount token, verbs the chart does not grant refused, every example applied and planned."""

from __future__ import annotations

import json
import re
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.chart import CHART, REPO, documents, find, helm, helm_binary, token_kubeconfig
from tests.harness.cluster import wait_for
from tests.harness.operator import Kubectl, OperatorProcess

pytestmark = pytest.mark.cluster

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
# Kinds whose CRDs (the Prometheus Operator's) the local cluster does not have: checked by shape.
NOT_SERVED = {"monitoring.coreos.com/v1"}


@pytest.fixture(scope="module")
def helm_home(tmp_path_factory):  # type: ignore[no-untyped-def]
    if not helm_binary().exists():
        pytest.skip("helm is not built: run `kvpilot cluster build`")
    return tmp_path_factory.mktemp("helm")


@pytest.fixture(scope="module")
def kubectl(k8s_cluster) -> Kubectl:  # type: ignore[no-untyped-def]
    kube = Kubectl(k8s_cluster.kubeconfig)
    kube("apply", "-f", str(CHART / "crds"))
    kube("wait", "--for=condition=Established", "--timeout=60s", "crd/inferenceservices.kvpilot.io",
         "crd/kopfpeerings.kopf.dev", "crd/clusterkopfpeerings.kopf.dev")
    return kube


@pytest.fixture
def release_ns(kubectl):  # type: ignore[no-untyped-def]
    """A fresh namespace to render the release into (server-side dry-run needs it to exist)."""
    name = f"kvp-rel-{_suffix()}"
    kubectl("create", "namespace", name)
    yield name
    kubectl("delete", "namespace", name, "--wait=false", check=False)


def _suffix() -> str:
    return uuid.uuid4().hex[:6]


def render(helm_home: Path, values: dict[str, Any], namespace: str, release: str = "kvp") -> list[dict[str, Any]]:
    values_file = helm_home / f"values-{_suffix()}.yaml"
    values_file.write_text(yaml.safe_dump(values))
    lint = helm("lint", str(CHART), "--strict", "-f", str(values_file), home=helm_home).stdout
    assert "0 chart(s) failed" in lint, lint
    out = helm("template", release, str(CHART), "-n", namespace, "-f", str(values_file), home=helm_home).stdout
    return documents(out)


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = find(docs, "Deployment")
    return deployment["spec"]["template"]["spec"]["containers"][0]


def rules_of(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    return {(group, res): set(r["verbs"]) for r in role["rules"] for group in r["apiGroups"] for res in r["resources"]}


def dry_run(kubectl: Kubectl, docs: list[dict[str, Any]]) -> None:
    served = [d for d in docs if d["apiVersion"] not in NOT_SERVED]
    result = kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump_all(served), check=False)
    assert result.returncode == 0, result.stderr


def test_default_values_run_the_operator_cluster_wide_locked_down(helm_home, kubectl, release_ns) -> None:  # type: ignore[no-untyped-def]
    docs = render(helm_home, {}, release_ns)
    container = operator_container(docs)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert container["image"] == f"ghcr.io/kvpilot/kvpilot-operator:{chart['appVersion']}"
    assert container["args"][:2] == ["operator", "--all-namespaces"]
    assert "--peering=kvpilot" in container["args"] and "--priority=100" in container["args"]
    liveness = next(a for a in container["args"] if a.startswith("--liveness="))
    port = container["livenessProbe"]["httpGet"]["port"]
    assert liveness == f"--liveness=http://0.0.0.0:{_port(container, port)}{container['livenessProbe']['httpGet']['path']}"
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
    assert security["capabilities"]["drop"] == ["ALL"]
    pod = find(docs, "Deployment")[0]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    (cluster_role,) = find(docs, "ClusterRole")
    rules = rules_of(cluster_role)
    assert rules[("kvpilot.io", "inferenceservices")] == {"get", "list", "watch", "patch"}
    assert rules[("kopf.dev", "clusterkopfpeerings")] == {"get", "list", "watch", "patch"}
    assert ("", "secrets") not in rules and ("", "namespaces") not in rules
    assert rules[("", "nodes")] == {"list"}  # the canary's GPU preflight (canaryGpuCheck), nothing else on nodes
    assert rules[("policy", "poddisruptionbudgets")] == {"get", "create", "patch", "delete"}
    assert "--canary-gpu-check=require" in container["args"]
    assert not find(docs, "Role") and find(docs, "ClusterKopfPeering")
    # The arguments are ones `kvpilot operator` accepts.
    _parse_operator_args(container["args"])
    dry_run(kubectl, docs)


def _port(container: dict[str, Any], name_or_number: Any) -> int:
    if isinstance(name_or_number, int):
        return name_or_number
    return next(p["containerPort"] for p in container["ports"] if p["name"] == name_or_number)


def _parse_operator_args(args: list[str]) -> None:
    import argparse

    from kvpilot.operator import cli

    assert args[0] == "operator"
    parser = argparse.ArgumentParser(prog="kvpilot operator", exit_on_error=False)
    cli.add_arguments(parser)
    parser.parse_args(args[1:])


def test_namespaced_mode_grants_roles_only_where_it_watches(helm_home, kubectl, release_ns) -> None:  # type: ignore[no-untyped-def]
    sfx = _suffix()
    watched, gateway_ns = [f"llm-a-{sfx}", f"llm-b-{sfx}"], f"gw-{sfx}"
    for ns in (*watched, gateway_ns):
        kubectl("create", "namespace", ns)
    try:
        docs = render(helm_home, {
            "watchNamespaces": watched, "gateway": {"name": "inference-gateway", "namespace": gateway_ns},
            "metrics": {"enabled": True, "podMonitor": {"enabled": True, "labels": {"release": "prom"}}},
        }, release_ns)
        args = operator_container(docs)["args"]
        assert [a for a in args if a.startswith("--namespace")] == [f"--namespace={ns}" for ns in watched]
        assert "--metrics-port=9402" in args
        roles = {r["metadata"]["namespace"]: rules_of(r) for r in find(docs, "Role")}
        assert set(roles) == {*watched, gateway_ns}
        for ns in watched:
            assert roles[ns][("apps", "deployments")] == {"get", "list", "watch", "create", "patch", "delete"}
            assert roles[ns][("", "configmaps")] == {"get", "create", "patch"}
            assert roles[ns][("gateway.networking.k8s.io", "httproutes")] == {
                "get", "list", "watch", "create", "patch", "delete"}
            assert roles[ns][("kopf.dev", "kopfpeerings")] == {"get", "list", "watch", "patch"}
        assert roles[gateway_ns] == {("gateway.networking.k8s.io", "gateways"): {"get", "list", "watch"}}
        bindings = {b["metadata"]["namespace"] for b in find(docs, "RoleBinding")}
        assert bindings == set(roles)
        (cluster_role,) = find(docs, "ClusterRole")
        assert rules_of(cluster_role) == {("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"},
                                          ("", "namespaces"): {"list", "watch"},
                                          # the canary's GPU preflight counts every namespace's pods on GPU nodes
                                          ("", "nodes"): {"list"}, ("", "pods"): {"list"}}
        off = render(helm_home, {"watchNamespaces": watched, "canaryGpuCheck": "off",
                                 "gpuProductLabel": "cloud.google.com/gke-accelerator"}, release_ns)
        (off_role,) = find(off, "ClusterRole")
        assert ("", "nodes") not in rules_of(off_role) and ("", "pods") not in rules_of(off_role)
        assert {"--canary-gpu-check=off", "--gpu-product-label=cloud.google.com/gke-accelerator"} <= set(
            operator_container(off)["args"])
        assert {p["metadata"]["namespace"] for p in find(docs, "KopfPeering")} == set(watched)
        (monitor,) = find(docs, "PodMonitor")
        pod = find(docs, "Deployment")[0]["spec"]["template"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        assert monitor["metadata"]["labels"]["release"] == "prom"
        assert {"name": "metrics", "containerPort": 9402} in pod["spec"]["containers"][0]["ports"]
        dry_run(kubectl, docs)
    finally:
        for ns in (*watched, gateway_ns):
            kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_glob_patterns_get_cluster_rbac_and_namespace_watch(helm_home, kubectl, release_ns) -> None:  # type: ignore[no-untyped-def]
    docs = render(helm_home, {
        "watchNamespaces": ["llm-*"], "peering": {"create": False},
        "metrics": {"enabled": True, "serviceMonitor": {"enabled": True}},
    }, release_ns)
    (cluster_role,) = find(docs, "ClusterRole")
    rules = rules_of(cluster_role)
    assert rules[("", "namespaces")] == {"list", "watch"} and ("kvpilot.io", "inferenceservices") in rules
    assert not find(docs, "Role") and not find(docs, "KopfPeering")
    (service,) = find(docs, "Service")
    (monitor,) = find(docs, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"] == "metrics"
    dry_run(kubectl, docs)


def test_minimal_values_render_only_the_deployment(helm_home, kubectl, release_ns) -> None:  # type: ignore[no-untyped-def]
    docs = render(helm_home, {
        "peering": {"enabled": False}, "metrics": {"enabled": False}, "dashboards": {"enabled": False},
        "serviceAccount": {"create": False, "name": "existing"}, "rbac": {"create": False},
        "image": {"repository": "registry.example/kvpilot-operator", "tag": "dev"},
    }, release_ns)
    assert [d["kind"] for d in docs] == ["Deployment"]
    container = operator_container(docs)
    assert container["image"] == "registry.example/kvpilot-operator:dev"
    assert "--standalone" in container["args"] and not any(a.startswith("--metrics") for a in container["args"])
    assert find(docs, "Deployment")[0]["spec"]["template"]["spec"]["serviceAccountName"] == "existing"
    _parse_operator_args(container["args"])
    dry_run(kubectl, docs)


@pytest.mark.parametrize(("values", "message"), [
    ({"rbac": {"scope": "everywhere"}}, "at '/rbac/scope': value must be one of 'auto', 'cluster', 'namespace'"),
    ({"priority": "high"}, "at '/priority': got string, want integer"),
    ({"replicas": 3}, "additional properties 'replicas' not allowed"),
    ({"prometheus": {"url": "prometheus:9090"}}, "at '/prometheus/url'"),
    ({"watchNamespaces": ["Bad_Name"]}, "at '/watchNamespaces/0'"),
    ({"rbac": {"scope": "namespace"}, "watchNamespaces": ["llm-*"]}, "cannot grant a glob"),
    ({"rbac": {"scope": "namespace"}}, "needs watchNamespaces"),
])
def test_wrong_values_fail_naming_the_key(helm_home, values, message) -> None:  # type: ignore[no-untyped-def]
    values_file = helm_home / f"bad-{_suffix()}.yaml"
    values_file.write_text(yaml.safe_dump(values))
    result = helm("template", "kvp", str(CHART), "-f", str(values_file), home=helm_home, check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr


# ---- one install, the operator with the chart's token ----------------------------------------

@pytest.fixture(scope="module")
def installed(helm_home, kubectl, k8s_cluster, tmp_path_factory):  # type: ignore[no-untyped-def]
    sfx = _suffix()
    system, watched, other = f"kvp-sys-{sfx}", f"kvp-llm-{sfx}", f"kvp-other-{sfx}"
    for ns in (system, watched, other):
        kubectl("create", "namespace", ns)
    release = f"kvp-{sfx}"
    tmp = tmp_path_factory.mktemp("install")
    operator = None
    try:
        helm("install", release, str(CHART), "-n", system, f"--kubeconfig={k8s_cluster.kubeconfig}",
             "--set-json", f'watchNamespaces=["{watched}"]', home=helm_home)
        manifest = documents(helm("get", "manifest", release, "-n", system,
                                  f"--kubeconfig={k8s_cluster.kubeconfig}", home=helm_home).stdout)
        container = operator_container(manifest)
        sa = find(manifest, "Deployment")[0]["spec"]["template"]["spec"]["serviceAccountName"]
        kubeconfig = token_kubeconfig(k8s_cluster.kubeconfig, k8s_cluster.server, system, sa, tmp / "sa.kubeconfig")
        operator = ChartOperator(kubeconfig, watched, tmp / "operator.log", container["args"])
        operator.start()
        yield {"system": system, "watched": watched, "other": other, "operator": operator,
               "sa": Kubectl(kubeconfig), "release": release}
    finally:
        if operator is not None:
            operator.stop()
        helm("uninstall", release, "-n", system, f"--kubeconfig={k8s_cluster.kubeconfig}", home=helm_home,
             check=False)
        for ns in (system, watched, other):
            kubectl("delete", "namespace", ns, "--wait=false", check=False)


class ChartOperator(OperatorProcess):
    """`kvpilot <the rendered Deployment's args>`, liveness moved to a free loopback port."""

    def __init__(self, kubeconfig: Path, namespace: str, log: Path, args: list[str]) -> None:
        super().__init__(kubeconfig, namespace, log)
        self.args = args

    def command(self, liveness: str) -> list[str]:
        args = [f"--liveness={liveness}" if a.startswith("--liveness=") else a for a in self.args]
        return [sys.executable, "-m", "kvpilot.cli", *args]


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == type_), {})


def test_operator_with_the_chart_token_reconciles_an_example(installed, kubectl) -> None:  # type: ignore[no-untyped-def]
    ns = installed["watched"]
    kubectl("apply", "-n", ns, "-f", str(REPO / "examples" / "llama-3-8b-int8-kv.yaml"))
    name = "llama-3-8b-int8-kv"
    try:
        wait_for(lambda: _condition(kubectl.get("kvis", name, "-n", ns), "CapacityPlanned").get("status") == "True",
                 "CapacityPlanned=True", 60)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; operator log:\n{installed['operator'].text()[-4000:]}") from None
    deployment = kubectl.get("deployment", f"{name}-stable", "-n", ns)
    engine = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--kv-cache-dtype" in engine["args"] and "int8" in engine["args"]
    kubectl.get("configmap", f"{name}-lineage", "-n", ns)
    kubectl.get("service", name, "-n", ns)
    log = installed["operator"].text()
    assert not re.search(r"forbidden|\b403\b", log, re.IGNORECASE), log[-3000:]
    # The operator took part in the chart's peering object.
    peering = kubectl.get("kopfpeering", "kvpilot", "-n", ns)
    assert [p["priority"] for p in (peering.get("status") or {}).values()] == [100]


@pytest.mark.parametrize("argv", [
    ["delete", "node", "{node}", "--dry-run=server"],
    ["get", "secrets", "-n", "{watched}"],
    ["get", "secrets", "-n", "{system}"],
    ["create", "configmap", "x", "-n", "{other}", "--dry-run=server"],
    ["create", "deployment", "x", "--image=x", "-n", "{other}", "--dry-run=server"],
    ["get", "inferenceservices", "-n", "{other}"],
    ["create", "clusterrolebinding", "x", "--clusterrole=cluster-admin", "--user=x", "--dry-run=server"],
    ["delete", "namespace", "{watched}", "--dry-run=server"],
])
def test_the_token_is_refused_what_the_chart_does_not_grant(installed, k8s_cluster, argv) -> None:  # type: ignore[no-untyped-def]
    fill = {**installed, "node": k8s_cluster.node_names[0]}
    result = installed["sa"](*[a.format(**fill) for a in argv], check=False)
    assert result.returncode != 0 and "forbidden" in result.stderr.lower(), result.stderr


def _allowed(kubectl: Kubectl, verb: str, group: str, resource: str, namespace: str | None) -> bool:
    """A SelfSubjectAccessReview (works for API groups the server does not serve yet)."""
    resource, _, subresource = resource.partition("/")
    attrs = {"verb": verb, "group": group, "resource": resource, "subresource": subresource}
    if namespace:
        attrs["namespace"] = namespace
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
              "spec": {"resourceAttributes": attrs}}
    out = kubectl("create", "-f", "-", "-o", "json", stdin=json.dumps(review)).stdout
    return bool(json.loads(out)["status"].get("allowed"))


@pytest.mark.parametrize(("verb", "group", "resource"), [
    ("create", "apps", "deployments"), ("patch", "apps", "deployments"), ("delete", "apps", "deployments"),
    ("watch", "apps", "deployments"), ("create", "", "configmaps"), ("patch", "", "services"),
    ("patch", "kvpilot.io", "inferenceservices/status"), ("watch", "kvpilot.io", "inferenceservices"),
    ("create", "", "events"), ("create", "gateway.networking.k8s.io", "httproutes"),
    ("delete", "gateway.networking.k8s.io", "httproutes"), ("get", "gateway.networking.k8s.io", "gateways"),
    ("patch", "monitoring.coreos.com", "podmonitors"), ("patch", "kopf.dev", "kopfpeerings"),
    ("watch", "", "pods"), ("list", "", "events"), ("patch", "policy", "poddisruptionbudgets"),
    ("delete", "policy", "poddisruptionbudgets"), ("patch", "autoscaling", "horizontalpodautoscalers"),
    ("delete", "autoscaling", "horizontalpodautoscalers"), ("patch", "inference.networking.k8s.io", "inferencepools"),
])
def test_the_token_may_do_what_the_operator_does(installed, verb, group, resource) -> None:  # type: ignore[no-untyped-def]
    assert _allowed(installed["sa"], verb, group, resource, installed["watched"])
    assert not _allowed(installed["sa"], verb, group, resource, installed["other"])


def test_the_token_reads_crds_cluster_wide_and_nothing_else(installed) -> None:  # type: ignore[no-untyped-def]
    sa = installed["sa"]
    assert _allowed(sa, "watch", "apiextensions.k8s.io", "customresourcedefinitions", None)
    assert not _allowed(sa, "create", "apiextensions.k8s.io", "customresourcedefinitions", None)
    assert not _allowed(sa, "get", "", "secrets", installed["watched"])
    # the canary's GPU preflight (chart value canaryGpuCheck, not off): list nodes and pods, nothing more
    assert _allowed(sa, "list", "", "nodes", None) and _allowed(sa, "list", "", "pods", None)
    assert not _allowed(sa, "watch", "", "pods", None) and not _allowed(sa, "get", "", "nodes", None)
    assert not _allowed(sa, "delete", "", "pods", None) and not _allowed(sa, "patch", "", "nodes", None)


def _canary_fields_served() -> bool:
    crd = yaml.safe_load((REPO / "crds" / "inferenceservices.kvpilot.io.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    return "gateway" in spec["canary"].get("properties", {})


# examples that name another example's object (the calibration ConfigMap), by file stem
EXAMPLE_NEEDS = {"llama-3-8b-gqa-calibrated": ("calibration-text",)}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_applies_and_is_planned(installed, kubectl, path) -> None:  # type: ignore[no-untyped-def]
    if "canary" in path.stem and not _canary_fields_served():
        pytest.skip("crds/ has no spec.canary.gateway yet (the rollout's CRD change is not merged)")
    ns = installed["watched"]
    dry = kubectl("apply", "--dry-run=server", "-n", ns, "-f", str(path), check=False)
    assert dry.returncode == 0, dry.stderr
    doc = yaml.safe_load(path.read_text())
    kind, name = doc["kind"], doc["metadata"]["name"]
    needs = [REPO / "examples" / f"{stem}.yaml" for stem in EXAMPLE_NEEDS.get(path.stem, ())]
    for needed in needs:  # what the example names (a ConfigMap), applied first as a user would
        kubectl("apply", "-n", ns, "-f", str(needed))
    kubectl("apply", "-n", ns, "-f", str(path))
    try:
        if kind != "InferenceService":
            assert kubectl.get(kind.lower(), name, "-n", ns)["metadata"]["name"] == name
            return
        wait_for(lambda: _condition(kubectl.get("kvis", name, "-n", ns), "CapacityPlanned").get("status")
                 in ("True", "False"), f"{name}: CapacityPlanned", 60)
        planned = _condition(kubectl.get("kvis", name, "-n", ns), "CapacityPlanned")
        if path.stem.startswith("oversized"):
            assert (planned["status"], planned["reason"]) == ("False", "Infeasible"), planned
            assert re.search(r"weights [\d.]+ GiB .* exceed 1 x NVIDIA-L40S", planned["message"]), planned
            assert kubectl("get", "deployment", f"{name}-stable", "-n", ns, check=False).returncode != 0
        else:
            assert planned["status"] == "True", planned
            capacity = kubectl.get("kvis", name, "-n", ns)["status"]["capacity"]
            assert capacity["feasible"] and capacity["maxConcurrency"] >= 1, capacity
    finally:
        for applied in (path, *needs):
            kubectl("delete", "-n", ns, "-f", str(applied), "--wait=false", check=False)


def test_nothing_the_operator_did_for_the_examples_was_forbidden(installed) -> None:  # type: ignore[no-untyped-def]
    """After every example (canary included) went through the operator running on the chart's token."""
    log = installed["operator"].text()
    assert log and not re.search(r"forbidden|\b403\b", log, re.IGNORECASE), log[-4000:]


def test_dashboards_in_the_chart_render_as_labelled_configmaps(helm_home) -> None:  # type: ignore[no-untyped-def]
    files = sorted((CHART / "dashboards").glob("*.json")) if (CHART / "dashboards").is_dir() else []
    if not files:
        pytest.skip("the chart has no dashboards yet (dashboards/ is not in the repository)")
    docs = render(helm_home, {"dashboards": {"namespace": "monitoring"}}, "kvpilot-system")
    maps = [d for d in find(docs, "ConfigMap") if d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert sorted(k for m in maps for k in m["data"]) == [f.name for f in files]
    for m in maps:
        assert m["metadata"]["namespace"] == "monitoring"
        for key, text in m["data"].items():
            assert json.loads(text) == json.loads((CHART / "dashboards" / key).read_text())



def test_cluster_wide_install_grants_every_namespace_but_no_secrets(helm_home, kubectl, k8s_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The default (all namespaces) release installed; its token checked by access reviews (its operator
    is not run: it would reconcile the other tests' namespaces)."""
    sfx = _suffix()
    system, release = f"kvp-cw-{sfx}", f"kvp-cw-{sfx}"
    kubectl("create", "namespace", system)
    admin = f"--kubeconfig={k8s_cluster.kubeconfig}"
    try:
        helm("install", release, str(CHART), "-n", system, admin, "--set", f"peering.name=kvpilot-{sfx}",
             home=helm_home)
        peering = kubectl.get("clusterkopfpeering", f"kvpilot-{sfx}")
        assert peering["metadata"]["labels"]["app.kubernetes.io/instance"] == release
        sa = Kubectl(token_kubeconfig(k8s_cluster.kubeconfig, k8s_cluster.server, system, f"{release}-kvpilot",
                                      tmp_path / "cw.kubeconfig"))
        anywhere = f"anywhere-{sfx}"  # need not exist: RBAC is checked before the namespace
        for verb, group, resource in [("create", "apps", "deployments"), ("watch", "kvpilot.io", "inferenceservices"),
                                      ("create", "gateway.networking.k8s.io", "httproutes")]:
            assert _allowed(sa, verb, group, resource, anywhere), (verb, resource)
        assert _allowed(sa, "patch", "kopf.dev", "clusterkopfpeerings", None)
        assert not _allowed(sa, "get", "", "secrets", anywhere)
        assert not _allowed(sa, "delete", "", "nodes", None)
        assert not _allowed(sa, "list", "", "namespaces", None)  # granted only with watchNamespaces
    finally:
        helm("uninstall", release, "-n", system, admin, home=helm_home, check=False)
        kubectl("delete", "namespace", system, "--wait=false", check=False)


def test_a_canary_gets_its_httproute_with_the_chart_token(installed, kubectl, k8s_cluster) -> None:  # type: ignore[no-untyped-def]
    """The canary example through the operator on the chart's token, up to its HTTPRoute on a Gateway."""
    if not _canary_fields_served():
        pytest.skip("crds/ has no spec.canary.gateway yet (the rollout's CRD change is not merged)")
    harness = pytest.importorskip("tests.harness.gateway", reason="the Gateway API harness comes with the rollout")
    from kvpilot.operator.routing.httproute import route_name

    harness.gw.install(k8s_cluster.api())
    ns = installed["watched"]
    harness.apply_gateway(harness.kube_client(k8s_cluster), ns, "inference-gateway")
    body = yaml.safe_load((REPO / "examples" / "llama-3-8b-canary-int8.yaml").read_text())
    # Pods that KWOK can run: a product its nodes carry, and a hostPath model instead of a claim.
    body["spec"]["route"]["gateway"] = {"name": "inference-gateway", "namespace": ns}
    body["spec"]["resources"]["gpuProduct"] = kubectl.get("nodes")["items"][0]["metadata"]["labels"][
        "nvidia.com/gpu.product"]
    body["spec"]["model"]["uri"] = "file:///models/llama-3-8b-instruct"
    name = body["metadata"]["name"]
    # test_every_example_applies_and_is_planned deleted this example without waiting: an apply while its
    # finalizer still runs would patch the terminating object, which then disappears.
    wait_for(lambda: kubectl("get", "kvis", name, "-n", ns, check=False).returncode != 0,
             f"the earlier {name} to be deleted", 120)
    kubectl("apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump(body))
    try:
        try:
            wait_for(lambda: kubectl("get", "httproute", route_name(name), "-n", ns, check=False).returncode == 0,
                     "the canary's HTTPRoute", 120)
        except AssertionError as exc:
            got = kubectl("get", "kvis", name, "-n", ns, "-o", "json", check=False)
            status = json.loads(got.stdout).get("status") if got.returncode == 0 else got.stderr
            raise AssertionError(f"{exc}; status {status}; log:\n{installed['operator'].text()[-2000:]}") from None
        route = kubectl.get("httproute", route_name(name), "-n", ns)
        assert route["spec"]["parentRefs"][0]["name"] == "inference-gateway"
        log = installed["operator"].text()
        assert not re.search(r"forbidden|\b403\b", log, re.IGNORECASE), log[-4000:]
    finally:
        kubectl("delete", "kvis", name, "-n", ns, "--wait=false", check=False)
