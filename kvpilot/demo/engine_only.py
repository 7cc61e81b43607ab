"""`kvpilot demo --engine-only`: one engine on one machine (CPU is enough), no cluster.

1. Plan: what each memory strategy buys on one H200 for a Llama-3-8B-shaped model (planner only).
2. Serve: a small random checkpoint behind `kvpilot serve`, with `kvpilot sidecar` beside it.
3. Load: concurrent chat requests sharing a system prompt (prefix caching at work).
4. Observe: the mission metrics and latency read back from the sidecar's Prometheus exposition.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvpilot.planner import KVStrategy, ModelShape, gpu_spec, plan_capacity

# Llama-3-8B's published shape: 32 layers, 32 query heads, 8 KV heads, head dim 128.
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
STRATEGIES: list[tuple[str, KVStrategy]] = [
    ("native bf16 (GQA 8 KV heads)", KVStrategy(attention="native")),
    ("native + int8 KV", KVStrategy(attention="native", kv_cache_dtype="int8")),
    ("native + fp8 KV", KVStrategy(attention="native", kv_cache_dtype="fp8")),
    ("gqa 4 KV heads", KVStrategy(attention="gqa", kv_head_groups=4)),
    ("mla latent 512", KVStrategy(attention="mla", latent_rank=512)),
    ("linear (window 64)", KVStrategy(attention="linear", linear_window=64)),
]
SYSTEM_PROMPT = (
    "You are kvpilot's demo assistant. Answer briefly. The KV cache is the first-class concern: "
    "paged blocks, shared prefixes, and careful capacity planning keep GPUs busy without OOM."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", type=Path, help="where the model and logs go (default: a temp dir)")
    parser.add_argument("--requests", type=int, default=24, help="chat requests to send")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight at once")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--family", default="llama", choices=("llama", "qwen2", "mistral"))
    parser.add_argument("--ready-timeout", type=float, default=300.0, help="seconds to wait for /ready")


def run(args: argparse.Namespace) -> int:
    if args.requests < 1 or args.concurrency < 1:
        print("kvpilot demo: --requests and --concurrency must be at least 1", file=sys.stderr)
        return 2
    print_plans()
    with _workdir(args.workdir) as work:
        return _serve_and_load(args, work)


def print_plans() -> None:
    model = ModelShape.from_hf_config(LLAMA3_8B)
    gpu = gpu_spec("NVIDIA-H200")
    print("== 1. Capacity plan: Llama-3-8B shapes on one NVIDIA H200, 8k-token requests ==")
    print(f"{'strategy':32} {'KV bytes/token':>15} {'per request MiB':>16} {'KV pool GiB':>12} {'max requests':>13}")
    for name, strategy in STRATEGIES:
        plan = plan_capacity(model, strategy, gpu, max_seq_len=8192)
        print(
            f"{name:32} {plan.bytes_per_token:>15,} {plan.per_request_peak_bytes / 2**20:>16.1f} "
            f"{plan.kv_pool_bytes / 2**30:>12.1f} {plan.max_concurrency:>13,}"
        )
    print()


def _serve_and_load(args: argparse.Namespace, work: Path) -> int:
    model_dir = work / "model"
    _run_cli("make-model", str(model_dir), "--family", args.family, "--size", "tiny")
    api_port, stats_port, metrics_port = _free_port(), _free_port(), _free_port()
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    print(f"== 2. Serving a random-weight {args.family} checkpoint (its text is noise) from {model_dir} ==")
    serve = _spawn(
        logs / "serve.log", "serve", "--model", str(model_dir), "--port", str(api_port),
        "--stats-port", str(stats_port), "--max-num-seqs", str(args.concurrency),
        "--strategy-name", "native-demo",
    )
    sidecar = _spawn(
        logs / "sidecar.log", "sidecar", "--engine-url", f"http://127.0.0.1:{stats_port}",
        "--host", "127.0.0.1", "--port", str(metrics_port), "--no-gpu",
    )
    try:
        api = f"http://127.0.0.1:{api_port}"
        if not _wait_ready(f"{api}/ready", serve, args.ready_timeout):
            print(f"kvpilot demo: the engine did not become ready; see {logs / 'serve.log'}", file=sys.stderr)
            return 1
        print(f"engine ready at {api}; sidecar at http://127.0.0.1:{metrics_port}/metrics")
        print(f"\n== 3. {args.requests} chat requests, {args.concurrency} at a time, one shared system prompt ==")
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        results, during = asyncio.run(_load(api, metrics_url, args))
        errors = [r for r in results if isinstance(r, str)]
        for answer in [r for r in results if not isinstance(r, str)][:3]:
            print(f"  {answer['strategy']}: {answer['text']!r}")
        print(f"  {len(results) - len(errors)} succeeded, {len(errors)} failed")
        for error in errors[:3]:
            print(f"  error: {error}")
        print("\n== 4. What the sidecar exports (Prometheus) ==")
        _report(during, _scrape(metrics_url))
        return 0 if not errors else 1
    finally:
        for process in (sidecar, serve):
            process.terminate()
        for process in (sidecar, serve):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


async def _load(api: str, metrics_url: str, args: argparse.Namespace) -> tuple[list, dict]:
    semaphore = asyncio.Semaphore(args.concurrency)
    questions = [f"Question {i}: what does block {i % 5} of the KV cache hold?" for i in range(args.requests)]

    async def one(client: httpx.AsyncClient, question: str) -> dict | str:
        async with semaphore:
            body = {
                "model": "model", "max_tokens": args.max_tokens, "temperature": 0.0,
                "messages": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}],
            }
            response = await client.post(f"{api}/v1/chat/completions", json=body)
            if response.status_code != 200:
                return f"HTTP {response.status_code}: {response.text[:200]}"
            text = response.json()["choices"][0]["message"]["content"]
            return {"text": text, "strategy": response.headers.get("x-model-strategy", "?")}

    async def sample_during(tasks: list[asyncio.Task]) -> dict:
        best: dict = {}
        async with httpx.AsyncClient(timeout=10) as client:
            while not all(t.done() for t in tasks):
                samples = _parse((await client.get(metrics_url)).text)
                if "kvpilot_kv_cache_efficiency" in samples:
                    best = samples
                await asyncio.sleep(0.2)
        return best

    async with httpx.AsyncClient(timeout=120) as client:
        tasks = [asyncio.create_task(one(client, q)) for q in questions]
        during = await sample_during(tasks)
        return list(await asyncio.gather(*tasks)), during


def _scrape(url: str) -> dict[str, float]:
    return _parse(httpx.get(url, timeout=10).text)


def _parse(text: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name
            if sample.labels:
                key += "{" + ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items())) + "}"
            values[key] = sample.value
    return values


def _report(during: dict[str, float], after: dict[str, float]) -> None:
    def show(label: str, value: float | None, fmt: str = "{:.3f}") -> None:
        print(f"  {label:50} {'n/a' if value is None else fmt.format(value)}")

    show("kvpilot_engine_up", after.get("kvpilot_engine_up"), "{:.0f}")
    show("kvpilot_kv_cache_efficiency (sampled under load)", during.get("kvpilot_kv_cache_efficiency"))
    queried = after.get("kvpilot_prefix_cache_queries_total") or after.get("kvpilot_prefix_cache_queried_tokens_total")
    hits = after.get("kvpilot_prefix_cache_hits_total") or after.get("kvpilot_prefix_cache_hit_tokens_total")
    show("prefix cache hit ratio (tokens)", hits / queried if queried and hits is not None else None)
    show("kvpilot_summary_cache_hit_rate", after.get("kvpilot_summary_cache_hit_rate"))
    utilisation = [v for k, v in after.items() if k.startswith("kvpilot_gqa_head_utilization{")]
    show("kvpilot_gqa_head_utilization (mean over heads)",
         sum(utilisation) / len(utilisation) if utilisation else None)
    for name in sorted(after):
        if name.endswith("_count") and "seconds" in name:
            base = name[: -len("_count")]
            p95 = _quantile(after, base, 0.95)
            show(f"{base} p95 (s, from buckets)", p95, "{:.4f}")
    print("  (metrics with no value yet are n/a: the demo model uses native attention)")


def _quantile(samples: dict[str, float], base: str, q: float) -> float | None:
    buckets = sorted(
        (float(key.split('le=')[1].rstrip("}")), value)
        for key, value in samples.items()
        if key.startswith(f"{base}_bucket{{")
    )
    if not buckets or buckets[-1][1] == 0:
        return None
    rank, previous_bound, previous_count = q * buckets[-1][1], 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return previous_bound
            share = (rank - previous_count) / (count - previous_count) if count > previous_count else 1.0
            return previous_bound + (bound - previous_bound) * share
        previous_bound, previous_count = bound, count
    return None


def _run_cli(*argv: str) -> None:
    subprocess.run([sys.executable, "-m", "kvpilot.cli", *argv], check=True, stdout=subprocess.DEVNULL)


def _spawn(log_path: Path, *argv: str) -> subprocess.Popen:
    log = log_path.open("w")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "kvpilot.cli", *argv], stdout=log, stderr=subprocess.STDOUT, env=env
    )


def _wait_ready(url: str, process: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return True
        time.sleep(0.5)
    return False


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def _workdir(path: Path | None) -> Iterator[Path]:
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="kvpilot-demo-") as tmp:
        yield Path(tmp)
