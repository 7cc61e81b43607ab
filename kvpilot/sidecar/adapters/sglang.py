"""SGLang's /metrics (`--enable-metrics`)."""

from __future__ import annotations

from kvpilot.sidecar.adapters.base import Adapter, Mapping

SGLANG = Adapter(
    kind="sglang",
    reference="python/sglang/srt/metrics/collector.py; docs.sglang.io 'Production Metrics'",
    mappings=(
        Mapping("kvpilot_kv_cache_usage_ratio", ("sglang:token_usage",), "mean",
                note="token slots in use / pool (SGLang pages by token)"),
        Mapping("kvpilot_requests_running", ("sglang:num_running_reqs",)),
        Mapping("kvpilot_requests_waiting", ("sglang:num_queue_reqs",)),
        Mapping("kvpilot_prefix_cache_queried_tokens_total", ("sglang:prompt_tokens_total",),
                note="every prompt token is looked up in the radix cache"),
        Mapping("kvpilot_prefix_cache_hit_tokens_total", ("sglang:cached_tokens_total",),
                note="summed over cache_source (device, host, storage)"),
        Mapping("kvpilot_preemptions_total", ("sglang:num_retracted_requests_total",),
                note="SGLang calls preemption 'retraction'; older releases have only a gauge"),
        Mapping("kvpilot_prompt_tokens_total", ("sglang:prompt_tokens_total",)),
        Mapping("kvpilot_generation_tokens_total", ("sglang:generation_tokens_total",)),
        Mapping("kvpilot_requests_finished_total", ("sglang:num_requests_total",),
                note="requests processed (includes aborted ones)"),
        Mapping("kvpilot_requests_aborted_total", ("sglang:num_aborted_requests_total",)),
        Mapping("kvpilot_ttft_seconds", ("sglang:time_to_first_token_seconds",), "histogram",
                note="SGLang's bucket bounds are kept"),
        Mapping("kvpilot_tpot_seconds",
                ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"), "histogram",
                note="older releases export time_per_output_token_seconds"),
        Mapping("kvpilot_e2e_latency_seconds", ("sglang:e2e_request_latency_seconds",), "histogram"),
    ),
)
