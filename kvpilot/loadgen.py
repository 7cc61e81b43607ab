"""A steady-rate load generator for the OpenAI-compatible API (tests and `kvpilot demo`).

    gen = LoadGenerator("http://127.0.0.1:8080", rate_per_s=20, stream_share=0.5)
    outcomes = asyncio.run(gen.run(requests=200))       # or run(duration_s=30), or:
    with gen.background() as load:                      # a thread; load.outcomes grows live
        ...
    summarise(outcomes)                                 # {"requests": .., "failed": .., "by_upstream": {..}}

Open loop: request i is sent at start + i / rate whatever the previous ones are doing (up to
`max_in_flight` outstanding), half of them streaming by default. Each `Outcome` records the HTTP
status, whether it completed (a stream must end with `data: [DONE]` and carry no error event),
the latency, and who served it: the local gateway's `X-Kvpilot-Upstream` (the pod's ip:port)
and the engine's `X-Model-Strategy`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import httpx

UPSTREAM_HEADER = "X-Kvpilot-Upstream"
STRATEGY_HEADER = "X-Model-Strategy"
PROMPTS = ("Explain paged attention in one sentence.", "What is a KV cache?", "Name three GPU memory costs.",
           "Why does GQA save memory?", "Summarise int8 KV quantisation.", "What does a canary release do?")


@dataclass(frozen=True)
class Outcome:
    """One request: when it was sent (seconds after the run began), how it ended, who served it."""

    index: int
    sent_s: float
    latency_s: float
    status: int | None
    ok: bool
    streaming: bool
    upstream: str
    strategy: str
    pinned: str | None
    error: str = ""


@dataclass
class LoadGenerator:
    """Chat completions at a steady rate against `url` (a gateway or an engine)."""

    url: str
    rate_per_s: float = 10.0
    stream_share: float = 0.5
    max_tokens: int = 8
    pin: str | None = None
    header: str = STRATEGY_HEADER
    timeout_s: float = 60.0
    max_in_flight: int = 64
    prompts: Sequence[str] = PROMPTS
    model: str | None = None  # default: the first id of GET /v1/models
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.rate_per_s <= 0:
            raise ValueError(f"rate_per_s must be > 0, got {self.rate_per_s}")
        if not 0.0 <= self.stream_share <= 1.0:
            raise ValueError(f"stream_share is a share of requests (0-1), got {self.stream_share}")
        self._stop = threading.Event()

    async def run(self, requests: int | None = None, duration_s: float | None = None) -> list[Outcome]:
        """Send until `requests` were sent, `duration_s` passed or `stop()`; wait for all to end."""
        if requests is None and duration_s is None:
            raise ValueError("give requests=N or duration_s=S (or both)")
        began = time.monotonic()
        slots = asyncio.Semaphore(self.max_in_flight)
        tasks = []
        limits = httpx.Limits(max_connections=self.max_in_flight, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=self.url, timeout=self.timeout_s, limits=limits) as client:
            if self.model is None:
                self.model = await served_model(client, self.header, self.pin)
            i = 0
            while not self._stop.is_set() and (requests is None or i < requests):
                due = began + i / self.rate_per_s
                if duration_s is not None and due - began >= duration_s:
                    break
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                await slots.acquire()
                tasks.append(asyncio.create_task(self._one(client, i, began, slots)))
                i += 1
            await asyncio.gather(*tasks)
        return self.outcomes

    def stop(self) -> None:
        self._stop.set()

    @contextlib.contextmanager
    def background(self, duration_s: float = 24 * 3600.0) -> Iterator[LoadGenerator]:
        """Run in a thread until the block ends (then stop and wait for outstanding requests)."""
        thread = threading.Thread(target=lambda: asyncio.run(self.run(duration_s=duration_s)), daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.stop()
            thread.join(self.timeout_s + 10)

    async def _one(self, client: httpx.AsyncClient, i: int, began: float, slots: asyncio.Semaphore) -> None:
        streaming = int((i + 1) * self.stream_share) > int(i * self.stream_share)  # evenly spread
        body = {"model": self.model, "max_tokens": self.max_tokens, "stream": streaming, "temperature": 0,
                "messages": [{"role": "user", "content": self.prompts[i % len(self.prompts)]}]}
        headers = {self.header: self.pin} if self.pin else {}
        sent = time.monotonic()
        status, upstream, strategy, error = None, "", "", ""
        try:
            async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
                status = response.status_code
                upstream = response.headers.get(UPSTREAM_HEADER, "")
                strategy = response.headers.get(STRATEGY_HEADER, "")
                text = "".join([chunk async for chunk in response.aiter_text()])
                error = _error_in(status, text, streaming)
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
        finally:
            slots.release()
        self.outcomes.append(Outcome(i, sent - began, time.monotonic() - sent, status, not error, streaming,
                                     upstream, strategy, self.pin, error))


async def served_model(client: httpx.AsyncClient, header: str = STRATEGY_HEADER, pin: str | None = None,
                       attempts: int = 20) -> str:
    """The model id the engines serve (GET /v1/models), retried while the backends come up."""
    last = ""
    for _ in range(attempts):
        try:
            response = await client.get("/v1/models", headers={header: pin} if pin else {})
            if response.status_code == 200:
                return str(response.json()["data"][0]["id"])
            last = f"HTTP {response.status_code}: {response.text[:200]}"
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            last = str(exc)
        await asyncio.sleep(0.5)
    raise RuntimeError(f"GET {client.base_url}/v1/models never answered with a model: {last}")


def _error_in(status: int, text: str, streaming: bool) -> str:
    if status != 200:
        return f"HTTP {status}: {text[:200]}"
    if not streaming:
        try:
            json.loads(text)["choices"][0]
        except (ValueError, KeyError, IndexError):
            return f"malformed completion: {text[:200]}"
        return ""
    events = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
    if not events or events[-1] != "[DONE]":
        return f"stream ended without [DONE]: {text[-200:]}"
    for event in events[:-1]:
        try:
            if "error" in json.loads(event):
                return f"error event in stream: {event[:200]}"
        except ValueError:
            return f"malformed stream event: {event[:200]}"
    return ""


def summarise(outcomes: Sequence[Outcome]) -> dict[str, object]:
    """Counts a test or the demo prints: total, failed, streamed, and requests per upstream/strategy."""
    latencies = sorted(o.latency_s for o in outcomes if o.ok)
    return {
        "requests": len(outcomes),
        "failed": sum(not o.ok for o in outcomes),
        "streaming": sum(o.streaming for o in outcomes),
        "by_upstream": dict(Counter(o.upstream for o in outcomes if o.ok)),
        "by_strategy": dict(Counter(o.strategy for o in outcomes if o.ok)),
        "p50_s": latencies[len(latencies) // 2] if latencies else None,
        "p95_s": latencies[int(len(latencies) * 0.95)] if latencies else None,
    }
