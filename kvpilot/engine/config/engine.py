"""EngineConfig: everything an LLMEngine needs, checked when it is built (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpilot.engine.config.strategy import check_eviction_config, check_kv_strategy, check_linear_strategy

DTYPES = ("auto", "float32", "float16", "bfloat16")


@dataclass
class EngineConfig:
    """Everything an LLMEngine needs: the model directory plus memory and batching limits."""

    model: str
    dtype: str = "auto"
    device: str = "auto"
    block_size: int = 16
    num_kv_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    cpu_kv_cache_bytes: int = 64 * 2**20
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    weight_sha256: dict[str, str] = field(default_factory=dict)
    kv_cache_dtype: str = "auto"
    show_progress: bool = True
    # Memory strategies (config/strategy.py): GQA conversion and KV quantisation, each with its off switch.
    attention: str = "native"
    kv_head_groups: int | None = None
    disable_gqa: bool = False
    kv_quant_auto_threshold: int | None = None  # kv_cache_dtype=auto: int8 blocks at >= this batch
    kv_quant_auto_hysteresis: int | None = None  # back to 16-bit below threshold - this (threshold // 4)
    kv_quant_auto_split: float = 0.5  # share of the KV memory for the 16-bit pool under auto switching
    disable_kv_quant: bool = False
    latent_rank: int | None = None  # attention="mla" on an MHA/GQA checkpoint: SVD latent width (strategies/mla/apply.py)
    disable_mla: bool = False  # serve the checkpoint's own attention (native DeepSeek: no absorbed decode)
    # attention="linear" on a softmax checkpoint (strategies/linear/attention.py): exact window + summary
    linear_window: int = 64  # most recent tokens attended exactly (the query's own included)
    linear_features: int | None = None  # random features per KV head (None: head_dim)
    linear_seed: int = 0  # seeds the feature draw (part of the converted model)
    disable_linear: bool = False  # serve the checkpoint's softmax attention
    # Long-context eviction (strategies/eviction/policy.py): none | sinks | ladder; token counts, rounded up to blocks
    eviction: str = "none"
    eviction_sinks: int = 4
    eviction_window: int = 1024
    eviction_ladder_span: int | None = None  # blocks before the window per ladder level (None: window)
    # Runtime validation (validation/runner.py) and sampled head utilisation (metrics/head_utilization.py)
    validate_every: int = 100  # decode tokens between checks of one sequence
    validation_sample_rate: float = 0.1  # share of sequences checked (by request id hash)
    validation_layer: int = 0  # the layer compared (negative: from the end); a check costs ~(layer+1)/L of a prefill
    validation_threshold: float = 0.92  # cosine below this moves the sequence to the exact path
    head_utilization_every: int = 64  # decode steps between gqa_head_utilization samples (0: off)
    cuda_graphs: bool = False  # replay captured CUDA graphs for decode-only steps (worker/cuda_graphs.py)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two >= 1, got {self.block_size}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(
                f"num_kv_blocks must be >= 1 or None (size automatically), got {self.num_kv_blocks}"
            )
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(
                f"max_model_len must be >= 2 or None (from config.json), got {self.max_model_len}"
            )
        check_eviction_config(self)
        check_kv_strategy(self)
        if self.linear_window < 1 or (self.linear_features is not None and self.linear_features < 1):
            raise ValueError(
                f"linear_window ({self.linear_window}) and linear_features ({self.linear_features}) must be >= 1"
            )
        if self.latent_rank is not None and self.latent_rank < 1:
            raise ValueError(f"latent_rank must be >= 1 or None (a DeepSeek model's own kv_lora_rank), got {self.latent_rank}")
        check_linear_strategy(self)
