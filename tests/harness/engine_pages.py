"""/metrics pages of vLLM and SGLang, written from their documented metric names, for adapter tests.

Names follow vllm/v1/metrics/loggers.py (0.9+, V1 engine) and python/sglang/srt/metrics/collector.py.
"""

from __future__ import annotations


def histogram_lines(name: str, labels: str, bounds: list[str], counts: list[int], total: float) -> str:
    """Exposition lines of one classic histogram series (cumulative counts, ending with +Inf)."""
    lines = [f'{name}_bucket{{{labels},le="{b}"}} {c}' for b, c in zip(bounds, counts, strict=True)]
    lines += [f"{name}_sum{{{labels}}} {total}", f"{name}_count{{{labels}}} {counts[-1]}"]
    return "\n".join(lines)


# vLLM 0.10-style page with two data-parallel engines, the deprecated cache gauge still present,
# and both the old and new per-token latency histograms.
VLLM_LABELS = ['model_name="llama",engine="0"', 'model_name="llama",engine="1"']
VLLM_PAGE = "\n".join([
    "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.",
    "# TYPE process_start_time_seconds gauge",
    "process_start_time_seconds 1.7e+09",
    "# HELP vllm:num_requests_running Number of requests in model execution batches.",
    "# TYPE vllm:num_requests_running gauge",
    f"vllm:num_requests_running{{{VLLM_LABELS[0]}}} 3.0",
    f"vllm:num_requests_running{{{VLLM_LABELS[1]}}} 4.0",
    "# TYPE vllm:num_requests_waiting gauge",
    f"vllm:num_requests_waiting{{{VLLM_LABELS[0]}}} 1.0",
    f"vllm:num_requests_waiting{{{VLLM_LABELS[1]}}} 0.0",
    "# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
    "# TYPE vllm:gpu_cache_usage_perc gauge",
    f"vllm:gpu_cache_usage_perc{{{VLLM_LABELS[0]}}} 0.99",
    f"vllm:gpu_cache_usage_perc{{{VLLM_LABELS[1]}}} 0.99",
    "# TYPE vllm:kv_cache_usage_perc gauge",
    f"vllm:kv_cache_usage_perc{{{VLLM_LABELS[0]}}} 0.25",
    f"vllm:kv_cache_usage_perc{{{VLLM_LABELS[1]}}} 0.75",
    "# TYPE vllm:prefix_cache_queries counter",
    f"vllm:prefix_cache_queries_total{{{VLLM_LABELS[0]}}} 1000.0",
    f"vllm:prefix_cache_queries_total{{{VLLM_LABELS[1]}}} 500.0",
    "# TYPE vllm:prefix_cache_hits counter",
    f"vllm:prefix_cache_hits_total{{{VLLM_LABELS[0]}}} 300.0",
    f"vllm:prefix_cache_hits_total{{{VLLM_LABELS[1]}}} 100.0",
    "# TYPE vllm:num_preemptions counter",
    f"vllm:num_preemptions_total{{{VLLM_LABELS[0]}}} 2.0",
    f"vllm:num_preemptions_total{{{VLLM_LABELS[1]}}} 5.0",
    "# TYPE vllm:prompt_tokens counter",
    f"vllm:prompt_tokens_total{{{VLLM_LABELS[0]}}} 4096.0",
    "# TYPE vllm:generation_tokens counter",
    f"vllm:generation_tokens_total{{{VLLM_LABELS[0]}}} 8192.0",
    "# TYPE vllm:request_success counter",
    f'vllm:request_success_total{{{VLLM_LABELS[0]},finished_reason="stop"}} 10.0',
    f'vllm:request_success_total{{{VLLM_LABELS[0]},finished_reason="length"}} 4.0',
    f'vllm:request_success_total{{{VLLM_LABELS[0]},finished_reason="abort"}} 1.0',
    "# TYPE vllm:time_to_first_token_seconds histogram",
    histogram_lines("vllm:time_to_first_token_seconds", VLLM_LABELS[0], ["0.001", "0.1", "1.0", "+Inf"], [0, 5, 8, 9], 3.5),
    histogram_lines("vllm:time_to_first_token_seconds", VLLM_LABELS[1], ["0.001", "0.1", "1.0", "+Inf"], [1, 2, 3, 3], 0.9),
    "# TYPE vllm:time_per_output_token_seconds histogram",
    histogram_lines("vllm:time_per_output_token_seconds", VLLM_LABELS[0], ["0.01", "+Inf"], [99, 99], 0.5),
    "# TYPE vllm:inter_token_latency_seconds histogram",
    histogram_lines("vllm:inter_token_latency_seconds", VLLM_LABELS[0], ["0.01", "0.025", "+Inf"], [7, 9, 10], 0.2),
    "# TYPE vllm:e2e_request_latency_seconds histogram",
    histogram_lines("vllm:e2e_request_latency_seconds", VLLM_LABELS[0], ["0.3", "0.5", "+Inf"], [1, 2, 15], 40.0),
    "# TYPE vllm:cache_config_info gauge",
    'vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",gpu_memory_utilization="0.9",'
    'num_cpu_blocks="None",num_gpu_blocks="27000",enable_prefix_caching="True"} 1.0',
    "",
])

