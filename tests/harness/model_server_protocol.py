"""The Gateway API Inference Extension's model-server protocol, checked on a /metrics page.

Names, types and labels from docs/proposals/003-model-server-protocol/README.md of
sigs.k8s.io/gateway-api-inference-extension v1.4.0 and the EPP's defaults there
(pkg/epp/server/options.go): what the endpoint picker scrapes from every pod of a pool.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

REQUIRED_GAUGES = {
    "TotalQueuedRequests": "vllm:num_requests_waiting",
    "TotalRunningRequests": "vllm:num_requests_running",
    "KVCacheUtilization": "vllm:kv_cache_usage_perc",
}
CACHE_INFO = "vllm:cache_config_info"  # optional: labels block_size and num_gpu_blocks (integers)


def check_page(text: str) -> dict[str, float]:
    """The protocol's figures read from one page; AssertionError names what is missing or mistyped."""
    families = {family.name: family for family in text_string_to_metric_families(text)}
    out: dict[str, float] = {}
    for role, name in REQUIRED_GAUGES.items():
        family = families.get(name)
        assert family is not None, f"{role}: {name} is not on the page"
        assert family.type == "gauge", f"{role}: {name} is a {family.type}, the protocol wants a gauge"
        assert len(family.samples) == 1, f"{role}: {name} has {len(family.samples)} series; one per pod expected"
        out[role] = family.samples[0].value
    assert 0.0 <= out["KVCacheUtilization"] <= 1.0, f"KVCacheUtilization {out['KVCacheUtilization']} is not 0-1"
    info = families.get(CACHE_INFO)
    assert info is not None and info.samples, f"{CACHE_INFO} is missing (the prefix-cache scorer reads it)"
    labels = info.samples[0].labels
    out["BlockSize"], out["NumGPUBlocks"] = int(labels["block_size"]), int(labels["num_gpu_blocks"])
    return out
