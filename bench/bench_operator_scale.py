"""Operator scale: N InferenceServices on M fake GPU nodes (local control plane + KWOK).

    python bench/bench_operator_scale.py --services 1000 --nodes 500

Starts a LocalCluster with M nodes (8 x NVIDIA-H200 each), applies the CRD, starts
`kvpilot operator` (standalone, one namespace) as a child process with request counters, creates
N InferenceServices (1 replica, 1 GPU each) and measures:
  - seconds from the first create until all N report phase Ready (their Deployment's pod Running
    and Ready under KWOK);
  - the operator's CPU time (user + system) and peak RSS (VmHWM) from /proc;
  - API requests per reconcile: the operator's own client (GET / server-side apply / status
    PATCH) and kopf's (watches, annotation patches, events), divided by reconciles run;
  - every 15 s during the run: the machine's 1-minute load average and how many nodes are not
    Ready (KWOK falling behind on heartbeats shows up here); `--hold S` keeps watching S seconds
    after all are Ready (longer than the nodes' 4-6 minute status heartbeat and the 5-minute node
    grace period, to see that nodes and services stay Ready).
Prints one JSON line with every figure. The cluster is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LLAMA3_8B = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256, "torch_dtype": "bfloat16",
}


def run_operator_with_counters(namespace: str, stats_path: str) -> int:
    """The operator process: counts API requests (ours and kopf's) and reconciles, dumps them at exit."""
    from collections import Counter

    import aiohttp

    from kvpilot.operator import kube
    from kvpilot.operator.handlers import reconcile as reconcile_handler
    from kvpilot.operator.reconcile import reconciler

    kopf_requests: Counter[str] = Counter()
    reconciles = Counter()
    original_request = aiohttp.ClientSession._request

    async def counted_request(self, method, url, *args, **kwargs):  # type: ignore[no-untyped-def]
        watch = "watch=true" in str(url) or (kwargs.get("params") or {}).get("watch") in ("true", True)
        kopf_requests["WATCH" if watch else method.upper()] += 1
        return await original_request(self, method, url, *args, **kwargs)

    aiohttp.ClientSession._request = counted_request  # type: ignore[method-assign]
    original_reconcile = reconciler.reconcile

    def counted_reconcile(ctx, body):  # type: ignore[no-untyped-def]
        reconciles["reconcile"] += 1
        return original_reconcile(ctx, body)

    reconcile_handler.reconcile = counted_reconcile  # the name the handler calls

    def dump() -> None:
        ours = dict(kube.shared().requests) if kube._shared is not None else {}
        Path(stats_path).write_text(json.dumps({"operator_client": ours, "kopf": dict(kopf_requests),
                                                "reconciles": reconciles["reconcile"]}))

    def periodic() -> None:
        while True:
            time.sleep(2)
            dump()

    threading.Thread(target=periodic, daemon=True).start()
    from kvpilot.operator import cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    try:
        return cli.run(parser.parse_args(["--namespace", namespace, "--standalone"]))
    finally:
        dump()


def follow_phases(custom, namespace: str, phases: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    """Keep `phases` (name -> status.phase) current from one watch stream (not by listing 1,000 objects)."""
    from kubernetes import watch

    rv = ""
    while True:
        try:
            stream = watch.Watch().stream(custom.list_namespaced_custom_object, "kvpilot.io", "v1alpha1", namespace,
                                          "inferenceservices", resource_version=rv, timeout_seconds=300)
            for event in stream:
                obj = event["object"]
                rv = obj["metadata"]["resourceVersion"]
                phases[obj["metadata"]["name"]] = (obj.get("status") or {}).get("phase", "")
        except Exception:  # a dropped or expired stream: start again from now
            rv = ""
            time.sleep(1)


def sample_machine(core, samples: list[dict], stop: threading.Event, every_s: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    """Every `every_s`: the 1-minute load average and how many nodes are not Ready (KWOK keeping up?)."""
    began = time.monotonic()
    while not stop.wait(every_s):
        try:
            nodes = core.list_node().items
            not_ready = sum(1 for n in nodes if not any(c.type == "Ready" and c.status == "True"
                                                        for c in n.status.conditions or ()))
        except Exception:  # a slow API server: record the load anyway
            not_ready = -1
        samples.append({"t_s": round(time.monotonic() - began), "load1": os.getloadavg()[0],
                        "nodes_not_ready": not_ready})


def proc_stats(pid: int) -> tuple[float, int]:
    """(CPU seconds user+system, peak RSS bytes) of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    hwm = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmHWM"))
    return cpu, int(hwm.split()[1]) * 1024


def body(name: str, namespace: str) -> dict:
    return {
        "apiVersion": "kvpilot.io/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"model": {"uri": "file:///models/llama-3-8b", "config": LLAMA3_8B},
                 "strategy": {"attention": "gqa", "kvHeadGroups": 4, "maxSeqLen": 8192},
                 "resources": {"gpus": 1, "gpuProduct": "NVIDIA-H200"}, "replicas": 1,
                 "engine": {"image": "kvpilot:bench"}},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--hold", type=float, default=0,
                        help="after all are Ready, keep watching this many seconds (nodes and services stay Ready?)")
    parser.add_argument("--service-cidr", default="10.96.0.0/16", help="kube-apiserver --service-cluster-ip-range")
    parser.add_argument("--as-operator", nargs=2, metavar=("NAMESPACE", "STATS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.as_operator:
        return run_operator_with_counters(*args.as_operator)

    from kubernetes import client, config

    from kvpilot.cluster import local
    from kvpilot.cluster.local import LocalCluster

    # The test cluster's /24 service range holds ~250 Services; N InferenceServices need N cluster IPs.
    local.SERVICE_CIDR = args.service_cidr

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` stops the cluster

    state = Path(tempfile.mkdtemp(prefix="kvpilot-bench-")) / "cluster"
    cluster = LocalCluster(state, nodes=args.nodes, start_timeout_s=900)
    t0 = time.monotonic()
    cluster.start()
    cluster_s = time.monotonic() - t0
    operator = None
    try:
        kubectl = ["/usr/bin/kubectl", f"--kubeconfig={cluster.kubeconfig}"]
        subprocess.run([*kubectl, "apply", "-f", str(REPO / "crds" / "inferenceservices.kvpilot.io.yaml")], check=True)
        subprocess.run([*kubectl, "wait", "--for=condition=Established", "crd/inferenceservices.kvpilot.io"],
                       check=True)
        api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
        namespace = "bench"
        core.create_namespace({"metadata": {"name": namespace}})
        while not core.list_namespaced_service_account(namespace).items:
            time.sleep(0.2)
        stats_path = state.parent / "operator-stats.json"
        log = (state.parent / "operator.log").open("w")
        operator = subprocess.Popen([sys.executable, __file__, "--as-operator", namespace, str(stats_path)],
                                    stdout=log, stderr=subprocess.STDOUT,
                                    env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}, cwd=REPO)
        time.sleep(5)
        began = time.monotonic()

        def create(i: int) -> None:
            custom.create_namespaced_custom_object("kvpilot.io", "v1alpha1", namespace, "inferenceservices",
                                                   body(f"svc-{i:05d}", namespace))

        phases: dict[str, str] = {}
        threading.Thread(target=follow_phases, args=(custom, namespace, phases), daemon=True).start()
        samples: list[dict] = []
        stop_sampling = threading.Event()
        threading.Thread(target=sample_machine, args=(core, samples, stop_sampling), daemon=True).start()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(create, range(args.services)))
        created_s = time.monotonic() - began
        ready = 0
        while time.monotonic() - began < args.timeout:
            ready = sum(1 for phase in list(phases.values()) if phase == "Ready")
            if ready == args.services:
                break
            if operator.poll() is not None:
                raise RuntimeError("the operator exited; see " + log.name)
            time.sleep(0.5)
        all_ready_s = time.monotonic() - began
        held_until = time.monotonic() + (args.hold if ready == args.services else 0)
        while time.monotonic() < held_until and operator.poll() is None:
            time.sleep(1)
        ready_after_hold = sum(1 for phase in list(phases.values()) if phase == "Ready")
        stop_sampling.set()
        loads = [x["load1"] for x in samples] or [os.getloadavg()[0]]
        not_ready = [x["nodes_not_ready"] for x in samples]
        time.sleep(3)
        cpu_s, rss = proc_stats(operator.pid)
        stats = json.loads(stats_path.read_text())
        reconciles = max(1, stats["reconciles"])
        ours = sum(stats["operator_client"].values())
        kopf_total = sum(stats["kopf"].values())
        print(json.dumps({
            "services": args.services, "nodes": args.nodes, "cluster_start_s": round(cluster_s, 1),
            "create_s": round(created_s, 1), "ready": ready, "all_ready_s": round(all_ready_s, 1),
            "operator_cpu_s": round(cpu_s, 1), "operator_peak_rss_mib": round(rss / 2**20, 1),
            "reconciles": stats["reconciles"], "operator_client_requests": stats["operator_client"],
            "kopf_requests": stats["kopf"],
            "requests_per_reconcile": round((ours + kopf_total) / reconciles, 2),
            "operator_client_requests_per_reconcile": round(ours / reconciles, 2),
            "load1_min_mean_max": [round(min(loads), 2), round(sum(loads) / len(loads), 2), round(max(loads), 2)],
            "max_nodes_not_ready": max(not_ready, default=0), "hold_s": args.hold,
            "ready_after_hold": ready_after_hold, "samples": samples,
        }))
        return 0 if ready == args.services else 1
    finally:
        if operator is not None and operator.poll() is None:
            operator.terminate()
            try:
                operator.wait(timeout=30)
            except subprocess.TimeoutExpired:
                operator.kill()
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
