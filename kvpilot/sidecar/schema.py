"""The exported metrics, as data: one row per family (like DCGM's field table).

Every collector, the adapters, the docs page (docs/metrics.md) and the exposition tests read this
table, so the names dashboards and rollout gates query cannot drift from what is served.

Conventions: `kvpilot_` prefix, base units (bytes, seconds, watts, celsius), `_total` on counters,
ratios in 0-1, labels with few values. Memory is exported as one gauge per component rather than
`kvpilot_memory_bytes{component=...}` because the components nest (kv_used is part of kv_pool,
torch_allocated is part of torch_reserved, kv_pool is part of torch_reserved): Prometheus asks that
summing over a label be meaningful, and a `sum(kvpilot_memory_bytes)` would double count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

MetricType = Literal["gauge", "counter", "histogram"]
Group = Literal["mission", "engine", "health", "gpu"]

PREFIX = "kvpilot_"


@dataclass(frozen=True)
class MetricSpec:
    """One exported metric family."""

    name: str  # what PromQL sees; counters include `_total`, histograms are the base name
    type: MetricType
    unit: str  # base unit in words (bytes, seconds, ratio, tokens, ...); "" for plain numbers
    help: str
    labels: tuple[str, ...] = ()
    source: str = ""  # engine stats-feed path (stats_contract) or how the sidecar derives it
    group: Group = "engine"

    @property
    def family_name(self) -> str:
        """The family name in the exposition (counters lose `_total`, as the text format does)."""
        return self.name[: -len("_total")] if self.type == "counter" else self.name

    @property
    def exposition_unit(self) -> str:
        """The OpenMetrics UNIT: only when the family name ends with `_<unit>`, else none."""
        return self.unit if self.unit and self.family_name.endswith("_" + self.unit) else ""


def _row(type_: MetricType) -> Callable[..., MetricSpec]:
    """A row builder for one metric type: name (without prefix), unit, help, source, labels, group."""

    def row(name: str, unit: str, help: str, source: str, labels: tuple[str, ...] = (),
            group: Group = "engine") -> MetricSpec:
        return MetricSpec(PREFIX + name, type_, unit, help, labels, source, group)

    return row


_g, _c = _row("gauge"), _row("counter")


def _h(name: str, help: str, source: str) -> MetricSpec:
    return MetricSpec(PREFIX + name, "histogram", "seconds", help, (), source, "engine")


MISSION: tuple[MetricSpec, ...] = (
    _g("kv_cache_efficiency", "ratio",
       "Bytes holding live tokens' KV entries / bytes of KV blocks allocated to live sequences "
       "(0-1; absent while no sequence is live). Target above 0.85.",
       "kv.efficiency", group="mission"),
    _g("summary_cache_hit_rate", "ratio",
       "Share of linear-attention steps whose recurrent state was resident, since engine start "
       "(0-1; absent before the first such step). Target above 0.995.",
       "derived: linear.summary_hits_total / (summary_hits_total + summary_misses_total)",
       group="mission"),
    _c("summary_cache_hits_total", "", "Linear-attention steps whose recurrent state was resident.",
       "linear.summary_hits_total", group="mission"),
    _c("summary_cache_misses_total", "",
       "Linear-attention steps that had to rebuild their recurrent state (cold start, preemption).",
       "linear.summary_misses_total", group="mission"),
    _g("gqa_head_utilization", "ratio",
       "Sampled exp(attention entropy) / context length, averaged over the query heads sharing "
       "this KV head (0-1; low = over-concentrated attention).",
       "gqa_head_utilization[].value", ("layer", "kv_head"), group="mission"),
)

HEALTH: tuple[MetricSpec, ...] = (
    _g("engine_up", "", "1 if the sidecar read the engine's stats at this scrape, else 0.",
       "sidecar: feed read succeeded", group="health"),
    _c("engine_restarts_total", "",
       "Engine restarts seen by this sidecar (changes of engine identity; up-down-up when the "
       "engine has no identity).", "sidecar: engine.instance_id changes", group="health"),
    _g("engine_stats_age_seconds", "seconds",
       "Age of the engine's stats snapshot at this scrape: the feed serves its last snapshot when "
       "the engine thread is busy. Engine families are withheld while it exceeds --max-stats-age.",
       "engine feed: age_seconds", group="health"),
    _g("engine_scrape_duration_seconds", "seconds",
       "Time this scrape spent reading and parsing the engine's stats.", "sidecar: timer",
       group="health"),
)

ENGINE: tuple[MetricSpec, ...] = (
    _g("engine_info", "", "Constant 1, labelled with what the engine runs.", "engine.*",
       ("instance_id", "model", "strategy", "device", "kv_cache_dtype")),
    _g("engine_ready", "", "1 when the engine accepts requests.", "engine.ready"),
    _g("engine_start_time_seconds", "seconds", "Engine start, Unix time.",
       "engine.start_time_seconds"),
    # KV blocks. Separate gauges: a cached block may also count as free or used, depending on
    # the engine, so a `state` label whose values do not partition the pool would mislead sums.
    _g("kv_block_size_tokens", "tokens", "Tokens per KV block.", "kv.block_size"),
    _g("kv_block_size_bytes", "bytes", "Bytes per KV block (all layers, K and V).",
       "kv.bytes_per_block"),
    _g("kv_blocks_capacity", "", "KV blocks in the pool.", "kv.blocks_total"),
    _g("kv_blocks_free", "", "KV blocks free for allocation.", "kv.blocks_free"),
    _g("kv_blocks_used", "", "KV blocks held by live sequences.", "kv.blocks_used"),
    _g("kv_blocks_cached", "", "KV blocks holding reusable prefix-cache content.",
       "kv.blocks_cached"),
    _g("kv_cache_usage_ratio", "ratio", "KV blocks used / blocks in the pool (0-1).",
       "derived: kv.blocks_used / kv.blocks_total"),
    _g("kv_live_tokens", "tokens", "Token slots holding live sequences' K/V (efficiency numerator).",
       "kv.live_token_slots"),
    _g("kv_allocated_tokens", "tokens",
       "Token slots in blocks held by live sequences (efficiency denominator).",
       "kv.allocated_token_slots"),
    _c("kv_live_token_seconds_total", "token_seconds",
       "Live token slots integrated over time (every step counts, not only scrape instants): "
       "KV efficiency over a window = increase(live) / increase(allocated).",
       "kv.live_token_seconds_total"),
    _c("kv_allocated_token_seconds_total", "token_seconds",
       "Allocated token slots integrated over time (the efficiency-over-a-window denominator).",
       "kv.allocated_token_seconds_total"),
    _g("kv_sequences", "",
       "Running sequences per KV cache dtype (kv_cache_dtype=auto puts new ones on int8 blocks "
       "at the batch-size threshold; engine_info's kv_cache_dtype is the current choice).",
       "kv.sequences_by_dtype{dtype}", ("dtype",)),
    _c("prefix_cache_queried_tokens_total", "tokens", "Prompt tokens looked up in the prefix cache.",
       "prefix_cache.queried_tokens_total"),
    _c("prefix_cache_hit_tokens_total", "tokens", "Prompt tokens found in the prefix cache.",
       "prefix_cache.hit_tokens_total"),
    # Memory, one gauge per component (see the module docstring for why not one labelled family).
    _g("memory_weights_bytes", "bytes", "Model weights.", "memory_bytes.weights"),
    _g("memory_kv_pool_bytes", "bytes", "KV cache pool reserved at start.", "memory_bytes.kv_pool"),
    _g("memory_kv_used_bytes", "bytes", "KV cache pool bytes in blocks held by live sequences.",
       "memory_bytes.kv_used"),
    _g("memory_activation_peak_bytes", "bytes", "Peak activation memory measured at start.",
       "memory_bytes.activation_peak"),
    _g("memory_torch_reserved_bytes", "bytes", "Bytes reserved by torch's caching allocator.",
       "memory_bytes.torch_reserved"),
    _g("memory_torch_allocated_bytes", "bytes", "Bytes allocated to live tensors.",
       "memory_bytes.torch_allocated"),
    # Requests and tokens.
    _g("requests_running", "", "Requests in the running batch.", "requests.running"),
    _g("requests_waiting", "", "Requests waiting to be scheduled.", "requests.waiting"),
    _g("max_concurrency", "", "Concurrent sequences the capacity plan allows.",
       "requests.max_concurrency"),
    _c("requests_finished_total", "", "Requests that finished (stop or length).",
       "requests.finished_total"),
    _c("requests_aborted_total", "", "Requests aborted (client gone or cancelled).",
       "requests.aborted_total"),
    _c("requests_rejected_total", "", "Requests refused before scheduling, by reason.",
       "requests.rejected_total{reason}", ("reason",)),
    _c("requests_failed_total", "",
       "Requests that ended in an error after admission (HTTP 5xx, engine error, injected test "
       "fault, drain deadline), by reason. Error rate = failed / (finished + failed).",
       "requests.failed_total{reason}", ("reason",)),
    _c("preemptions_total", "", "Sequences preempted to free KV blocks.",
       "requests.preemptions_total"),
    _c("prompt_tokens_total", "tokens", "Prompt tokens processed.", "requests.prompt_tokens_total"),
    _c("generation_tokens_total", "tokens", "Tokens generated.",
       "requests.generation_tokens_total"),
    _c("oom_events_total", "", "Out-of-memory events the engine caught.",
       "requests.oom_events_total"),
    _h("ttft_seconds", "Time to first token.", "latency.ttft_seconds"),
    _h("tpot_seconds", "Time per output token after the first (inter-token latency).",
       "latency.tpot_seconds"),
    _h("e2e_latency_seconds", "End-to-end request latency.", "latency.e2e_seconds"),
    # Runtime validation of approximate attention (seed 000, 6.5).
    _c("validation_checks_total", "", "Exact-vs-approximate attention comparisons run.",
       "validation.checks_total"),
    _c("fallbacks_total", "",
       "Sequences that failed runtime validation and moved to the exact path (recomputed in the "
       "fallback reserve), by strategy (eviction, kv_int8, kv_fp8, linear, mla, gqa) and reason.",
       "validation.fallbacks_total{strategy}{reason}", ("strategy", "reason")),
    _c("validation_unrecovered_total", "",
       "Sequences that failed runtime validation with no exact path to move to (no reserve, or "
       "too long for it): served on approximately and logged, by strategy.",
       "validation.unrecovered_total{strategy}", ("strategy",)),
    _g("fallback_reserve_blocks", "", "KV blocks of the fallback reserve (exact-path blocks; 0: none).",
       "validation.reserve.blocks_total"),
    _g("fallback_reserve_used_blocks", "", "Fallback-reserve blocks held by exact-path sequences.",
       "validation.reserve.blocks_used"),
    _c("fallback_reserve_full_total", "",
       "Fallbacks that found the reserve full: the sequence waited (preempted) and was then "
       "recomputed on the exact path, never served degraded.",
       "validation.reserve.full_total"),
    _g("validation_cosine", "",
       "Cosine similarity of the latest validation check (-1 to 1; fallback below 0.92).",
       "validation.last_cosine"),
    _c("validation_checks_skipped_total", "",
       "Validation checks skipped (logged): the exact side ran out of device memory, or a step's served rows could not be reassembled.",
       "validation.checks_skipped_total"),
)

GPU: tuple[MetricSpec, ...] = (
    _g("gpu_available", "", "1 if NVML reports GPUs; 0 without a GPU or NVML (reason in the log).",
       "nvml: nvmlInit", group="gpu"),
    _g("gpu_memory_used_bytes", "bytes", "GPU memory in use.", "nvml: nvmlDeviceGetMemoryInfo.used",
       ("gpu", "uuid"), group="gpu"),
    _g("gpu_memory_total_bytes", "bytes", "GPU memory in total.",
       "nvml: nvmlDeviceGetMemoryInfo.total", ("gpu", "uuid"), group="gpu"),
    _g("gpu_utilization_ratio", "ratio", "Share of the last sample period a kernel ran (0-1).",
       "nvml: nvmlDeviceGetUtilizationRates.gpu / 100", ("gpu", "uuid"), group="gpu"),
    _g("gpu_power_watts", "watts", "Power draw.", "nvml: nvmlDeviceGetPowerUsage / 1000",
       ("gpu", "uuid"), group="gpu"),
    _g("gpu_temperature_celsius", "celsius", "GPU core temperature.",
       "nvml: nvmlDeviceGetTemperature(GPU)", ("gpu", "uuid"), group="gpu"),
)

SCHEMA: tuple[MetricSpec, ...] = MISSION + HEALTH + ENGINE + GPU
BY_NAME: dict[str, MetricSpec] = {spec.name: spec for spec in SCHEMA}

# Families derived from the engine: never served when the engine cannot be read.
ENGINE_DERIVED: tuple[MetricSpec, ...] = tuple(s for s in SCHEMA if s.group in ("mission", "engine"))


def spec(name: str) -> MetricSpec:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name!r} is not in the sidecar's metric schema (kvpilot/sidecar/schema.py)") from None
