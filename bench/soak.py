"""Soak: one `kvpilot serve` held at 2x its admission capacity for a long time (issue 22).

Starts `kvpilot serve` on a tiny CPU checkpoint (the PYTHONPATH decides which tree runs) with a
small admission capacity (`--max-num-seqs` running + `--max-queue` waiting), then keeps twice
that many clients busy with a mix of full streams, streams dropped after a few chunks, scores and
non-streamed completions sent twice with one `Idempotency-Key` (the retry must get the same
answer). A poller times `/health` every 100 ms. Every `--sample-s` it prints one JSON line: the
requests by status, 5xx so far, resident memory of the server, KV blocks in use, `/health` P99 in
that interval. At the end the load stops, the server goes idle and the summary checks what the
issue asks: zero 5xx, zero leaked blocks, RSS flat within 10% after warm-up, `/health` P99
under 100 ms in every interval. Not a test: figures go to docs/reliability.md.

    PYTHONPATH=$PWD python bench/soak.py --model /tmp/tiny-llama --minutes 30
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

MODEL = "tiny-llama"


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _p99(values: list[float]) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


class Soak:
    """The load, the counters and the samples of one run."""

    def __init__(self, base: str, stats_url: str, pid: int, seed: int) -> None:
        self.base, self.stats_url, self.pid = base, stats_url, pid
        self.rng = random.Random(seed)
        self.statuses: collections.Counter[str] = collections.Counter()
        self.fivexx: list[str] = []
        self.mismatched_retries = 0
        self.health_ms: list[float] = []
        self.stop = asyncio.Event()
        self.backoff = False

    def _count(self, kind: str, status: int, detail: str = "") -> None:
        self.statuses[f"{kind}:{status}"] += 1
        self.backoff = status == 429
        if status >= 500:
            self.fivexx.append(f"{kind} {status} {detail[:200]}")

    def _prompt(self) -> str:
        return " ".join(self.rng.choice(["the", "cat", "sat", "on", "a", "mat", "and", "sang"])
                        for _ in range(self.rng.randint(3, 40)))

    async def _stream(self, client: httpx.AsyncClient, drop_after: int | None) -> None:
        body = {"model": MODEL, "prompt": self._prompt(), "max_tokens": self.rng.randint(8, 48), "stream": True}
        async with client.stream("POST", self.base + "/v1/completions", json=body) as response:
            if response.status_code != 200:
                self._count("stream", response.status_code, (await response.aread()).decode(errors="replace"))
                return
            chunks = 0
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    chunks += 1
                    if '"error"' in line:
                        self._count("stream-error-event", 500, line)
                        return
                if drop_after is not None and chunks >= drop_after:
                    self._count("stream-dropped", 200)
                    return  # leaving the block closes the connection mid-stream
            self._count("stream", 200)

    async def _score(self, client: httpx.AsyncClient) -> None:
        body = {"model": MODEL, "prompt": self._prompt(), "continuation": " the mat"}
        response = await client.post(self.base + "/v1/score", json=body)
        self._count("score", response.status_code, response.text)

    async def _idempotent(self, client: httpx.AsyncClient) -> None:
        body = {"model": MODEL, "prompt": self._prompt(), "max_tokens": 16, "temperature": 1.0}
        headers = {"Idempotency-Key": uuid.uuid4().hex}
        first = await client.post(self.base + "/v1/completions", json=body, headers=headers)
        self._count("idem", first.status_code, first.text)
        if first.status_code != 200:
            return
        retry = await client.post(self.base + "/v1/completions", json=body, headers=headers)
        self._count("idem-retry", retry.status_code, retry.text)
        if retry.status_code == 200 and retry.json()["choices"] != first.json()["choices"]:
            self.mismatched_retries += 1

    async def client_loop(self) -> None:
        async with httpx.AsyncClient(timeout=120) as client:
            while not self.stop.is_set():
                pick = self.rng.random()
                try:
                    if pick < 0.4:
                        await self._stream(client, None)
                    elif pick < 0.6:
                        await self._stream(client, self.rng.randint(1, 4))
                    elif pick < 0.8:
                        await self._score(client)
                    else:
                        await self._idempotent(client)
                except httpx.HTTPError as exc:
                    self._count("transport", 0, repr(exc))
                if self.backoff:  # a 429 says Retry-After: 1; clients come back within it, spread out
                    self.backoff = False
                    await asyncio.sleep(self.rng.uniform(0.1, 1.0))

    async def health_loop(self) -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            while not self.stop.is_set():
                start = time.monotonic()
                response = await client.get(self.base + "/health")
                self.health_ms.append((time.monotonic() - start) * 1000)
                if response.status_code != 200:
                    self._count("health", response.status_code, response.text)
                await asyncio.sleep(0.1)

    async def stats(self) -> dict:
        async with httpx.AsyncClient(timeout=30) as client:
            return (await client.get(self.stats_url)).json()


async def run(args: argparse.Namespace, base: str, stats_url: str, pid: int) -> dict:
    soak = Soak(base, stats_url, pid, args.seed)
    capacity = args.max_num_seqs + args.max_queue
    tasks = [asyncio.create_task(soak.client_loop()) for _ in range(2 * capacity)]
    tasks.append(asyncio.create_task(soak.health_loop()))
    samples = []
    began = time.monotonic()
    while time.monotonic() - began < args.minutes * 60:
        await asyncio.sleep(args.sample_s)
        stats = await soak.stats()
        health, soak.health_ms = soak.health_ms, []
        sample = {"t_s": round(time.monotonic() - began), "rss_mib": round(_rss_mib(pid), 1),
                  "blocks_used": stats["kv"]["blocks_used"], "health_p99_ms": round(_p99(health), 1),
                  "health_max_ms": round(max(health, default=float("nan")), 1), "fivexx": len(soak.fivexx),
                  "requests": dict(soak.statuses)}
        samples.append(sample)
        print(json.dumps(sample), flush=True)
    soak.stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 300)
    idle: dict = {}
    for _ in range(100):  # dropped streams are aborted within a step or two; wait for idle
        idle = await soak.stats()
        if idle["requests"]["running"] == 0 and idle["requests"]["waiting"] == 0 and idle["kv"]["blocks_used"] == 0:
            break
        await asyncio.sleep(0.1)
    warm = [s["rss_mib"] for s in samples[max(1, len(samples) // 5):]] or [s["rss_mib"] for s in samples]
    return {
        "minutes": args.minutes, "clients": 2 * capacity, "admission_capacity": capacity,
        "requests": dict(soak.statuses), "fivexx": len(soak.fivexx), "fivexx_examples": soak.fivexx[:5],
        "mismatched_idempotent_retries": soak.mismatched_retries,
        "leaked_blocks_at_idle": idle["kv"]["blocks_used"],
        "running_at_idle": idle["requests"]["running"], "waiting_at_idle": idle["requests"]["waiting"],
        "rss_after_warmup_mib": {"min": min(warm), "max": max(warm), "spread_pct": round(100 * (max(warm) - min(warm)) / min(warm), 1)},
        "health_p99_ms_worst_interval": max(s["health_p99_ms"] for s in samples),
        "health_max_ms": max(s["health_max_ms"] for s in samples),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--sample-s", type=float, default=30.0)
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--max-queue", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    port, stats_port = _port(), _port()
    cmd = [sys.executable, "-m", "kvpilot.cli", "serve", "--model", str(args.model), "--served-model-name", MODEL,
           "--port", str(port), "--stats-port", str(stats_port), "--log-level", "warning",
           "--max-model-len", "256", "--max-num-seqs", str(args.max_num_seqs), "--max-queue", str(args.max_queue),
           "--max-concurrent-scores", "2", "--cpu-memory-budget", "16MiB", "--max-num-batched-tokens", "512"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen(cmd, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(base + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"kvpilot serve did not become ready (exit {server.poll()})")
            time.sleep(0.2)
        summary = asyncio.run(run(args, base, f"http://127.0.0.1:{stats_port}/stats", server.pid))
    finally:
        server.terminate()
        server.wait(60)
    summary["ok"] = (summary["fivexx"] == 0 and summary["leaked_blocks_at_idle"] == 0
                     and summary["rss_after_warmup_mib"]["spread_pct"] <= 10
                     and summary["health_p99_ms_worst_interval"] < 100 and summary["mismatched_idempotent_retries"] == 0)
    print(json.dumps({"summary": summary}, indent=2))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
