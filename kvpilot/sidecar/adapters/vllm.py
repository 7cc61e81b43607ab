"""vLLM's /metrics (V1 engine, 0.9 and later; the pre-0.9 cache gauge name is still read)."""

from __future__ import annotations

from kvpilot.sidecar.adapters.base import Adapter, Mapping

VLLM = Adapter(
    kind="vllm",
    reference="vllm/v1/metrics/loggers.py (PrometheusStatLogger); docs.vllm.ai 'Production Metrics'",
    mappings=(
        Mapping("kvpilot_kv_cache_usage_ratio", ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
                "mean", note="renamed from gpu_cache_usage_perc in 0.9; both read, the new name first"),
        Mapping("kvpilot_requests_running", ("vllm:num_requests_running",)),
        Mapping("kvpilot_requests_waiting", ("vllm:num_requests_waiting",)),
        Mapping("kvpilot_prefix_cache_queried_tokens_total",
                ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
                note="counted in tokens, as kvpilot counts them"),
        Mapping("kvpilot_prefix_cache_hit_tokens_total",
                ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")),
        Mapping("kvpilot_preemptions_total", ("vllm:num_preemptions_total",)),
        Mapping("kvpilot_prompt_tokens_total", ("vllm:prompt_tokens_total",)),
        Mapping("kvpilot_generation_tokens_total", ("vllm:generation_tokens_total",)),
        Mapping("kvpilot_requests_finished_total", ("vllm:request_success_total",),
                exclude=(("finished_reason", "abort"),),
                note="sum over finished_reason except abort"),
        Mapping("kvpilot_requests_aborted_total", ("vllm:request_success_total",),
                only=(("finished_reason", "abort"),),
                note="finished_reason=abort only"),
        Mapping("kvpilot_ttft_seconds", ("vllm:time_to_first_token_seconds",), "histogram",
                note="vLLM's bucket bounds are kept"),
        Mapping("kvpilot_tpot_seconds",
                ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"), "histogram",
                note="inter_token_latency replaced time_per_output_token; both read, the new name first"),
        Mapping("kvpilot_e2e_latency_seconds", ("vllm:e2e_request_latency_seconds",), "histogram"),
        Mapping("kvpilot_kv_blocks_capacity", ("vllm:cache_config_info",), "label", label="num_gpu_blocks",
                note="the num_gpu_blocks label of the cache_config_info gauge"),
        Mapping("kvpilot_kv_block_size_tokens", ("vllm:cache_config_info",), "label", label="block_size",
                note="the block_size label of the cache_config_info gauge"),
    ),
)
