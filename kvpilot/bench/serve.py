"""`kvpilot bench serve`: a Poisson load generator against an OpenAI-compatible `/v1/completions`.

Each request streams (`stream: true`, usage in the last chunk where the server gives it) with
`ignore_eos` so it generates exactly `max_tokens`. Per request: TTFT (send -> first token chunk),
ITL (gaps between token chunks; a chunk carries every token the server made since the
last one the client read, so a loaded client sees fewer, larger chunks), TPOT ((latency - TTFT) / (output tokens - 1)) and latency; per
rate: their percentiles and request / output-token throughput, as `vllm bench serve` reports.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from kvpilot.bench.workload import BenchRequest, poisson_arrivals, summarize

TPOT_SLO_MS = 50.0  # the serving target: the highest rate whose P95 TPOT stays under this


@dataclass
class RequestResult:
    """What one streamed request measured (seconds); `error` set when it failed."""

    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    chunks: int = 0  # token-bearing stream chunks; the server merges deltas a slow reader has not taken yet
    error: str | None = None

    @property
    def tpot(self) -> float | None:
        return (self.latency - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None


async def send(client: Any, url: str, model: str, req: BenchRequest, headers: dict[str, str]) -> RequestResult:
    """Stream one completion; time its chunks."""
    body = {"model": model, "prompt": req.prompt, "max_tokens": req.max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    result = RequestResult()
    start = last = time.perf_counter()
    chunks = 0
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                result.error = f"HTTP {response.status_code}: {text[:200]}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if event.get("usage"):
                    result.output_tokens = int(event["usage"].get("completion_tokens") or 0)
                if not any(c.get("text") for c in event.get("choices") or []):
                    continue
                now = time.perf_counter()
                if chunks == 0:
                    result.ttft = now - start
                else:
                    result.itl.append(now - last)
                last, chunks = now, chunks + 1
    except Exception as exc:  # a benchmark reports a failed request and goes on
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.latency = time.perf_counter() - start
    result.output_tokens = result.output_tokens or chunks
    result.chunks = chunks
    if chunks == 0:
        result.error = "no token chunk in the stream"
    return result


async def run_rate(
    base_url: str, model: str, requests: list[BenchRequest], rate: float, *, seed: int = 0,
    max_concurrency: int | None = None, api_key: str | None = None, progress: bool = True, timeout: float = 600.0,
) -> dict[str, Any]:  # fmt: skip
    """Send `requests` at Poisson times of `rate` per second; return the summary record."""
    import httpx
    from tqdm import tqdm

    url = base_url.rstrip("/") + "/v1/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    times = poisson_arrivals(len(requests), rate, seed)
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    limits = httpx.Limits(max_connections=max_concurrency or len(requests), max_keepalive_connections=None)
    bar = tqdm(total=len(requests), desc=f"rate {rate:g}/s", unit="req", disable=not progress)

    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        start = time.perf_counter()

        async def one(req: BenchRequest, at: float) -> RequestResult:
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            if limit is None:
                result = await send(client, url, model, req, headers)
            else:
                async with limit:
                    result = await send(client, url, model, req, headers)
            bar.update(1)
            return result

        results = await asyncio.gather(*(one(r, t) for r, t in zip(requests, times, strict=True)))
        duration = time.perf_counter() - start
    bar.close()
    return rate_summary(rate, results, duration)


def rate_summary(rate: float, results: list[RequestResult], duration: float) -> dict[str, Any]:
    """Percentiles in milliseconds, throughput per second, failures counted and the first named."""
    ok = [r for r in results if r.error is None]
    failed = [r for r in results if r.error is not None]
    ms = lambda xs: {k: round(v * 1e3, 2) for k, v in summarize(xs).items()}  # noqa: E731
    out_tokens = sum(r.output_tokens for r in ok)
    return {
        "request_rate": rate if rate != float("inf") else "inf",
        "completed": len(ok),
        "failed": len(failed),
        "first_error": failed[0].error if failed else None,
        "duration_s": round(duration, 3),
        "request_throughput": round(len(ok) / duration, 3),
        "output_tok_s": round(out_tokens / duration, 1),
        "ttft_ms": ms([r.ttft for r in ok]),
        "tpot_ms": ms([r.tpot for r in ok if r.tpot is not None]),
        "itl_ms": ms([gap for r in ok for gap in r.itl]),
        "stream_chunks": sum(r.chunks for r in ok),  # ITL has stream_chunks - completed gaps (NaN when 0)
        "latency_ms": ms([r.latency for r in ok]),
    }


def _rate(summary: dict[str, Any]) -> float:
    return float("inf") if summary["request_rate"] == "inf" else float(summary["request_rate"])


def highest_rate_within_slo(summaries: list[dict[str, Any]], tpot_p95_ms: float = TPOT_SLO_MS) -> dict | None:
    """The summary of the highest rate (inf, every request at once, above any finite one) with no
    failures whose P95 TPOT is under the bound."""
    good = [s for s in summaries if not s["failed"] and s["tpot_ms"]["p95"] < tpot_p95_ms]
    return max(good, key=_rate) if good else None


def slo_line(summaries: list[dict[str, Any]], tpot_p95_ms: float = TPOT_SLO_MS) -> str:
    """The summary's last human line: the highest rate within the bound, or why each tested rate missed it."""
    head = f"highest rate with P95 TPOT < {tpot_p95_ms:g} ms: "
    best = highest_rate_within_slo(summaries, tpot_p95_ms)
    if best is not None:
        rate = "inf (all at once)" if best["request_rate"] == "inf" else f"{best['request_rate']:g}/s"
        return head + f"{rate} (TTFT p95 {best['ttft_ms']['p95']:.1f} ms)"
    if not summaries:
        return head + "no rate tested"

    def missed(s: dict[str, Any]) -> str:
        rate = "inf" if s["request_rate"] == "inf" else f"{s['request_rate']:g}/s"
        if s["failed"]:
            return f"{rate}: {s['failed']} failed"
        return f"{rate}: P95 TPOT {s['tpot_ms']['p95']:.1f} ms"

    return head + f"none of the {len(summaries)} tested ({'; '.join(missed(s) for s in summaries)})"