SGLANG_LABELS = 'model_name="meta-llama/Llama-3.1-8B-Instruct"'
SGLANG_PAGE = "\n".join([
    "# TYPE process_start_time_seconds gauge",
    "process_start_time_seconds 1.71e+09",
    "# HELP sglang:prompt_tokens_total Number of prefill tokens processed.",
    "# TYPE sglang:prompt_tokens_total counter",
    f"sglang:prompt_tokens_total{{{SGLANG_LABELS}}} 8.128902e+06",
    "# TYPE sglang:generation_tokens_total counter",
    f"sglang:generation_tokens_total{{{SGLANG_LABELS}}} 7.557572e+06",
    "# TYPE sglang:cached_tokens_total counter",
    f'sglang:cached_tokens_total{{{SGLANG_LABELS},cache_source="device"}} 1000.0',
    f'sglang:cached_tokens_total{{{SGLANG_LABELS},cache_source="host"}} 24.0',
    "# TYPE sglang:token_usage gauge",
    f"sglang:token_usage{{{SGLANG_LABELS}}} 0.28",
    "# TYPE sglang:cache_hit_rate gauge",
    f"sglang:cache_hit_rate{{{SGLANG_LABELS}}} 0.0075",
    "# TYPE sglang:num_running_reqs gauge",
    f"sglang:num_running_reqs{{{SGLANG_LABELS}}} 12.0",
    "# TYPE sglang:num_queue_reqs gauge",
    f"sglang:num_queue_reqs{{{SGLANG_LABELS}}} 7.0",
    "# TYPE sglang:num_requests_total counter",
    f"sglang:num_requests_total{{{SGLANG_LABELS}}} 90.0",
    "# TYPE sglang:num_aborted_requests_total counter",
    f"sglang:num_aborted_requests_total{{{SGLANG_LABELS}}} 3.0",
    "# TYPE sglang:num_retracted_requests_total counter",
    f"sglang:num_retracted_requests_total{{{SGLANG_LABELS}}} 2.0",
    "# TYPE sglang:time_to_first_token_seconds histogram",
    histogram_lines("sglang:time_to_first_token_seconds", SGLANG_LABELS, ["0.1", "0.2", "0.4", "+Inf"], [10, 60, 80, 90], 20.0),
    "# TYPE sglang:inter_token_latency_seconds histogram",
    histogram_lines("sglang:inter_token_latency_seconds", SGLANG_LABELS, ["0.002", "0.004", "+Inf"], [5, 50, 51], 0.2),
    "# TYPE sglang:e2e_request_latency_seconds histogram",
    histogram_lines("sglang:e2e_request_latency_seconds", SGLANG_LABELS, ["0.1", "1", "+Inf"], [0, 40, 90], 300.0),
    "",
])
