"""Pure: a pod's containers -> the processes the runner starts for them."""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvpilot.cluster.podrunner.volumes import UnsupportedVolume, mount_table, rewrite


class UnsupportedContainer(ValueError):
    """A container whose command the pod runner cannot run on this machine."""


MAX_PROBE_PERIOD_S = 2.0  # probe at least this often: the local fleet reacts in seconds, not tens


@dataclass(frozen=True)
class Probe:
    """A readiness probe (httpGet on the pod IP) with Kubernetes' thresholds."""

    port: int
    path: str
    period_s: float = MAX_PROBE_PERIOD_S
    timeout_s: float = 1.0
    failure_threshold: int = 3


@dataclass(frozen=True)
class ContainerPlan:
    name: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    probe: Probe | None
    init: bool = False  # an init container: runs to completion, in order, before the containers start


def _port(value: Any, container: Mapping[str, Any]) -> int:
    if isinstance(value, int):
        return value
    for port in container.get("ports") or []:
        if port.get("name") == value:
            return int(port["containerPort"])
    raise UnsupportedContainer(f"container {container.get('name')}: probe port {value!r} is not a declared port")


FIELD_PATHS = {"status.podIP": ("status", "podIP"), "status.hostIP": ("status", "hostIP"),
               "metadata.name": ("metadata", "name"), "metadata.namespace": ("metadata", "namespace"),
               "metadata.uid": ("metadata", "uid"), "spec.nodeName": ("spec", "nodeName")}
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _env(container: Mapping[str, Any], pod: Mapping[str, Any]) -> dict[str, str]:
    """Plain values and the downward API's fieldRefs (the ones the kubelet resolves)."""
    out: dict[str, str] = {}
    for e in container.get("env") or []:
        if "value" in e:
            out[e["name"]] = expand(str(e["value"]), out)
            continue
        field = ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
        if field not in FIELD_PATHS:
            raise UnsupportedContainer(f"container {container.get('name')!r}: env {e.get('name')} uses "
                                       f"{e.get('valueFrom')}; the local pod runner resolves plain values and "
                                       f"fieldRef {sorted(FIELD_PATHS)}")
        section, key = FIELD_PATHS[field]
        out[e["name"]] = str((pod.get(section) or {}).get(key, ""))
    return out


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion in command, args and env values (unknown names stay as they are)."""
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), text).replace("$$(", "$(")


def plan_container(container: Mapping[str, Any], pod: Mapping[str, Any] | None = None,
                   python: str = sys.executable, mounts: Sequence[tuple[str, str]] = ()) -> ContainerPlan:
    """`kvpilot <sub-command> args` runs as `<python> -m kvpilot.cli <sub-command> args`; other
    images' commands cannot run here (KWOK pods have no image). `mounts`: (mountPath, host directory)
    of the container's volumes: paths under them in the arguments and env are mapped (volumes.py)."""
    env = {k: rewrite(v, mounts) for k, v in _env(container, pod or {}).items()}
    command = [rewrite(expand(str(a), env), mounts)
               for a in [*(container.get("command") or []), *(container.get("args") or [])]]
    if not command or command[0] != "kvpilot":
        raise UnsupportedContainer(
            f"container {container.get('name')!r} runs {command[:1] or 'its image entrypoint'}; the local pod "
            "runner starts only `kvpilot ...` commands (set `command: [kvpilot, ...]`)")
    probe = None
    spec = container.get("readinessProbe") or {}
    http = spec.get("httpGet")
    if http:
        probe = Probe(_port(http.get("port"), container), str(http.get("path", "/")),
                      min(float(spec.get("periodSeconds", 10)), MAX_PROBE_PERIOD_S),
                      float(spec.get("timeoutSeconds", 1)), int(spec.get("failureThreshold", 3)))
    return ContainerPlan(str(container["name"]), (python, "-m", "kvpilot.cli", *command[1:]),
                         tuple(env.items()), probe)


def plan_pod(pod: Mapping[str, Any], python: str = sys.executable,
             volume_dirs: Mapping[str, Path] | None = None) -> list[ContainerPlan]:
    """Every init container's plan (init=True, in order), then every container's; `volume_dirs`: the
    pod's volumes as written by volumes.materialize."""
    spec = pod.get("spec", {})
    plans = []
    for init, c in [*((True, c) for c in spec.get("initContainers") or []),
                    *((False, c) for c in spec.get("containers", []))]:
        try:
            mounts = mount_table(c, spec.get("volumes") or [], volume_dirs or {})
        except UnsupportedVolume as exc:
            raise UnsupportedContainer(str(exc)) from None
        plan = plan_container(c, pod, python, mounts)
        plans.append(replace(plan, init=True, probe=None) if init else plan)
    return plans


def scrape_target(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """A Prometheus file_sd entry for a pod annotated `prometheus.io/scrape: "true"`, labelled
    namespace/service/track/pod as the PodMonitor's relabelling does on a real cluster."""
    meta = pod["metadata"]
    notes = meta.get("annotations") or {}
    ip = (pod.get("status") or {}).get("podIP")
    if notes.get("prometheus.io/scrape") != "true" or not ip or "prometheus.io/port" not in notes:
        return None
    labels = meta.get("labels") or {}
    return {"targets": [f"{ip}:{notes['prometheus.io/port']}"],
            "labels": {"namespace": meta["namespace"], "pod": meta["name"],
                       "service": labels.get("kvpilot.io/service", ""), "track": labels.get("kvpilot.io/track", ""),
                       "__metrics_path__": notes.get("prometheus.io/path", "/metrics")}}
