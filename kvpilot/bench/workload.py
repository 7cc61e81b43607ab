"""The benchmark workloads as data: random requests, Poisson arrival times, percentile summaries (pure)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

# nano-vllm's and mini-SGLang's published offline workload: 256 requests, input and output
# lengths uniform in [100, 1024], random token ids below 10000, EOS ignored.
DEFAULT_NUM_REQUESTS = 256
DEFAULT_LENGTHS = (100, 1024)
TOKEN_ID_LIMIT = 10000
FIRST_TOKEN_ID = 3  # the ids below are special in kvpilot's random checkpoints (bos, eos, pad)


@dataclass(frozen=True)
class BenchRequest:
    """One request of a workload: its prompt token ids and how many tokens it generates."""

    prompt: list[int]
    max_tokens: int


def parse_range(text: str) -> tuple[int, int]:
    """`100:1024` -> (100, 1024); `512` -> (512, 512)."""
    low, _, high = text.partition(":")
    try:
        lo, hi = int(low), int(high or low)
    except ValueError:
        raise ValueError(f"{text!r} is not a length range; write LOW:HIGH (e.g. 100:1024) or one number") from None
    if not 1 <= lo <= hi:
        raise ValueError(f"length range {text!r} needs 1 <= LOW <= HIGH")
    return lo, hi


def random_requests(
    num: int, input_lens: tuple[int, int], output_lens: tuple[int, int], vocab_size: int, seed: int = 0
) -> list[BenchRequest]:
    """`num` requests with lengths uniform in the (inclusive) ranges and random token ids."""
    if num < 1:
        raise ValueError(f"the number of requests must be >= 1, got {num}")
    top = min(vocab_size, TOKEN_ID_LIMIT) - 1
    if top < FIRST_TOKEN_ID:
        raise ValueError(f"vocab_size {vocab_size} is too small for random prompts (needs > {FIRST_TOKEN_ID + 1})")
    rng = random.Random(seed)
    out = []
    for _ in range(num):
        n = rng.randint(*input_lens)
        prompt = [rng.randint(FIRST_TOKEN_ID, top) for _ in range(n)]
        out.append(BenchRequest(prompt, rng.randint(*output_lens)))
    return out


def poisson_arrivals(num: int, rate: float, seed: int = 0) -> list[float]:
    """Send times (seconds from the start) of `num` requests arriving at `rate` per second (inf: all at 0)."""
    if not rate > 0:
        raise ValueError(f"a request rate must be > 0 (inf: all at once), got {rate}")
    if math.isinf(rate):
        return [0.0] * num
    rng = random.Random(seed)
    t, times = 0.0, []
    for _ in range(num):
        times.append(t)
        t += rng.expovariate(rate)
    return times


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation, as numpy's default."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(values: list[float], percentiles: tuple[float, ...] = (50, 90, 95, 99)) -> dict[str, float]:
    """mean and percentiles (keys `mean`, `p50`, ...) of a list; NaN where it is empty."""
    out = {"mean": sum(values) / len(values) if values else float("nan")}
    for q in percentiles:
        out[f"p{q:g}"] = percentile(values, q)
    return out
