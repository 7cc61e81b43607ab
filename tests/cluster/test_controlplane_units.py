"""Unit tests of the control plane's pure pieces: go.mod generation, version lookup, node builder,
build command, free ports and PID-safe termination."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from kvpilot.cluster import build, nodes, processes

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]

KUBERNETES_GOMOD = """module k8s.io/kubernetes

go 1.26.0

require (
\tk8s.io/api v0.0.0
\tk8s.io/client-go v0.0.0
\tk8s.io/utils v0.0.0-20260626114624-be93311217bd
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
\tk8s.io/sample-controller => ./staging/src/k8s.io/sample-controller
)
"""


def _gen_gomod():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gen_gomod", REPO / "tools" / "k8s" / "gen_gomod.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_generated_gomod_replaces_each_required_staging_module_with_its_v0_release() -> None:
    text = _gen_gomod().render("v1.37.2", KUBERNETES_GOMOD)
    assert "\tk8s.io/api => k8s.io/api v0.37.2" in text
    assert "\tk8s.io/client-go => k8s.io/client-go v0.37.2" in text
    assert "k8s.io/sample-controller =>" not in text  # replaced upstream but never required
    assert "k8s.io/utils =>" not in text
    assert "require k8s.io/kubernetes v1.37.2" in text
    assert "\tk8s.io/kubernetes/cmd/kube-apiserver" in text


def test_generator_rejects_a_non_release_version() -> None:
    with pytest.raises(SystemExit, match=r"v1\.37\.2"):
        _gen_gomod().render("master", KUBERNETES_GOMOD)


def test_committed_k8s_gomod_covers_every_staging_module_kubernetes_requires() -> None:
    gomod = (REPO / "tools" / "k8s" / "go.mod").read_text()
    kube = build.module_version(gomod, "k8s.io/kubernetes")
    staging = "v0." + kube.split(".", 1)[1]
    for module in ("k8s.io/api", "k8s.io/apimachinery", "k8s.io/apiserver", "k8s.io/client-go",
                   "k8s.io/component-base", "k8s.io/kube-scheduler", "k8s.io/controller-manager"):
        assert f"\t{module} => {module} {staging}\n" in gomod


def test_module_version_reads_require_lines_and_blocks() -> None:
    assert build.module_version("require k8s.io/kubernetes v1.37.2\n", "k8s.io/kubernetes") == "v1.37.2"
    block = "require (\n\tgo.etcd.io/etcd/server/v3 v3.6.16 // indirect\n)\n"
    assert build.module_version(block, "go.etcd.io/etcd/server/v3") == "v3.6.16"
    with pytest.raises(ValueError, match="does not require"):
        build.module_version(block, "sigs.k8s.io/kwok")


def test_every_component_version_comes_from_its_committed_gomod() -> None:
    versions = {c.name: c.version() for c in build.COMPONENTS}
    assert versions["etcd"].startswith("v3.6.")
    assert versions["kubernetes"].startswith("v1.37.")
    assert set(versions) == {"etcd", "kubernetes", "kwok", "helm", "crane", "versitygw"}


def test_binaries_live_in_a_version_keyed_cache(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("KVPILOT_CACHE_DIR", str(tmp_path))
    kube = next(c for c in build.COMPONENTS if c.name == "kubernetes")
    assert build.binary_path("kube-scheduler") == tmp_path / "bin" / f"kubernetes-{kube.version()}" / "kube-scheduler"
    with pytest.raises(KeyError, match="known:"):
        build.binary_path("kubelet")


def test_kubernetes_builds_all_three_commands_in_one_go_build_with_version_ldflags(tmp_path) -> None:
    kube = next(c for c in build.COMPONENTS if c.name == "kubernetes")
    cmd = build.build_command(kube, tmp_path)
    assert cmd.count("build") == 1 and cmd[-3:] == list(kube.binaries.values())
    ldflags = cmd[cmd.index("-ldflags") + 1]
    assert f"k8s.io/component-base/version.gitVersion={kube.version()}" in ldflags
    assert "-s -w" in ldflags and "-trimpath" in cmd


def test_gpu_node_offers_gpus_and_is_managed_by_kwok() -> None:
    node = nodes.gpu_node("n0", nodes.GpuNodeSpec(gpus=4, gpu_product="NVIDIA-A100", gpu_memory_mib=81920))
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    assert node["status"]["capacity"] == node["status"]["allocatable"]
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A100"
    assert node["metadata"]["labels"]["nvidia.com/gpu.memory"] == "81920"


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = processes.free_ports(6)
    assert len(set(ports)) == 6 and all(1024 < p < 65536 for p in ports)


def test_terminate_stops_a_process_and_leaves_a_reused_pid_alone(tmp_path) -> None:  # type: ignore[no-untyped-def]
    proc = processes.spawn([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "log")
    processes.terminate(proc.pid, binary="/not/this/binary")  # cmdline differs: must not kill it
    assert processes.is_alive(proc.pid)
    processes.terminate(proc.pid, binary=sys.executable)
    assert not processes.is_alive(proc.pid)


def test_terminate_escalates_to_sigkill_when_sigterm_is_ignored(tmp_path) -> None:  # type: ignore[no-untyped-def]
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    proc = processes.spawn([sys.executable, "-c", code], tmp_path / "log")
    processes.wait_until(lambda: "up" in (tmp_path / "log").read_text(), "child", 10)
    processes.terminate(proc.pid, grace_s=0.5)
    assert not processes.is_alive(proc.pid)


def test_cli_down_without_a_cluster_is_a_no_op(tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = subprocess.run([sys.executable, "-m", "kvpilot.cli", "cluster", "down", "--state-dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "no cluster state" in result.stderr


def test_die_with_parent_children_stop_when_their_parent_is_killed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    parent_code = (
        "import sys, time; from pathlib import Path; from kvpilot.cluster import processes\n"
        f"p = processes.spawn([sys.executable, '-c', 'import time; time.sleep(60)'], Path({str(tmp_path)!r}) / 'c.log', True)\n"
        "print(p.pid, flush=True); time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())  # type: ignore[union-attr]
    assert processes.is_alive(child)
    parent.kill()
    parent.wait(timeout=10)
    processes.wait_until(lambda: not processes.is_alive(child), "child to follow its parent", 10)


def test_stop_deletes_only_the_files_a_cluster_writes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from kvpilot.cluster.local import LocalCluster

    (tmp_path / "pki").mkdir()
    (tmp_path / "kubeconfig").write_text("x")
    (tmp_path / "state.json").write_text("{}")
    (tmp_path / "unrelated.txt").write_text("keep me")
    LocalCluster(tmp_path).stop()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["unrelated.txt"]
    (tmp_path / "unrelated.txt").unlink()
    LocalCluster(tmp_path).stop()
    assert not tmp_path.exists()
