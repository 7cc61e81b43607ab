"""The fleet demo: a rollout and two rollbacks on one machine, with real engines and real traffic.

Stages (each printed as `[k/N] ...`): the local control plane with fake GPU nodes; the fleet
(pod runner, gateway stand-in, Prometheus); a tiny model; the operator; the stable track from
examples/demo/; load through the Gateway; canary 1 (int8 KV) promoted; canary 2 (mean-pooled
GQA) rolled back by the accuracy gate; canary 3 rolled back by hand with one flag
(`spec.rollback: true`); the report. Everything started is stopped on exit, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.live import Live

from kvpilot.cluster import processes
from kvpilot.cluster.api import ApiClient, ApiError
from kvpilot.cluster.gateway.objects import gateway, gateway_url
from kvpilot.demo import live, report
from kvpilot.loadgen import LoadGenerator, summarise

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "demo" / "inferenceservice.yaml"
PROBES = REPO / "examples" / "demo" / "probe-set.yaml"
NAMESPACE, SERVICE, GATEWAY = "fleet-demo", "chat", "demo-gw"  # fleet-*: the pod runner runs its pods
API = "/apis/kvpilot.io/v1alpha1"
DONE = ("Promoted", "RolledBack", "Failed")
# The engines run on a shared CPU, where an 8-bit KV cache quantises in the step itself: latency
# ratios up to 4x are tolerated so that the accuracy gate, not CPU noise, decides canary 2.
LATENCY = {"maxTtftP95Ratio": 4.0, "maxTpotP95Ratio": 4.0}
# An analysis can be inconclusive on a loaded machine (a histogram with no sample yet in its
# window): the step is analysed again rather than rolled back on the first one. A failed
# accuracy gate fails every analysis, so canary 2 still rolls back, two intervals later.
FAILURE_LIMIT = 3
STAGES = ("control plane", "fleet: pod runner, gateway, Prometheus", "model", "operator", "stable track",
          "load through the gateway", "canary 1: int8 KV cache", "canary 2: mean-pooled GQA",
          "manual rollback: one flag", "report")


@dataclass(frozen=True)
class Pace:
    """How fast the rollouts go: --quick for CI, the default for people."""

    steps: tuple[int, ...]
    interval: str
    rate_per_s: float
    min_requests: int
    window: str
    phase_timeout_s: float


QUICK = Pace(steps=(20, 100), interval="12s", rate_per_s=6.0, min_requests=5, window="20s", phase_timeout_s=240)
FULL = Pace(steps=(5, 25, 50, 100), interval="30s", rate_per_s=8.0, min_requests=10, window="30s",
            phase_timeout_s=600)


def preflight() -> str | None:
    from kvpilot.cluster.gateway.nginx_process import nginx_missing
    from kvpilot.cluster.podrunner.netns import unavailable
    from kvpilot.cluster.prometheus import prometheus_missing

    why = unavailable() or nginx_missing() or prometheus_missing()
    if why:
        return f"{why}. (`kvpilot demo --engine-only` runs one engine without a cluster.)"
    if not EXAMPLE.exists():
        return f"{EXAMPLE} is missing: run the demo from a kvpilot checkout"
    return None


def run(args: argparse.Namespace) -> int:
    why = preflight()
    if why:
        print(f"kvpilot demo: {why}", file=sys.stderr)
        return 2
    console = Console(highlight=False)
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="kvpilot-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    demo = FleetDemo(console, work.resolve(), QUICK if args.quick else FULL)

    def interrupt(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    try:
        return demo.run()
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping everything the demo started[/yellow]")
        return 130
    finally:
        demo.cleanup()


class FleetDemo:
    def __init__(self, console: Console, work: Path, pace: Pace) -> None:
        self.console, self.work, self.pace = console, work, pace
        self.cluster: Any = None
        self.operator: subprocess.Popen[bytes] | None = None
        self.load: LoadGenerator | None = None
        self._load_ctx: Any = None
        self.markers: list[report.Marker] = []
        self.rows: list[tuple[str, str]] = []
        self.summary: dict[str, Any] = {}
        self.t0 = time.time()
        self.load_started = 0.0
        self.stage_no = 0

    # ---- plumbing ------------------------------------------------------------------------
    def stage(self, title: str) -> None:
        self.stage_no += 1
        self.console.rule(f"[bold]\\[{self.stage_no}/{len(STAGES)}] {title}")
        if self.load_started:
            self.markers.append(report.Marker(time.time() - self.load_started, title.split(":")[0]))

    def slow(self, what: str, fn: Callable[[], Any]) -> Any:
        began = time.monotonic()
        with self.console.status(f"{what} ..."):
            out = fn()
        self.console.print(f"  {what}: done in {time.monotonic() - began:.1f} s")
        return out

    @property
    def api(self) -> ApiClient:
        return self.cluster.api()

    def isvc(self) -> dict[str, Any]:
        return self.api.request("GET", f"{API}/namespaces/{NAMESPACE}/inferenceservices/{SERVICE}")

    def patch_spec(self, spec: dict[str, Any]) -> None:
        self.api.request("PATCH", f"{API}/namespaces/{NAMESPACE}/inferenceservices/{SERVICE}", {"spec": spec},
                         content_type="application/merge-patch+json")

    def lineage(self) -> dict[str, Any] | None:
        try:
            return self.api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/configmaps/{SERVICE}-lineage")
        except ApiError:
            return None

    # ---- the stages ----------------------------------------------------------------------
    def run(self) -> int:
        c = self.console
        c.print(f"kvpilot fleet demo ({'quick' if self.pace is QUICK else 'full'}); work dir {self.work}")
        self.stage(STAGES[0])
        self.start_cluster()
        self.stage(STAGES[1])
        self.slow("pod runner, gateway stand-in (nginx) and Prometheus", self.cluster.start_fleet)
        c.print(f"  Prometheus {self.cluster.prometheus_url}")
        self.stage(STAGES[2])
        model = self.slow("tiny Llama checkpoint (random weights, then a short training run on the docs)",
                          self.make_model)
        self.stage(STAGES[3])
        self.slow("kvpilot operator", self.start_operator)
        self.stage(STAGES[4])
        url = self.apply_service(model)
        self.stage(STAGES[5])
        self.start_load(url)
        self.stage(STAGES[6])
        first = self.rollout({"kvCacheDtype": "int8"}, analysis={})
        self.stage(STAGES[7])
        second = self.rollout({"attention": "gqa", "kvHeadGroups": 1},
                              analysis={"probeSet": "demo-probes", "maxAccuracyDelta": 0.05})
        self.stage(STAGES[8])
        third, rollback_s = self.manual_rollback()
        self.stage(STAGES[9])
        self.rows += [("canary 1 (int8 KV)", first), ("canary 2 (mean-pooled GQA)", second),
                      ("canary 3 (manual rollback)", third),
                      ("rollback: flag set -> last request on the canary", f"{rollback_s:.2f} s")]
        self.write_report()
        return 0

    def start_cluster(self) -> None:
        from kvpilot.cluster import build, gateway_api
        from kvpilot.cluster.crds import install_crd
        from kvpilot.cluster.local import LocalCluster

        if LocalCluster.missing_binaries():
            self.console.print("  the control plane is built once from published Go modules (~17 min cold)")
            rc = self.slow("kvpilot cluster build", lambda: build.build_all(None))
            if rc:
                raise SystemExit(f"kvpilot demo: `kvpilot cluster build` failed (exit {rc})")
        self.cluster = LocalCluster(self.work / "cluster", nodes=2, die_with_parent=True)
        self.slow("etcd, kube-apiserver, controller-manager, scheduler, KWOK with 2 fake 8 x H200 nodes",
                  self.cluster.start)
        self.slow("Gateway API CRDs", lambda: gateway_api.install(self.api))
        self.slow("InferenceService CRD", lambda: install_crd(self.api, REPO / "crds" / "inferenceservices.kvpilot.io.yaml"))

    def make_model(self) -> Path:
        from kvpilot.demo.tiny_model import make_trained_model

        return make_trained_model(self.work / "model", REPO / "docs")

    def start_operator(self) -> None:
        from kvpilot.cluster.prometheus import write_targets

        port = processes.free_ports(1)[0]
        log = self.work / "operator.log"
        env = {**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)}
        self._gateway_ns()
        gw = gateway_url(self.api, NAMESPACE, GATEWAY)
        argv = [sys.executable, "-m", "kvpilot.cli", "operator", "--namespace", NAMESPACE, "--standalone",
                "--prometheus-url", self.cluster.prometheus_url, "--gateway-url", gw,
                "--rollout-tick", "1", "--metrics-port", str(port)]
        with open(log, "ab") as out:
            self.operator = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                             start_new_session=True)
        processes.wait_until(lambda: processes.http_ok(f"http://127.0.0.1:{port}/metrics"), "operator", 120,
                             self.operator.pid, log)
        write_targets(self.cluster.state_dir, "operator.json",
                      [{"targets": [f"127.0.0.1:{port}"], "labels": {"component": "operator"}}])
        self.console.print(f"  operator log {log}; gateway {gw}")

    def _gateway_ns(self) -> None:
        self.api.request("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        processes.wait_until(lambda: self.api.exists(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default"),
                             "namespace", 60)
        self.api.request("POST", f"/apis/gateway.networking.k8s.io/v1/namespaces/{NAMESPACE}/gateways",
                         gateway(NAMESPACE, GATEWAY))

    def apply_service(self, model: Path) -> str:
        body = yaml.safe_load(EXAMPLE.read_text())
        body["metadata"]["namespace"] = NAMESPACE
        body["spec"]["model"] = {"uri": f"file://{model}", "sha256": _digest(model),
                                 "config": json.loads((model / "config.json").read_text())}
        self.api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/configmaps", yaml.safe_load(PROBES.read_text()))
        self.api.request("POST", f"{API}/namespaces/{NAMESPACE}/inferenceservices", body)
        self.console.print(f"  applied {EXAMPLE.relative_to(REPO)} (model {model}, sha256 {body['spec']['model']['sha256'][:12]})")
        self.slow("stable engine warm-up (model load, first forward passes)", lambda: processes.wait_until(
            lambda: bool(_ready(self.api, SERVICE)), "stable engine ready", 600))
        # The service's route through the Gateway before any canary: all traffic to stable. The
        # operator's router takes this HTTPRoute over (same name, server-side apply) at the first canary.
        self.api.request("POST", f"/apis/gateway.networking.k8s.io/v1/namespaces/{NAMESPACE}/httproutes", {
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": SERVICE, "namespace": NAMESPACE},
            "spec": {"parentRefs": [{"name": GATEWAY}], "rules": [{"backendRefs": [{"name": SERVICE, "port": 8000}]}]}})
        url = gateway_url(self.api, NAMESPACE, GATEWAY)
        processes.wait_until(lambda: processes.http_ok(f"{url}/v1/models"), "the route through the gateway", 60)
        self.console.print(f"  HTTPRoute {SERVICE}: {url} -> Service {SERVICE} (stable)")
        return url

    def start_load(self, url: str) -> None:
        self.load = LoadGenerator(url, rate_per_s=self.pace.rate_per_s, stream_share=0.5, max_tokens=12)
        self._load_ctx = self.load.background()
        self._load_ctx.__enter__()
        self.load_started = time.time()
        self.console.print(f"  {self.pace.rate_per_s:g} requests/s to {url} (half of them streamed)")

    def rollout(self, strategy: dict[str, Any], analysis: dict[str, Any]) -> str:
        p = self.pace
        canary = {"strategy": strategy, "steps": list(p.steps), "interval": p.interval,
                  "gateway": {"name": GATEWAY, "namespace": NAMESPACE},
                  "analysis": {"minRequests": p.min_requests, "failureLimit": FAILURE_LIMIT, **LATENCY, **analysis}}
        before = self._spec_hash()
        self.patch_spec({"canary": canary, "rollback": False})
        self.console.print(f"  spec.canary.strategy = {strategy}; steps {list(p.steps)}, interval {p.interval}")
        return self.watch(lambda st: st.get("phase") in DONE and st.get("specHash") not in (None, before),
                          p.phase_timeout_s, live.VerdictFeed(before))

    def _spec_hash(self) -> str | None:
        return ((self.isvc().get("status") or {}).get("canary") or {}).get("specHash")

    def watch(self, until: Callable[[dict[str, Any]], Any], timeout_s: float, feed: live.VerdictFeed) -> str:
        """Show the rollout live until `until(status.canary)`; print each of this canary's verdicts once."""
        deadline = time.monotonic() + timeout_s
        stage = STAGES[self.stage_no - 1]
        with Live(console=self.console, refresh_per_second=2, transient=True) as view:
            while True:
                body = self.isvc()
                canary = (body.get("status") or {}).get("canary") or {}
                for a in feed.new(canary):
                    view.console.print(live.verdict_line(a))
                view.update(live.rollout_view(stage, body, self.lineage(), summarise(self.load.outcomes)
                                              if self.load else {}, previous_spec=feed.previous_spec))
                if until(canary):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{stage}: the rollout did not finish within {timeout_s:.0f} s "
                                       f"(phase {canary.get('phase')}); operator log {self.work / 'operator.log'}")
                time.sleep(0.5)
        outcome = f"{canary.get('phase')}: {canary.get('message', '')}"
        self.summary.setdefault("rollouts", []).append(
            {"stage": stage, "phase": canary.get("phase"), "reason": canary.get("reason"),
             "verdicts": [(a.get("verdict"), a.get("reason")) for a in canary.get("analyses") or []],
             "messages": [a.get("message") for a in canary.get("analyses") or []]})
        self.console.print(f"  [bold]{outcome}[/bold]")
        for track, current, previous in live.lineage_rows(self.lineage()):
            self.console.print(f"  lineage {track}: {current} (previous: {previous})")
        return outcome

    def manual_rollback(self) -> tuple[str, float]:
        p = self.pace
        canary = {"strategy": {"kvCacheDtype": "fp8"}, "steps": [50, 100], "interval": "10m",
                  "gateway": {"name": GATEWAY, "namespace": NAMESPACE},
                  "analysis": {"minRequests": p.min_requests, **LATENCY}}
        before = self._spec_hash()
        self.patch_spec({"canary": canary, "rollback": False})
        self.console.print("  canary 3 (fp8 KV) at 50 %; when it serves, `spec.rollback: true` is set")
        feed = live.VerdictFeed(before)
        self.watch(lambda st: st.get("specHash") not in (None, before) and st.get("weight", 0) >= 50,
                   p.phase_timeout_s, feed)
        assert self.load is not None
        strategy = _canary_strategy(self.isvc())
        if not strategy:
            raise RuntimeError("status.canary.strategy is empty: cannot tell canary responses apart")
        processes.wait_until(lambda: any(o.strategy == strategy and o.ok for o in self.load.outcomes[-20:]),
                             "canary 3 serving", 120)
        flagged = time.time()
        self.patch_spec({"rollback": True})
        outcome = self.watch(lambda st: st.get("phase") in DONE, p.phase_timeout_s, feed)  # same canary: no reprint
        self.console.print(f"  canary strategy {strategy!r}; X-Model-Strategy of each response tells the tracks apart")
        time.sleep(3)  # requests sent after the switch have come back
        sent_since = [o for o in self.load.outcomes if o.sent_s + self.load_started >= flagged]
        on_canary = [o.sent_s + self.load_started - flagged for o in sent_since if o.strategy == strategy]
        failed = sum(not o.ok for o in sent_since)
        rollback_s = max(on_canary, default=0.0)
        self.summary["manual_rollback"] = {"last_canary_request_after_flag_s": rollback_s,
                                           "requests_since_flag": len(sent_since), "failed_since_flag": failed}
        self.console.print(f"  the last request on the canary was sent {rollback_s:.2f} s after the flag; "
                           f"{len(sent_since)} requests since, {failed} failed")
        return outcome, rollback_s

    def write_report(self) -> None:
        assert self.load is not None
        if self._load_ctx is not None:
            self._load_ctx.__exit__(None, None, None)
            self._load_ctx = None
        end = time.time()
        charts = report.panels(NAMESPACE, SERVICE, self.pace.window)
        data = self.slow("querying Prometheus", lambda: report.collect(
            self.cluster.prometheus_url, charts, self.load_started, end, step_s=2.0))
        out = self.work / "report"
        out.mkdir(exist_ok=True)
        png = report.draw_png(data, charts, self.load_started, self.markers, out / "report.png",
                              "kvpilot demo: InferenceService chat, stable vs canary")
        s = summarise(self.load.outcomes)
        rows = [("requests through the gateway", f"{s['requests']} ({s['failed']} failed)"),
                ("served by strategy", json.dumps(s["by_strategy"])), *self.rows]
        page = report.write_html(out / "report.html", png, "kvpilot demo report", rows)
        failures = [{"sent_s": round(o.sent_s, 2), "status": o.status, "error": o.error[:200]}
                    for o in self.load.outcomes if not o.ok]
        (out / "summary.json").write_text(json.dumps({**self.summary, "load": s, "failures": failures,
                                                      "wall_s": time.time() - self.t0}, indent=1, default=str))
        self.console.print(f"  report: {page}\n  chart:  {png}")

    def cleanup(self) -> None:
        if self._load_ctx is not None:
            self._load_ctx.__exit__(None, None, None)
        if self.operator is not None and self.operator.poll() is None:
            processes.terminate(self.operator.pid, grace_s=10)
        if self.cluster is not None:
            with self.console.status("stopping engines, gateway, Prometheus and the control plane ..."):
                self.cluster.stop()
            self.console.print("stopped everything the demo started")


def _ready(api: ApiClient, service: str) -> list[str]:
    slices = api.request("GET", f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"
                                f"?labelSelector=kubernetes.io/service-name%3D{service}")
    return [a for sl in slices.get("items", []) for ep in sl.get("endpoints") or []
            if (ep.get("conditions") or {}).get("ready") for a in ep.get("addresses", [])]


def _digest(model: Path) -> str:
    from kvpilot.checkpoint_digest import checkpoint_digest

    return checkpoint_digest(model)


def _canary_strategy(body: dict[str, Any]) -> str:
    lineage = ((body.get("status") or {}).get("canary") or {}).get("strategy")
    return str(lineage or "")
