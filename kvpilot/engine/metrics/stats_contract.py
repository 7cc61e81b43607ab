"""The engine's stats feed (`GET 127.0.0.1:8001/stats`, JSON): the contract between engine and sidecar.

Torch-free on purpose: the sidecar imports this module and nothing else of the engine.
The engine computes every value; the sidecar only renames and exports. Counters are
cumulative since `engine.start_time_seconds`; a new `engine.instance_id` means the engine
restarted and counters began again.

Shape (every key below is always present; values that do not apply yet are null or 0)::

    {
      "schema_version": 1,
      "taken_at_seconds": float,  # Unix time the snapshot was taken on the engine thread  } added by
      "age_seconds": float,       # seconds since then, when served: > 0 means the engine } the API
                                  # thread was busy and the last snapshot was served       } server
      "engine": {"instance_id": str, "model": str, "strategy": str, "device": "cpu"|"cuda",
                 "start_time_seconds": float, "ready": bool, "kv_cache_dtype": str,
                 "mla": {"mode": "off"|"native"|"converted", "latent_width": int|null,
                         "absorbed_decode": bool, "latent_rank": int|null,
                         "reconstruction_error": float|null,      # mean over layers, relative
                         "reconstruction_error_max": float|null,  # Frobenius of the K/V SVD (converted)
                         "reconstruction_error_k": float|null, "reconstruction_error_v": float|null}},
      "kv": {"block_size": int, "bytes_per_block": int, "blocks_total": int, "blocks_free": int,
             "blocks_used": int, "blocks_cached": int,
             "live_token_slots": int,        # tokens whose K/V are stored for live sequences
             "allocated_token_slots": int,   # blocks held by live sequences x block_size
             "efficiency": float|null,       # live / allocated (bytes ratio), null with no live seq
             "live_token_seconds_total": float,       # live / allocated token slots integrated over
             "allocated_token_seconds_total": float,  # engine time (counters; see kv_time.py)
             "sequences_by_dtype": {dtype: int}},  # running sequences per KV cache dtype (auto switching)
      "prefix_cache": {"queried_tokens_total": int, "hit_tokens_total": int},
      "memory_bytes": {"weights": int, "kv_pool": int, "kv_used": int, "activation_peak": int,
                       "torch_reserved": int, "torch_allocated": int},
      "requests": {"running": int, "waiting": int, "finished_total": int, "aborted_total": int,
                   "rejected_total": {reason: int}, "preemptions_total": int,
                   "prompt_tokens_total": int, "generation_tokens_total": int,
                   "oom_events_total": int, "max_concurrency": int,
                   "failed_total": {reason: int}},  # ended in an error after admission; added by
                                                    # the API server (absent from LLMEngine.stats())
      "detokenizer": {"decoded_tokens_total": int,  # token ids the API server's detokeniser decoded
                      "output_tokens_total": int},  # token ids it turned into text (added by the
                                                    # API server; decoded/output stays ~constant)
      "latency": {"ttft_seconds": HIST, "tpot_seconds": HIST, "e2e_seconds": HIST},
      "vllm": {"ttft_seconds": HIST, "inter_token_seconds": HIST,  # on vLLM's bucket bounds
               "e2e_seconds": HIST,                                # (VLLM_BUCKETS_SECONDS), for
               "finished_total": {reason: int}},                   # the API port's vllm: names;
                                                                   # reason: stop | length | abort
      "linear": {"summary_hits_total": int, "summary_misses_total": int},
      "gqa_head_utilization": [{"layer": int, "kv_head": int, "value": float}],
      "validation": {"checks_total": int,
                     "fallbacks_total": {strategy: {reason: int}},  # sequences moved to the exact path
                     "unrecovered_total": {strategy: int},  # failed a check with no exact path: served on
                     "last_cosine": float|null, "checks_skipped_total": int,
                     "reserve": {"blocks_total": int,   # the fallback reserve's exact-path blocks (0: none)
                                 "blocks_used": int, "sequences": int,  # sequences holding reserve blocks
                                 "full_total": int}}    # fallbacks that found it full (preempted, waited)
    }

HIST is a cumulative histogram over the fixed bucket bounds in LATENCY_BUCKETS_SECONDS (those under
"vllm": over VLLM_BUCKETS_SECONDS[key]):
``{"buckets": [count_le_b0, count_le_b1, ..., count_le_inf], "sum": float, "count": int}``
with ``len(buckets) == len(LATENCY_BUCKETS_SECONDS) + 1`` and the last entry equal to count.
"""

from __future__ import annotations

from typing import Any, TypedDict

