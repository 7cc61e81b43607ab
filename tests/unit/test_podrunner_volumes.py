"""The local pod runner's volumes: configMap and secret volumes written as the kubelet projects them,
container paths under their mounts mapped to the host copy, emptyDir left as the host path, the rest
refused by name; and the operator's calibrated pod planned with its calibration file resolvable."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest
from operator_fakes import service

from kvpilot.cluster.podrunner.containers import UnsupportedContainer, plan_pod
from kvpilot.cluster.podrunner.volumes import (
    UnsupportedVolume,
    VolumeUnavailable,
    materialize,
    mount_table,
    projected_files,
    rewrite,
)
from kvpilot.operator.builders import build_deployment
from kvpilot.operator.builders.security import CACHE_DIR
from kvpilot.operator.reconcile.preflight import preflight
from kvpilot.operator.spec import ServiceSpec

pytestmark = pytest.mark.unit

CM = {"data": {"a.txt": "alpha", "b.txt": "beta"}, "binaryData": {"c.bin": base64.b64encode(b"\x00\x01").decode()}}


def cm_volume(**spec) -> dict:
    return {"name": "cal", "configMap": {"name": "text", **spec}}


def test_a_configmap_volume_projects_every_key_or_only_its_items() -> None:
    assert projected_files(cm_volume(), CM) == {"a.txt": (b"alpha", 0o644), "b.txt": (b"beta", 0o644),
                                                "c.bin": (b"\x00\x01", 0o644)}  # fmt: skip
    items = cm_volume(items=[{"key": "b.txt", "path": "sub/b"}, {"key": "a.txt", "path": "a", "mode": 0o400}],
                      defaultMode=0o444)  # fmt: skip
    assert projected_files(items, CM) == {"sub/b": (b"beta", 0o444), "a": (b"alpha", 0o400)}


def test_a_secret_volume_is_decoded() -> None:
    volume = {"name": "k", "secret": {"secretName": "key", "items": [{"key": "token", "path": "api-key"}],
                                      "defaultMode": 0o440}}  # fmt: skip
    secret = {"data": {"token": base64.b64encode(b"s3cret").decode()}}
    assert projected_files(volume, secret) == {"api-key": (b"s3cret", 0o440)}


def test_missing_sources_wait_unless_optional_and_paths_stay_inside() -> None:
    with pytest.raises(VolumeUnavailable, match='configmap "text" not found'):
        projected_files(cm_volume(), None)
    with pytest.raises(VolumeUnavailable, match="no key 'zzz'"):
        projected_files(cm_volume(items=[{"key": "zzz", "path": "z"}]), CM)
    assert projected_files(cm_volume(optional=True), None) == {}
    assert projected_files(cm_volume(optional=True, items=[{"key": "zzz", "path": "z"}]), CM) == {}
    for bad in ("../escape", "/etc/passwd"):
        with pytest.raises(UnsupportedVolume, match="relative path inside the volume"):
            projected_files(cm_volume(items=[{"key": "a.txt", "path": bad}]), CM)


def test_materialize_writes_files_with_their_modes(tmp_path: Path) -> None:
    volumes = [cm_volume(items=[{"key": "a.txt", "path": "x/a"}], defaultMode=0o444), {"name": "scratch", "emptyDir": {}},
               {"name": "model", "persistentVolumeClaim": {"claimName": "m"}}]  # fmt: skip
    reads = []
    dirs = materialize(volumes, tmp_path, lambda kind, name: reads.append((kind, name)) or CM)
    assert reads == [("configMap", "text")] and dirs == {"cal": tmp_path / "cal"}
    path = tmp_path / "cal" / "x" / "a"
    assert path.read_text() == "alpha" and stat.S_IMODE(path.stat().st_mode) == 0o444


def test_mounts_map_paths_longest_first_and_refuse_what_cannot_be_provided(tmp_path: Path) -> None:
    volumes = [cm_volume(), {"name": "scratch", "emptyDir": {}}, {"name": "model", "persistentVolumeClaim": {}},
               {"name": "kube-api-access-x", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}]
    dirs = {"cal": tmp_path / "cal"}
    container = {"name": "c", "volumeMounts": [{"name": "cal", "mountPath": "/etc/x"},
                                               {"name": "cal", "mountPath": "/etc/x/deep", "subPath": "sub"},
                                               {"name": "scratch", "mountPath": "/tmp"},
                                               {"name": "kube-api-access-x",
                                                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}  # fmt: skip
    table = mount_table(container, volumes, dirs)
    assert table == [("/etc/x/deep", str(tmp_path / "cal" / "sub")), ("/etc/x", str(tmp_path / "cal"))]
    assert rewrite("/etc/x/deep/f", table) == str(tmp_path / "cal" / "sub" / "f")
    assert rewrite("--calibration=/etc/x/f.txt", table) == f"--calibration={tmp_path / 'cal'}/f.txt"
    assert rewrite("/etc/xy/f", table) == "/etc/xy/f" and rewrite("/tmp/model", table) == "/tmp/model"
    assert rewrite("a=/etc/x/f", table) == "a=/etc/x/f"  # only flags' values, not every `=`
    for name, words in (("model", "is a persistentVolumeClaim volume"), ("nope", "is not a volume of the pod")):
        with pytest.raises(UnsupportedVolume, match=words):
            mount_table({"name": "c", "volumeMounts": [{"name": name, "mountPath": "/m"}]}, volumes, dirs)


def test_the_operators_calibrated_pod_reads_its_calibration_from_the_host_copy(tmp_path: Path) -> None:
    body = service()
    body["spec"]["model"]["uri"] = "file:///models/llama"  # the local fleet serves host paths (a PVC is refused)
    body["spec"]["strategy"] = {**body["spec"]["strategy"], "attention": "gqa", "kvHeadGroups": 4,
                                "calibration": {"configMap": "cal-text", "key": "text.txt"}}  # fmt: skip
    spec = ServiceSpec.from_dict(body["spec"])
    template = build_deployment(body, spec, preflight(spec, body["spec"]["model"]["config"]), "stable")
    pod = {"metadata": {"name": "p"}, "status": {"podIP": "10.0.0.7"}, "spec": template["spec"]["template"]["spec"]}
    source = {"data": {"text.txt": "def f():\n    return 1\n"}, "immutable": True}
    dirs = materialize(pod["spec"]["volumes"], tmp_path, lambda kind, name: source if name == "cal-text" else None)
    engine, sidecar = plan_pod(pod, python="py", volume_dirs=dirs)
    path = Path(engine.argv[engine.argv.index("--conversion-calibration") + 1])
    assert path.is_relative_to(tmp_path) and path.read_text() == source["data"]["text.txt"]
    assert dict(engine.env)["TRITON_CACHE_DIR"] == f"{CACHE_DIR}/triton"  # emptyDir: the host path, as before
    assert "10.0.0.7" in sidecar.argv
    with pytest.raises(UnsupportedContainer, match="mounts 'calibration'"):
        plan_pod(pod, python="py")  # the volume was not written: refused by name, never run without it
