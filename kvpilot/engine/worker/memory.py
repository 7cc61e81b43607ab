"""Device memory accounting for the runner: device and dtype, pool sizing, activation peaks."""

from __future__ import annotations

import torch

from kvpilot.engine.config import ModelConfig
from kvpilot.engine.config.engine import compute_dtype

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def pick_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {requested!r} was requested but CUDA is not available; use device='cpu'")
    return torch.device(requested)


def device_memory_bytes(device: torch.device) -> int:
    """Total memory of a CUDA device (0 on CPU: its batch limits do not depend on memory)."""
    return int(torch.cuda.get_device_properties(device).total_memory) if device.type == "cuda" else 0


def pick_dtype(requested: str, model_dtype: str, device: torch.device) -> torch.dtype:
    """'auto': the checkpoint's dtype on CUDA, float32 on CPU (config/engine.compute_dtype)."""
    return DTYPES[compute_dtype(requested, model_dtype, device.type)]


def cuda_kv_blocks(
    device: torch.device, utilization: float, activation_peak: int, bytes_per_block: int
) -> int:
    """KV blocks for this engine. `utilization` is this engine's share of the GPU (its weights, activation
    peak and KV cache together: vLLM's gpu_memory_utilization), so engines sharing one GPU at 0.45 each
    both start; never more than the memory free now (another process's memory is not taken)."""
    torch.cuda.empty_cache()  # cached blocks from profiling would otherwise count twice (in use + peak)
    free, total = torch.cuda.mem_get_info(device)
    own = torch.cuda.memory_reserved(device)  # this engine's tensors so far: the weights
    share = int(total * utilization) - own
    budget = min(share, free) - activation_peak
    blocks = budget // bytes_per_block
    if blocks < 1:
        limit = (
            f"its share ({utilization} of {total / 2**30:.1f} GiB) leaves {share / 2**30:.2f} GiB beside its "
            f"{own / 2**30:.1f} GiB of weights" if share <= free else
            f"only {free / 2**30:.2f} GiB of the GPU is free (other processes hold "
            f"{(total - free - own) / 2**30:.1f} GiB)"
        )  # fmt: skip
        raise RuntimeError(
            f"no GPU memory left for the KV cache: {limit}, and the activation peak needs "
            f"{activation_peak / 2**30:.2f} GiB; raise gpu_memory_utilization, lower max_num_batched_tokens, "
            "or free the GPU"
        )
    return int(blocks)


def estimate_activation_bytes(
    mc: ModelConfig, dtype: torch.dtype, num_tokens: int, num_logit_rows: int
) -> int:
    """CPU estimate (no allocator statistics there): one layer's live intermediates plus fp32 logits."""
    elem = torch.empty((), dtype=dtype).element_size()
    qkv = (mc.num_attention_heads + 2 * mc.num_key_value_heads) * mc.head_dim
    per_token = 3 * mc.hidden_size + qkv + mc.num_attention_heads * mc.head_dim + 3 * mc.intermediate_size
    return num_tokens * per_token * elem + num_logit_rows * mc.vocab_size * 4


def torch_memory(device: torch.device) -> dict[str, int]:
    if device.type != "cuda":
        return {"torch_reserved": 0, "torch_allocated": 0}
    return {
        "torch_reserved": int(torch.cuda.memory_reserved(device)),
        "torch_allocated": int(torch.cuda.memory_allocated(device)),
    }