SCHEMA_VERSION = 1
STATS_PATH = "/stats"
DEFAULT_STATS_PORT = 8001

LATENCY_BUCKETS_SECONDS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 30.0, 60.0,
)

HISTOGRAM_KEYS = ("ttft_seconds", "tpot_seconds", "e2e_seconds")

# vLLM's own bucket bounds (vllm/v1/metrics/loggers.py, PrometheusStatLogger), so that the vllm:
# histograms the API port serves (engine/server/vllm_metrics.py) match a vLLM pod's bucket for
# bucket. Inter-token latency is observed once per token gap, as vLLM does, not per request.
VLLM_BUCKETS_SECONDS: dict[str, tuple[float, ...]] = {
    "ttft_seconds": (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                     5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
    "inter_token_seconds": (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                            2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0),
    "e2e_seconds": (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0),
}

# Rejection reasons the engine counts under requests.rejected_total.
REJECT_REASONS = ("too_long", "queue_full", "invalid", "internal_error")
# Why a request ended in an error after it was admitted, counted under requests.failed_total
# (added by the API server): an injected test fault (--fault-error-rate), the engine failed it,
# the server failed it, scoring timed out, or the drain deadline cut it.
FAILURE_REASONS = ("fault", "engine_error", "internal", "timeout", "shutdown")
# Fallback reasons counted under validation.fallbacks_total{strategy}; the strategies are the checks'
# names: eviction, kv_int8, kv_fp8, linear, mla, gqa.
FALLBACK_REASONS = ("low_cosine", "kernel_error", "nan")
FALLBACK_STRATEGIES = ("eviction", "kv_int8", "kv_fp8", "linear", "mla", "gqa")


class Histogram:
    """A cumulative latency histogram over LATENCY_BUCKETS_SECONDS, serialisable into the feed."""

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS_SECONDS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per-bucket (non-cumulative) counts
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        index = len(self.bounds)
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                index = i
                break
        self.counts[index] += 1
        self.sum += value
        self.count += 1

    def to_feed(self) -> dict[str, Any]:
        cumulative, running = [], 0
        for c in self.counts:
            running += c
            cumulative.append(running)
        return {"buckets": cumulative, "sum": self.sum, "count": self.count}


def empty_histogram() -> dict[str, Any]:
    return Histogram().to_feed()


# -- the sections each owner hands metrics/stats.build_feed (typed: the one assembler's inputs) --------
class MlaSection(TypedDict):
    """engine.mla: the MLA strategy's (strategies/mla/strategy.py)."""

    mode: str
    latent_width: int | None
    absorbed_decode: bool
    latent_rank: int | None
    reconstruction_error: float | None
    reconstruction_error_max: float | None
    reconstruction_error_k: float | None
    reconstruction_error_v: float | None


class LinearSection(TypedDict):
    """linear: the recurrent-state pool's summary hits and misses (strategies/linear/strategy.py)."""

    summary_hits_total: int
    summary_misses_total: int


class ReserveSection(TypedDict):
    blocks_total: int
    blocks_used: int
    sequences: int
    full_total: int


class ValidationSection(TypedDict):
    """validation: runtime validation's counters and the fallback reserve's use (step_hooks.py)."""

    checks_total: int
    fallbacks_total: dict[str, dict[str, int]]
    unrecovered_total: dict[str, int]
    last_cosine: float | None
    checks_skipped_total: int
    reserve: ReserveSection


class HeadUtilization(TypedDict):
    layer: int
    kv_head: int
    value: float


class FeedSections(TypedDict, total=False):
    """What owners pass build_feed beside the engine's own counters; a key not passed gets its idle value."""

    sequences_by_dtype: dict[str, int]  # kv: running sequences per cache dtype (strategies/kv_quant/pools.py)
    kv_used: int  # memory_bytes.kv_used over pools of different block bytes
    mla: MlaSection
    linear: LinearSection
    validation: ValidationSection
    gqa_head_utilization: list[HeadUtilization]


IDLE_MLA = MlaSection(mode="off", latent_width=None, absorbed_decode=False, latent_rank=None,
                      reconstruction_error=None, reconstruction_error_max=None,
                      reconstruction_error_k=None, reconstruction_error_v=None)  # fmt: skip
IDLE_LINEAR = LinearSection(summary_hits_total=0, summary_misses_total=0)
IDLE_RESERVE = ReserveSection(blocks_total=0, blocks_used=0, sequences=0, full_total=0)


def idle_validation() -> ValidationSection:
    return ValidationSection(checks_total=0, fallbacks_total={}, unrecovered_total={}, last_cosine=None,
                             checks_skipped_total=0, reserve=ReserveSection(**IDLE_RESERVE))
