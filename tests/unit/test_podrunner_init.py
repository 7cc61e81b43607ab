"""The local pod runner and the storage initializer: init containers planned first, the volume they fill
mapped for the containers after them (hostPath cache or the pod's own emptyDir), scratch emptyDirs left
alone; and the runner's order (init to completion, then the containers) and the status it reports."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from operator_fakes import SHA, service

from kvpilot.cluster.podrunner.containers import ContainerPlan, plan_pod
from kvpilot.cluster.podrunner.runner import Container, PodRun, PodRunner
from kvpilot.cluster.podrunner.volumes import init_mounted, materialize
from kvpilot.operator.builders import build_deployment
from kvpilot.operator.builders.security import CACHE_DIR
from kvpilot.operator.reconcile.preflight import preflight
from kvpilot.operator.spec import ServiceSpec

pytestmark = pytest.mark.unit


def _pod(tmp_path: Path, **model: object) -> dict:
    body = service()
    body["spec"]["model"] = {**body["spec"]["model"], "uri": "hf://org/tiny", **model}
    spec = ServiceSpec.from_dict(body["spec"])
    template = build_deployment(body, spec, preflight(spec, body["spec"]["model"]["config"]))["spec"]["template"]
    return {"metadata": {"name": "p", "namespace": "ns"}, "status": {"podIP": "10.0.0.9"}, "spec": template["spec"]}


def _plans(pod: dict, root: Path) -> dict[str, ContainerPlan]:
    secrets = {"hf-login": {"data": {"HF_TOKEN": "aGZfeA=="}}}
    dirs = materialize(pod["spec"]["volumes"], root, lambda kind, name: secrets.get(name), init_mounted(pod["spec"]))
    return {p.name: p for p in plan_pod(pod, python="py", volume_dirs=dirs)}


def test_a_hostpath_cache_is_where_the_initializer_writes_and_the_engine_reads(tmp_path: Path) -> None:
    cache = tmp_path / "node-cache"
    pod = _pod(tmp_path, cache={"hostPath": {"path": str(cache)}}, credentialsSecretRef={"name": "hf-login"})
    plans = _plans(pod, tmp_path / "volumes")
    assert [p.init for p in plans.values()] == [True, False, False] and cache.is_dir()
    init, engine = plans["storage-init"], plans["engine"]
    dest = init.argv[init.argv.index("--dest") + 1]
    assert dest == str(cache / f"sha256-{SHA}")
    assert engine.argv[engine.argv.index("--model") + 1] == dest  # the engine's /models is that directory
    creds = Path(init.argv[init.argv.index("--credentials") + 1])
    assert (creds / "HF_TOKEN").read_text() == "hf_x"
    assert dict(init.env)["HOME"].startswith(str(tmp_path / "volumes"))  # its /tmp is the pod's own directory
    assert dict(engine.env)["TRITON_CACHE_DIR"] == f"{CACHE_DIR}/triton"  # scratch emptyDirs: host paths, as before


def test_without_a_cache_the_pod_gets_its_own_model_directory(tmp_path: Path) -> None:
    plans = _plans(_pod(tmp_path), tmp_path / "volumes")
    dest = plans["storage-init"].argv[plans["storage-init"].argv.index("--dest") + 1]
    assert dest == str(tmp_path / "volumes" / "model" / f"sha256-{SHA}")
    engine = plans["engine"]
    assert engine.argv[engine.argv.index("--model") + 1] == dest


class _Api:
    def __init__(self) -> None:
        self.patches: list[dict] = []

    def request(self, method: str, path: str, body: dict | None = None, content_type: str = "") -> dict:
        self.patches.append(body or {})
        return {}


def test_the_runner_starts_the_containers_only_after_the_init_container_succeeds(tmp_path: Path,
                                                                                 monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr("kvpilot.cluster.podrunner.netns.exec_prefix", lambda name: [])
    flag = tmp_path / "second-try"
    script = (f"import pathlib,sys; p=pathlib.Path({str(flag)!r}); ok=p.exists(); p.touch(); "
              "print('kvpilot storage-init: digest mismatch' if not ok else 'fetched', file=sys.stderr); sys.exit(0 if ok else 1)")
    init = ContainerPlan("storage-init", (sys.executable, "-c", script), (), None, init=True)
    main = ContainerPlan("engine", (sys.executable, "-c", "import time; time.sleep(30)"), (), None)
    api = _Api()
    runner = PodRunner(api, tmp_path, "10.0.0.0/24")  # type: ignore[arg-type]
    run = PodRun("u", "ns", "p", "10.0.0.9", "ns0", "veth0", [Container(init), Container(main)])
    import kvpilot.cluster.podrunner.runner as runner_module
    monkeypatch.setattr(runner_module, "RESTART_BACKOFF_S", (0.3,))
    try:
        for _ in range(400):
            runner._tend(run)
            if run.containers[1].proc is not None:
                break
            __import__("time").sleep(0.02)
        assert run.containers[1].proc is not None  # the engine started, after the second, successful run
        assert run.containers[0].done and run.containers[0].restarts == 1
        failed = next(p["status"]["initContainerStatuses"][0] for p in api.patches
                      if "lastState" in p["status"].get("initContainerStatuses", [{}])[0]
                      and "waiting" in p["status"]["initContainerStatuses"][0]["state"])
        assert failed["state"]["waiting"]["reason"] == "CrashLoopBackOff"
        assert failed["lastState"]["terminated"]["exitCode"] == 1
        assert "digest mismatch" in failed["lastState"]["terminated"]["message"]
        before = [p for p in api.patches if p["status"]["conditions"][0].get("reason") == "ContainersNotInitialized"]
        assert before and all(p["status"]["containerStatuses"] == [
            {"name": "engine", "ready": False, "restartCount": 0}] for p in before)
    finally:
        runner._signal(run, 15)
        for c in run.containers:
            if c.proc is not None:
                c.proc.wait(10)
