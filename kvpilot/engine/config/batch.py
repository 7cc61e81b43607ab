"""Default batch limits sized from the device (torch-free: `kvpilot serve` and `LLM()` resolve them alike).

`max_num_seqs` and `max_num_batched_tokens` default to None in EngineConfig; before anything is
sized from them (the capacity plan, the activation profile, the CUDA-graph buckets), the device
fills them in. A GPU gets the limits vLLM picks by GPU class (256 sequences; a prefill budget
that grows with memory, so a step of a large batch still fits the activation peak beside the
weights); a CPU keeps small limits (its steps are slow, and short steps keep latency fair).
"""

from __future__ import annotations

from typing import Any

GIB = 2**30
CPU_LIMITS = (64, 2048)
# (least device memory, max_num_seqs, max_num_batched_tokens), largest first
GPU_LIMITS = ((70 * GIB, 256, 16384), (32 * GIB, 256, 8192), (0, 128, 4096))


def batch_limits(device_type: str, memory_bytes: int) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) for a device of this type and total memory."""
    if device_type != "cuda":
        return CPU_LIMITS
    for least, seqs, tokens in GPU_LIMITS:
        if memory_bytes >= least:
            return seqs, tokens
    raise AssertionError("GPU_LIMITS ends with a 0-byte row")


def fill_batch_defaults(config: Any, device_type: str, memory_bytes: int) -> None:
    """Set the limits the user left at None (an EngineConfig; in place, idempotent)."""
    seqs, tokens = batch_limits(device_type, memory_bytes)
    if config.max_num_seqs is None:
        config.max_num_seqs = seqs
    if config.max_num_batched_tokens is None:
        if not config.enable_chunked_prefill and config.max_model_len is not None:
            tokens = max(tokens, config.max_model_len)  # a whole prompt must fit one step
        config.max_num_batched_tokens = max(tokens, config.max_num_seqs)  # a full decode batch fits one step
