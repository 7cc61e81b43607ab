"""The pod runner's loop: pods of opted-in namespaces -> processes in network namespaces."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kvpilot.cluster import processes
from kvpilot.cluster.api import ApiClient, ApiError
from kvpilot.cluster.podrunner import RUN_PODS_PREFIX, netns
from kvpilot.cluster.podrunner.containers import ContainerPlan, UnsupportedContainer, plan_pod, scrape_target
from kvpilot.cluster.podrunner.volumes import UnsupportedVolume, VolumeUnavailable, init_mounted, materialize

log = logging.getLogger("kvpilot.podrunner")
STOP_GRACE_S = 10.0
# A deleted pod's processes keep serving this long before SIGTERM, like a preStop sleep: the
# gateway drops the pod from its upstreams first, so no new request races the engine's shutdown.
DRAIN_DELAY_S = 2.0
RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0)
TERMINATION_MESSAGE_BYTES = 2048  # what the kubelet keeps of a log under FallbackToLogsOnError


@dataclass
class Container:
    plan: ContainerPlan
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    start_after: float = 0.0
    ready: bool = False
    failures: int = 0  # consecutive failed readiness probes
    next_probe: float = 0.0
    probing: Future[bool] | None = None
    done: bool = False  # an init container that exited 0
    last_exit: tuple[int, str] | None = None  # (exit code, log tail) of a failed run: the kubelet's lastState


@dataclass
class PodRun:
    uid: str
    namespace: str
    name: str
    ip: str
    netns: str
    veth: str
    containers: list[Container] = field(default_factory=list)
    reported: tuple | None = None  # the readiness last written to the pod's status
    sigterm_at: float | None = None  # set once the pod is gone: when its processes get SIGTERM
    kill_at: float | None = None


def _init_status(c: Container) -> dict[str, Any]:
    """An init container's status as the kubelet writes it: terminated/Completed, waiting in a crash loop
    after a failed run (its exit and message in lastState), or running."""
    out: dict[str, Any] = {"name": c.plan.name, "ready": c.done, "restartCount": c.restarts}
    if c.done:
        out["state"] = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    elif c.last_exit is not None and c.proc is None:
        out["state"] = {"waiting": {"reason": "CrashLoopBackOff",
                                    "message": f"back-off restarting failed container {c.plan.name}"}}
    else:
        out["state"] = {"running": {}}
    if c.last_exit is not None:
        out["lastState"] = {"terminated": {"exitCode": c.last_exit[0], "reason": "Error", "message": c.last_exit[1]}}
    return out


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _probe(url: str, timeout_s: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return 200 <= response.status < 400
    except (urllib.error.URLError, OSError):
        return False


class PodRunner:
    """Starts, probes, restarts and stops the processes of pods in opted-in namespaces."""

    def __init__(self, api: ApiClient, state_dir: Path, pod_cidr: str, interval_s: float = 0.5) -> None:
        self.api, self.state_dir, self.pod_cidr, self.interval_s = api, state_dir, pod_cidr, interval_s
        self.pods: dict[str, PodRun] = {}
        self.leaving: dict[str, PodRun] = {}  # pods gone from the API whose processes still drain
        self.probes = ThreadPoolExecutor(max_workers=8, thread_name_prefix="probe")
        self.targets_file = state_dir / "prometheus" / "pods.json"
        self._targets: str | None = None
        self._made_bridge = False
        self._waiting: dict[str, str] = {}  # pod uid -> why it is not started yet (a missing ConfigMap)

    # ---- the loop --------------------------------------------------------------------------
    def sync_once(self) -> None:
        wanted = self._wanted_pods()
        now = time.monotonic()
        for uid in [u for u in self.pods if u not in wanted]:
            run = self.pods.pop(uid)
            run.sigterm_at = now + DRAIN_DELAY_S
            self.leaving[uid] = run
        self._drain(now)
        for uid in [u for u in self._waiting if u not in wanted]:  # deleted while waiting for a volume
            del self._waiting[uid]
        for uid, pod in wanted.items():
            if uid not in self.pods:
                self._start_pod(pod)
        for run in self.pods.values():
            self._tend(run)
        self._write_targets(wanted)
        self._save()

    def run(self, should_stop: Callable[[], bool]) -> None:
        self._made_bridge = netns.ensure_bridge(self.pod_cidr)
        try:
            while not should_stop():
                began = time.monotonic()
                try:
                    self.sync_once()
                except (ApiError, OSError) as exc:
                    log.warning("sync failed, retrying: %s", exc)
                time.sleep(max(0.0, self.interval_s - (time.monotonic() - began)))
        finally:
            self.stop_all()

    def _drain(self, now: float) -> None:
        """Advance leaving pods without blocking: SIGTERM after the drain delay, SIGKILL after the
        grace period, then the network namespace goes."""
        for uid, run in list(self.leaving.items()):
            assert run.sigterm_at is not None
            if now >= run.sigterm_at and run.kill_at is None:
                self._signal(run, signal.SIGTERM)
                run.kill_at = now + STOP_GRACE_S
            if run.kill_at is not None and now >= run.kill_at:
                self._signal(run, signal.SIGKILL)
            if run.kill_at is not None and all(c.proc is None or c.proc.poll() is not None for c in run.containers):
                netns.delete(run.netns, run.veth)
                del self.leaving[uid]
                log.info("pod %s/%s stopped, netns %s removed", run.namespace, run.name, run.netns)

    def stop_all(self) -> None:
        runs = [*self.pods.values(), *self.leaving.values()]
        self.pods.clear()
        self.leaving.clear()
        for run in runs:
            self._signal(run, signal.SIGTERM)
        for run in runs:
            self._stop_pod(run)
        if self._made_bridge:
            netns.delete_bridge()
        self.targets_file.unlink(missing_ok=True)
        self._save()

    # ---- pods ------------------------------------------------------------------------------
    def _wanted_pods(self) -> dict[str, dict[str, Any]]:
        out = {}
        for ns in self.api.request("GET", "/api/v1/namespaces").get("items", []):
            name = ns["metadata"]["name"]
            if not name.startswith(RUN_PODS_PREFIX) or ns["metadata"].get("deletionTimestamp"):
                continue
            for pod in self.api.request("GET", f"/api/v1/namespaces/{name}/pods").get("items", []):
                status = pod.get("status") or {}
                if (status.get("phase") == "Running" and status.get("podIP")
                        and not pod["metadata"].get("deletionTimestamp")):
                    out[pod["metadata"]["uid"]] = pod
        return out

    def _start_pod(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        ns_name, veth = netns.names(meta["uid"])
        run = PodRun(meta["uid"], meta["namespace"], meta["name"], pod["status"]["podIP"], ns_name, veth)
        try:
            dirs = materialize(pod["spec"].get("volumes") or [], self._volumes_dir(run),
                               lambda kind, name: self._volume_source(run.namespace, kind, name),
                               init_mounted(pod["spec"]))  # fmt: skip
        except VolumeUnavailable as exc:  # not started; tried again at the next sync, as the kubelet retries
            if self._waiting.get(run.uid) != str(exc):
                log.warning("pod %s/%s waits: %s", run.namespace, run.name, exc)
                self._waiting[run.uid] = str(exc)
                self._report(run, False, "CreateContainerConfigError", str(exc))
            return
        except UnsupportedVolume as exc:
            dirs = {}
            log.warning("pod %s/%s: %s", run.namespace, run.name, exc)
        self._waiting.pop(run.uid, None)
        try:
            plans = plan_pod(pod, volume_dirs=dirs)
        except UnsupportedContainer as exc:
            log.warning("pod %s/%s not run: %s", run.namespace, run.name, exc)
            self.pods[run.uid] = run
            self._report(run, False, "UnsupportedContainer", str(exc))
            return
        for other in [o for o in [*self.pods.values(), *self.leaving.values()] if o.ip == run.ip]:
            self.pods.pop(other.uid, None)  # KWOK may hand a freed IP to a new pod at once
            self.leaving.pop(other.uid, None)
            self._stop_pod(other)
        netns.create(run.netns, run.veth, run.ip, self.pod_cidr)
        run.containers = [Container(p) for p in plans]
        self.pods[run.uid] = run
        log.info("pod %s/%s: %d container(s) in netns %s at %s", run.namespace, run.name, len(plans),
                 run.netns, run.ip)

    def _log_path(self, run: PodRun, container: str) -> Path:
        return self.state_dir / "pods" / f"{run.namespace}_{run.name}" / f"{container}.log"

    def _volumes_dir(self, run: PodRun) -> Path:
        return self.state_dir / "pods" / f"{run.namespace}_{run.name}" / "volumes"

    def _volume_source(self, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
        """The ConfigMap or Secret a volume projects; None if there is none."""
        plural = "configmaps" if kind == "configMap" else "secrets"
        try:
            return self.api.request("GET", f"/api/v1/namespaces/{namespace}/{plural}/{name}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise VolumeUnavailable(f"{plural[:-1]} {name!r} could not be read: {exc}") from exc

    def _spawn(self, run: PodRun, c: Container) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **dict(c.plan.env)}
        path = self._log_path(run, c.plan.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as out:
            c.proc = subprocess.Popen([*netns.exec_prefix(run.netns), *c.plan.argv], stdin=subprocess.DEVNULL,
                                      stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                      preexec_fn=processes._die_with_parent)

    def _tend(self, run: PodRun) -> None:
        """Run init containers in order to completion, then start or restart exited containers (with
        back-off), probe readiness, report it."""
        now = time.monotonic()
        pending = next((c for c in run.containers if c.plan.init and not c.done), None)
        if pending is not None:
            self._tend_init(run, pending, now)
            return
        for c in run.containers:
            if c.plan.init:
                continue
            if c.proc is not None and c.proc.poll() is not None:
                log.warning("pod %s/%s container %s exited with %s", run.namespace, run.name, c.plan.name,
                            c.proc.returncode)
                c.proc, c.ready, c.failures = None, False, 0
                c.restarts += 1
                c.start_after = now + RESTART_BACKOFF_S[min(c.restarts - 1, len(RESTART_BACKOFF_S) - 1)]
            if c.proc is None and now >= c.start_after:
                self._spawn(run, c)
            if c.proc is not None:
                self._readiness(run, c, now)
        main = [c for c in run.containers if not c.plan.init]
        if main:
            ready = all(c.ready for c in main)
            waiting = [c.plan.name for c in main if not c.ready]
            self._report(run, ready, "ContainersNotReady" if waiting else "", f"containers not ready: {waiting}"
                         if waiting else "")

    def _tend_init(self, run: PodRun, c: Container, now: float) -> None:
        """One init container: exit 0 lets the next step start; another exit is retried with back-off and
        its log's tail becomes lastState.terminated.message (terminationMessagePolicy FallbackToLogsOnError)."""
        if c.proc is not None and c.proc.poll() is not None:
            code, c.proc = c.proc.returncode, None
            if code == 0:
                c.done = True
                log.info("pod %s/%s init container %s completed", run.namespace, run.name, c.plan.name)
            else:
                c.restarts += 1
                c.last_exit = (code, self._log_tail(run, c.plan.name))
                c.start_after = now + RESTART_BACKOFF_S[min(c.restarts - 1, len(RESTART_BACKOFF_S) - 1)]
                log.warning("pod %s/%s init container %s exited with %s", run.namespace, run.name, c.plan.name, code)
        if not c.done and c.proc is None and now >= c.start_after:
            self._spawn(run, c)
        waiting = [x.plan.name for x in run.containers if x.plan.init and not x.done]
        self._report(run, False, "ContainersNotInitialized", f"containers with incomplete status: {waiting}")

    def _log_tail(self, run: PodRun, container: str) -> str:
        try:
            with open(self._log_path(run, container), "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - TERMINATION_MESSAGE_BYTES))
                return f.read().decode(errors="replace").strip()
        except OSError:
            return ""

    def _readiness(self, run: PodRun, c: Container, now: float) -> None:
        """Probes run in threads; like the kubelet, one success makes a container ready and
        `failureThreshold` consecutive failures make it unready."""
        probe = c.plan.probe
        if probe is None:
            c.ready = True
            return
        if c.probing is not None and c.probing.done():
            if c.probing.result():
                c.ready, c.failures = True, 0
            else:
                c.failures += 1
                c.ready = c.ready and c.failures < probe.failure_threshold
            c.probing = None
        if c.probing is None and now >= c.next_probe:
            c.next_probe = now + probe.period_s
            c.probing = self.probes.submit(_probe, f"http://{run.ip}:{probe.port}{probe.path}", probe.timeout_s)

    def _report(self, run: PodRun, ready: bool, reason: str, message: str) -> None:
        state = (ready, reason, tuple((c.plan.name, c.ready, c.restarts, c.done, c.proc is None)
                                      for c in run.containers))
        if state == run.reported:
            return
        now, flag = _now(), "True" if ready else "False"
        conds = [{"type": t, "status": flag, "lastTransitionTime": now, **({"reason": reason, "message": message}
                                                                           if reason else {})}
                 for t in ("Ready", "ContainersReady")]
        body: dict[str, Any] = {"status": {"conditions": conds}}
        if run.containers:
            body["status"]["containerStatuses"] = [
                {"name": c.plan.name, "ready": c.ready, "restartCount": c.restarts}
                for c in run.containers if not c.plan.init]
        if any(c.plan.init for c in run.containers):
            body["status"]["initContainerStatuses"] = [_init_status(c) for c in run.containers if c.plan.init]
        try:
            self.api.request("PATCH", f"/api/v1/namespaces/{run.namespace}/pods/{run.name}/status", body,
                             content_type="application/strategic-merge-patch+json")
            run.reported = state
        except ApiError as exc:
            if exc.status != 404:
                log.warning("status of pod %s/%s not written: %s", run.namespace, run.name, exc)

    def _signal(self, run: PodRun, sig: int) -> None:
        for c in run.containers:
            if c.proc is not None and c.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    c.proc.send_signal(sig)

    def _stop_pod(self, run: PodRun) -> None:
        self._signal(run, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for c in run.containers:
            if c.proc is None:
                continue
            try:
                c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait(timeout=10)
            c.proc = None
        netns.delete(run.netns, run.veth)
        shutil.rmtree(self._volumes_dir(run), ignore_errors=True)
        log.info("pod %s/%s stopped, netns %s removed", run.namespace, run.name, run.netns)

    # ---- files -----------------------------------------------------------------------------
    def _write_targets(self, wanted: dict[str, dict[str, Any]]) -> None:
        running = {uid for uid, run in self.pods.items() if run.containers}
        targets = [t for uid, pod in sorted(wanted.items()) if uid in running and (t := scrape_target(pod))]
        text = json.dumps(targets, indent=1)
        if text != self._targets:
            self.targets_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.targets_file.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(self.targets_file)
            self._targets = text

    def _save(self) -> None:
        state = {"bridge": self._made_bridge, "pods": {
            uid: {"namespace": r.namespace, "name": r.name, "netns": r.netns, "veth": r.veth,
                  "pids": [c.proc.pid for c in r.containers if c.proc is not None]}
            for uid, r in {**self.pods, **self.leaving}.items()}}
        tmp = self.state_dir / "podrunner.json.tmp"
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.state_dir / "podrunner.json")


def cleanup_leftovers(state_dir: Path) -> None:
    """After a runner died without cleaning up: kill the processes and remove the namespaces and
    the bridge it recorded (`kvpilot cluster down` calls this)."""
    path = state_dir / "podrunner.json"
    if not path.exists():
        return
    state = json.loads(path.read_text())
    for pod in state.get("pods", {}).values():
        for pid in pod.get("pids", []):
            processes.terminate(pid, grace_s=5)
        netns.delete(pod["netns"], pod["veth"])
    if state.get("bridge"):
        netns.delete_bridge()
    path.unlink(missing_ok=True)
    (state_dir / "prometheus" / "pods.json").unlink(missing_ok=True)
