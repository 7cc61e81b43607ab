"""How a large prompt affects `/health` on a running `kvpilot serve` (issue 22, finding 1).

Starts `kvpilot serve` on a tiny CPU checkpoint (the PYTHONPATH decides which tree runs), sends
each prompt size once while another process polls `/health` every 20 ms (bench/health_poll.py), and prints the status,
the request's time and the slowest `/health` answer. Not a test: figures go to docs/reliability.md.

    PYTHONPATH=$PWD python bench/bench_big_prompt_health.py --model /tmp/tiny-llama
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.health_poll import HealthWatch, wait_ready


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _probe(base: str, body: bytes) -> tuple[int, float, float, int]:
    with HealthWatch(base) as watch:
        start = time.monotonic()
        response = httpx.post(base + "/v1/completions", content=body, headers={"content-type": "application/json"},
                              timeout=600)  # fmt: skip
        elapsed = time.monotonic() - start
    return response.status_code, elapsed, watch.worst, len(watch.latencies)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--sizes-mb", default="0.6,2.4,10", help="prompt sizes in MB (comma separated)")
    args = parser.parse_args()
    port, stats = _port(), _port()
    cmd = [sys.executable, "-m", "kvpilot.cli", "serve", "--model", str(args.model), "--port", str(port),
           "--stats-port", str(stats), "--max-model-len", "256", "--cpu-memory-budget", "16MiB",
           "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, 1200)
        print("| prompt | body bytes | status | request s | slowest /health s | /health answers |")
        print("|---|---|---|---|---|---|")
        for mb in (float(x) for x in args.sizes_mb.split(",")):
            prompt = "hello world " * int(mb * 1e6 / 12)
            body = json.dumps({"model": args.model.name, "prompt": prompt, "max_tokens": 1}).encode()
            status, elapsed, slowest, answers = _probe(base, body)
            print(f"| {mb:g} MB | {len(body)} | {status} | {elapsed:.2f} | {slowest:.3f} | {answers} |", flush=True)
    finally:
        proc.terminate()
        proc.wait(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
