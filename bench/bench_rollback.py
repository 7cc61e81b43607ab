"""One-flag rollback time on the local fleet, over N runs (issue 19's measurement).

Starts what `kvpilot demo` starts (control plane, pod runner, gateway stand-in, Prometheus, the
operator, the stable engine; a random tiny Llama instead of the demo's trained one), sends steady
load through the gateway, then N times: a canary (int8 KV) at 50%, and once it serves,
`spec.rollback: true`. For each run it records, from the moment the patch was accepted:
  route_s     the HTTPRoute as the API server stores it has the canary at weight 0
  applied_s   the gateway stand-in has rendered and reloaded that route generation (route status)
  last_s      the last request that reached the canary was sent this long after the flag
  failed      requests sent after the flag that failed
and prints one JSON line per run, then the median and max of each. Needs root (network
namespaces), nginx and prometheus, like the demo. Not a test: figures go to docs/benchmarks.md.

    sudo PYTHONPATH=$PWD python bench/bench_rollback.py --runs 10
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from kvpilot.cluster import processes
from kvpilot.cluster.gateway import CONTROLLER_NAME, GROUP
from kvpilot.demo.fleet import GATEWAY, NAMESPACE, QUICK, SERVICE, FleetDemo, preflight
from kvpilot.loadgen import LoadGenerator

RATE_PER_S = 10.0


class RollbackBench(FleetDemo):
    """The demo's fleet with a random model; the rollback measured `runs` times."""

    def make_model(self) -> Path:
        from kvpilot.engine.make_model import make_model

        return make_model(self.work / "model", "llama", "tiny")

    def route(self) -> dict[str, Any]:
        return self.api.request("GET", f"/apis/{GROUP}/v1/namespaces/{NAMESPACE}/httproutes/{SERVICE}")

    def canary_weight(self, route: dict[str, Any]) -> int:
        for rule in route["spec"]["rules"]:
            if not rule.get("matches") or not any(m.get("headers") for m in rule["matches"]):
                return sum(int(b.get("weight", 1)) for b in rule["backendRefs"] if b["name"] == f"{SERVICE}-canary")
        return 0

    def applied(self, route: dict[str, Any]) -> bool:
        for parent in (route.get("status") or {}).get("parents") or []:
            if parent.get("controllerName") == CONTROLLER_NAME:
                return all(c.get("observedGeneration") == route["metadata"]["generation"] for c in parent["conditions"])
        return False

    def one(self, run: int) -> dict[str, Any]:
        assert self.load is not None
        canary = {"strategy": {"kvCacheDtype": "int8"}, "steps": [50, 100], "interval": f"{600 + run}s",
                  "gateway": {"name": GATEWAY, "namespace": NAMESPACE}, "analysis": {"minRequests": 5}}
        before = self._spec_hash()
        self.patch_spec({"canary": canary, "rollback": False})
        processes.wait_until(lambda: (self._status().get("specHash") not in (None, before)
                                      and self._status().get("weight") == 50), "the canary at 50%", 300)
        processes.wait_until(lambda: self.applied(self.route()), "the 50% route applied", 60)
        strategy = str(self._status().get("strategy") or "")
        processes.wait_until(lambda: sum(o.strategy == strategy and o.ok for o in self.load.outcomes[-40:]) >= 3,
                             "the canary serving", 120)
        flagged = time.time()
        self.patch_spec({"rollback": True})
        route_s = applied_s = None
        while applied_s is None and time.time() - flagged < 60:
            route = self.route()
            if route_s is None and self.canary_weight(route) == 0:
                route_s = time.time() - flagged
            if route_s is not None and self.applied(route):
                applied_s = time.time() - flagged
            time.sleep(0.02)
        processes.wait_until(lambda: self._status().get("phase") == "RolledBack", "RolledBack", 60)
        time.sleep(3)  # requests sent after the switch have come back
        since = [o for o in self.load.outcomes if o.sent_s + self.load_started >= flagged]
        on_canary = [o.sent_s + self.load_started - flagged for o in since if o.strategy == strategy]
        return {"run": run, "route_s": route_s, "applied_s": applied_s, "last_s": max(on_canary, default=0.0),
                "requests_since": len(since), "failed": sum(not o.ok for o in since)}

    def _status(self) -> dict[str, Any]:
        return (self.isvc().get("status") or {}).get("canary") or {}

    def measure(self, runs: int) -> list[dict[str, Any]]:
        self.start_cluster()
        self.cluster.start_fleet()
        model = self.make_model()
        self.start_operator()
        url = self.apply_service(model)
        self.load = LoadGenerator(url, rate_per_s=RATE_PER_S, stream_share=0.5, max_tokens=8)
        self._load_ctx = self.load.background()
        self._load_ctx.__enter__()
        self.load_started = time.time()
        results = []
        for run in range(runs):
            result = self.one(run)
            print(json.dumps(result), flush=True)
            results.append(result)
        return results


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": len(results), "failed_after_flag": sum(r["failed"] for r in results)}
    for key in ("route_s", "applied_s", "last_s"):
        values = [r[key] for r in results if r[key] is not None]
        out[key] = {"median": round(statistics.median(values), 3), "max": round(max(values), 3)} if values else None
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    why = preflight()
    if why:
        print(f"bench_rollback: {why}", file=sys.stderr)
        return 2
    work = args.workdir or Path(tempfile.mkdtemp(prefix="kvpilot-rollback-"))
    work.mkdir(parents=True, exist_ok=True)
    bench = RollbackBench(Console(highlight=False), work.resolve(), QUICK)
    try:
        results = bench.measure(args.runs)
    finally:
        bench.cleanup()
    print(json.dumps(summary(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
