"""Issue 33's attacks against a running `kvpilot serve`, with `/health` timed every 20 ms meanwhile.

Starts `kvpilot serve` on a tiny CPU checkpoint (the PYTHONPATH decides which tree runs), sends each
attack of issue 33 once, and prints per attack: what the server answered, how long the attack
took, and the slowest and 99th-percentile `/health` answer while it ran. Not a test (timing on a
shared machine is no assertion): the figures go to docs/reliability.md.

    kvpilot make-model /tmp/tiny-llama --family llama --size tiny
    PYTHONPATH=$PWD python bench/bench_reliability_attacks.py --model /tmp/tiny-llama
    PYTHONPATH=$PWD python bench/bench_reliability_attacks.py --model /tmp/tiny-llama --only 8 --nofile 64 --log /tmp/s.log

Run it from the repository root: the server starts with `python -m kvpilot.cli`, which imports the
tree in the current directory first.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.health_poll import HealthWatch, wait_ready

MODEL = "tiny-llama"


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _post(base: str, path: str, body: Any, timeout: float = 600) -> str:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()  # big bodies come pre-encoded
    response = httpx.post(base + path, content=content, headers={"content-type": "application/json"}, timeout=timeout)
    code = response.json().get("error", {}).get("code") if response.status_code != 200 else ""
    return f"{response.status_code} {code or ''}".strip()


def _parallel(*calls: Callable[[], str]) -> str:
    out: list[str] = [""] * len(calls)
    threads = [threading.Thread(target=lambda i=i, c=c: out.__setitem__(i, c())) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(900)
    return ", ".join(sorted(set(out), key=out.index)) + f" (x{len(out)})" if len(set(out)) == 1 else ", ".join(out)


def _raw(port: int, data: bytes) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        with contextlib.suppress(OSError):  # the server answered and closed while the body went out
            sock.sendall(data)
        answer = sock.recv(200)
    return answer.split(b"\r\n", 1)[0].decode(errors="replace")


def _nested(depth: int) -> str:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return json.dumps(schema)


def _enum(k: int, n: int) -> dict[str, Any]:
    return {"enum": [f"v{k}-{i}" for i in range(n)]}


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _idle_connections(port: int, count: int, half: bytes) -> str:
    socks = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(count)]
    for i, sock in enumerate(socks):
        if i % 2:
            sock.sendall(half)
    started = time.monotonic()
    closed = 0
    for sock in socks:
        sock.settimeout(max(0.1, 15 - (time.monotonic() - started)))
        with contextlib.suppress(OSError):  # a timeout: the server kept it open
            sock.recv(100)  # an answer (408) or EOF: the server closed it
            closed += 1
        sock.close()
    return f"{closed}/{count} closed by the server after {time.monotonic() - started:.1f} s"


def attacks(base: str, port: int, pid: int) -> list[tuple[str, Callable[[], str]]]:
    plain = {"model": MODEL, "prompt": "hi", "max_tokens": 4}

    def grammar_cache() -> str:
        before = _rss_mib(pid)
        results = [_post(base, "/v1/completions", {**plain, "guided_json": {"enum": [f"v{k}-{i}" for i in range(9000)]}})
                   for k in range(16)]  # fmt: skip
        return f"{', '.join(sorted(set(results)))}; RSS {before:.0f} -> {_rss_mib(pid):.0f} MiB"

    def compile_bombs() -> str:
        times: list[float] = []

        def timed_plain() -> str:
            time.sleep(0.2)
            start = time.monotonic()
            status = _post(base, "/v1/completions", plain)
            times.append(time.monotonic() - start)
            return status

        bombs = [lambda d=d: _post(base, "/v1/completions", {**plain, "guided_json": _nested(d)}) for d in (300, 301)]
        answer = _parallel(*bombs, timed_plain)
        return f"{answer}; the plain completion took {times[0]:.2f} s"

    chunked = b"".join(b"%x\r\n%s\r\n" % (65536, b"x" * 65536) for _ in range(1024)) + b"0\r\n\r\n"  # 64 MiB
    smuggle = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 10\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n") + chunked  # fmt: skip
    stops = json.dumps({**plain, "max_tokens": 200, "stop": [f"{i:x}" for i in range(800_000)]}).encode()
    words = json.dumps({"prompt": "word " * 1_580_000}).encode()
    messages = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": ""}] * 200_000}).encode()
    enums = [json.dumps({**plain, "guided_json": _enum(k, 50_000)}).encode() for k in range(16)]  # 0.6 MB each
    half = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Len"
    return [
        ("1. 16 distinct 9,000-value enums (guided_json)", grammar_cache),
        ("1b. 16 distinct 50,000-value enums (guided_json)", lambda: _parallel(*[
            lambda e=e: _post(base, "/v1/completions", e) for e in enums])),
        ("2. 800k stop strings (7.6 MB), max_tokens 200", lambda: _post(base, "/v1/completions", stops)),
        ("3. Content-Length 10 + chunked 64 MiB body", lambda: _raw(port, smuggle)),
        ("4. two 300-deep nested-array schemas + a plain completion", compile_bombs),
        ("5. 6 parallel 7.9 MB /tokenize", lambda: _parallel(*[lambda: _post(base, "/tokenize", words)] * 6)),
        ("6. 200k empty messages", lambda: _post(base, "/v1/chat/completions", messages)),
        ("7. 4 x best_of 128 x 2 prompts", lambda: _parallel(*[
            lambda: _post(base, "/v1/completions", {**plain, "prompt": ["a", "b"], "best_of": 128, "max_tokens": 8})
            for _ in range(4)])),
        ("8. 200 idle / half-sent connections", lambda: _idle_connections(port, 200, half)),
        ("12. logit_bias key '\u00b2'", lambda: _post(base, "/v1/completions", {**plain, "logit_bias": {"\u00b2": 1}})),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--only", help="comma-separated attack numbers to run (default: all)")
    parser.add_argument("--nofile", type=int, help="run the server under this open-files limit (soft and hard)")
    parser.add_argument("--log", type=Path, help="write the server's output here (its size is printed at the end)")
    args = parser.parse_args()
    port, stats = _port(), _port()
    cmd = [sys.executable, "-m", "kvpilot.cli", "serve", "--model", str(args.model), "--served-model-name", MODEL,
           "--port", str(port), "--stats-port", str(stats), "--max-model-len", "256", "--max-num-seqs", "16",
           "--cpu-memory-budget", "16MiB", "--log-level", "warning"]  # fmt: skip
    limit = None if args.nofile is None else (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile,) * 2))
    log = open(args.log, "wb") if args.log else subprocess.DEVNULL  # noqa: SIM115 - the process's lifetime
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=limit,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, 600)
        _post(base, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2, "guided_regex": "[a-z]+"})
        only = set(args.only.split(",")) if args.only else None
        print("| attack | answer | attack s | /health max ms | /health p99 ms | /health answers |")
        print("|---|---|---|---|---|---|")
        for name, attack in attacks(base, port, proc.pid):
            if only and name.split(".")[0] not in only:  # "1", "1b", ...
                continue
            with HealthWatch(base) as watch:
                start = time.monotonic()
                answer = attack()
                took = time.monotonic() - start
            bad = sum(1 for s in watch.statuses if s != 200)
            print(f"| {name} | {answer} | {took:.2f} | {1000 * watch.worst:.0f} | {1000 * watch.p99:.0f} | "
                  f"{len(watch.latencies)}{f' ({bad} not 200)' if bad else ''} |", flush=True)  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(60)
        if args.log:
            text = args.log.read_text(errors="replace")
            print(f"server log: {len(text)} bytes, {text.count('Traceback')} tracebacks")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
