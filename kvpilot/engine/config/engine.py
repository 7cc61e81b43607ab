"""EngineConfig: everything an LLMEngine needs, checked when it is built (torch-free).

A field made with `knob(default, help)` is also a `kvpilot serve` flag (config/arguments.py derives
the parser from the fields, as vLLM's arg_utils does): a new knob is added here, once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvpilot.engine.config.strategy import (
    EVICTION_MODES,
    KV_CACHE_DTYPES,
    MLA_ROPE_PAIRS,
    check_eviction_config,
    check_kv_strategy,
    check_linear_strategy,
    check_mla_rope,
    check_tensor_parallel,
)

DTYPES = ("auto", "float32", "float16", "bfloat16")
LOAD_FORMATS = ("auto", "dummy")
ASYNC_SCHEDULING = ("auto", "on", "off")
VALIDATION_VERDICTS = ("auto", "next_step", "same_step")
FUSED_GEMV_PROJECTIONS = ("o_proj,down_proj", "o_proj", "down_proj")


def compute_dtype(requested: str, model_dtype: str, device_type: str) -> str:
    """EngineConfig.dtype resolved: 'auto' is the checkpoint's dtype on CUDA (bfloat16 when it names another)
    and float32 on CPU (bf16 matmuls are slow there). The runner computes in it; the capacity plan counts it."""
    if requested != "auto":
        return requested
    if device_type == "cpu":
        return "float32"
    return model_dtype if model_dtype in DTYPES[1:] else "bfloat16"


def knob(default: Any, help: str, **cli: Any) -> Any:
    """A field that is also a `kvpilot serve` flag: `help` is its help text; `cli` may set `flag`
    (the flag's name when it is not --field-name) and `choices`."""
    return field(default=default, metadata={"help": help, **cli})


@dataclass
class EngineConfig:
    """Everything an LLMEngine needs: the model directory plus memory and batching limits."""

    model: str
    dtype: str = knob("auto", "compute dtype (auto: the checkpoint's on CUDA, float32 on CPU)", choices=DTYPES)
    device: str = knob("auto", "auto | cpu | cuda | cuda:N")
    block_size: int = knob(16, "tokens per KV block (a power of two)")
    num_kv_blocks: int | None = knob(None, "KV pool size in blocks (default: from the capacity plan)")
    gpu_memory_utilization: float = knob(
        0.9, "this engine's share of the GPU: weights, activations and KV cache (as vLLM's; two engines at 0.45 "
        "share one GPU); never more than is free at start"
    )  # fmt: skip
    cpu_kv_cache_bytes: int = 64 * 2**20
    max_num_seqs: int | None = knob(None, "sequences running at once (default: sized from the device, config/batch.py)")
    max_num_batched_tokens: int | None = knob(
        None, "tokens per step, the prefill budget (default: sized from the device, config/batch.py)"
    )
    max_model_len: int | None = knob(None, "prompt + output tokens at most (default: config.json)")
    enable_prefix_caching: bool = knob(True, "reuse the KV blocks of a shared prompt prefix")
    enable_chunked_prefill: bool = knob(True, "split long prompts over steps", flag="--chunked-prefill")
    weight_sha256: dict[str, str] = field(default_factory=dict)
    kv_cache_dtype: str = knob(
        "auto", "auto: the model dtype (switching to int8 by batch size with --kv-quant-auto-threshold); "
        "int8 / fp8: 8-bit KV dequantised in the attention kernels", choices=KV_CACHE_DTYPES,
    )  # fmt: skip
    show_progress: bool = True
    # Memory strategies (config/strategy.py checks them all), each with its off switch.
    attention: str = knob("native", "memory strategy: native | gqa | mla | linear")
    kv_head_groups: int | None = knob(None, "gqa: KV heads after mean-pooling the checkpoint's")
    disable_gqa: bool = knob(False, "serve the checkpoint's own KV heads")
    kv_quant_auto_threshold: int | None = knob(None, "auto: new sequences get int8 blocks at this running batch size")
    kv_quant_auto_hysteresis: int | None = knob(
        None, "auto: back to 16-bit below threshold minus this (threshold/4)"
    )
    kv_quant_auto_split: float = knob(0.5, "auto: share of the KV memory for 16-bit blocks")
    disable_kv_quant: bool = knob(False, "serve the 16-bit KV cache")
    latent_rank: int | None = knob(None, "mla: width of the SVD latent cached per token and layer")
    mla_rope_dims: int | None = knob(
        None, "mla conversion: dims per KV head that keep RoPE (even, <= head_dim); the others go through the "
        "latent without RoPE, so decode absorbs W_UK/W_UV (MHA2MLA partial RoPE, an approximation); unset: "
        "RoPE on every dim, decode decompresses the keys",
    )  # fmt: skip
    mla_rope_pairs: str = knob(
        "auto", "mla_rope_dims: which rotate-half pairs keep RoPE: high (highest frequencies), norm (largest "
        "q/k 2-norm on conversion_calibration), turn (norm x how far RoPE turns the pair over the context), "
        "auto (turn when calibrated, else high)", choices=MLA_ROPE_PAIRS,
    )  # fmt: skip
    disable_mla: bool = knob(False, "serve the original attention (DeepSeek: no absorbed decode)")
    conversion_calibration: str | None = knob(
        None, "gqa / mla: a text file whose first tokens calibrate the conversion (heads merged by key "
        "similarity, activation-aware factorisation); unset: weights only (heads by index, plain SVD)",
    )  # fmt: skip
    calibration_tokens: int = knob(2048, "gqa / mla: calibration tokens read from conversion_calibration")
    linear_window: int = knob(64, "linear: most recent tokens attended exactly")
    linear_features: int | None = knob(None, "linear: random features per KV head (head_dim)")
    linear_seed: int = 0  # seeds the feature draw (part of the converted model)
    disable_linear: bool = knob(False, "serve the checkpoint's softmax attention")
    eviction: str = knob(
        "none", "long context: keep attention sinks + a recent window (ladder: older spans kept sparsely)",
        choices=EVICTION_MODES,
    )  # fmt: skip
    eviction_sinks: int = knob(4, "eviction: first tokens always kept")
    eviction_window: int = knob(1024, "eviction: recent tokens kept")
    eviction_ladder_span: int | None = knob(None, "ladder: tokens per level (default: window)")
    validate_every: int = knob(100, "decode tokens between validations")
    validation_sample_rate: float = knob(0.1, "share of sequences validated")
    validation_layer: int = 0  # the layer compared (negative: from the end); a check costs ~(layer+1)/L of a prefill
    validation_threshold: float = 0.92  # cosine below this moves the sequence to the exact path
    validation_verdict: str = knob(
        "auto", "when a runtime-validation check is read on the host: next_step (after the following step is "
        "launched: the host never waits for the device, a failing sequence moves one step later), same_step "
        "(a host/device sync after the step). auto: next_step under async scheduling", choices=VALIDATION_VERDICTS,
    )  # fmt: skip
    fallback_reserve: float = knob(
        0.1, "share of the KV memory kept as exact-path blocks (16-bit K/V, full context, unconverted "
        "layers) for sequences that fail runtime validation under a lossy strategy; 0: none (warn only)",
    )  # fmt: skip
    head_utilization_every: int = knob(64, "decode steps between head-utilisation samples")
    cuda_graphs: bool = knob(True, "replay CUDA graphs for decode-only steps (CUDA; on CPU nothing is captured)")
    enforce_eager: bool = knob(False, "never capture CUDA graphs: every step runs eagerly (as vLLM's flag)")
    async_scheduling: str = knob(
        "auto", "prepare the next step while the GPU runs this one, sampled tokens fed back on the device (the "
        "host learns them a step later; steps that need them first run synchronously). auto: on CUDA for the "
        "Llama family", choices=ASYNC_SCHEDULING,
    )  # fmt: skip
    tensor_parallel_size: int = knob(
        1, "ranks (processes; one GPU each on CUDA) over which heads, KV heads, MLP and vocabulary are split"
    )
    tensor_parallel_timeout: float = knob(
        60.0, "seconds a rank waits in a collective before the engine fails closed (a rank died or hung)"
    )
    load_format: str = knob(
        "auto", "auto: the checkpoint's safetensors; dummy: random weights of config.json's shape (benchmarks)",
        choices=LOAD_FORMATS,
    )  # fmt: skip
    fused_gemv_rows: int = knob(
        1, "steps of at most this many tokens run each Llama-family layer's o_proj and down_proj as one Triton "
        "GEMV with the residual add, the next RMSNorm and SiLU fused in (kernels/gemv_norm; one GPU); "
        "0: cuBLAS and separate kernels; at most 64. Default 1: at batch 1 it beats cuBLAS + the norm "
        "(docs/benchmarks.md, session 18); at 2-4 rows each row re-reads the weight and it loses",
    )  # fmt: skip
    fused_gemv_projections: str = knob(
        "o_proj,down_proj", "which projections fused_gemv_rows fuses (each with the add + RMSNorm after it)",
        choices=FUSED_GEMV_PROJECTIONS,
    )  # fmt: skip

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
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1 or None (sized from the device), got {self.max_num_seqs}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be >= 1 or None (sized from the device), got {self.max_num_batched_tokens}"
            )
        if self.async_scheduling not in ASYNC_SCHEDULING:
            raise ValueError(f"async_scheduling must be one of {ASYNC_SCHEDULING}, got {self.async_scheduling!r}")
        if self.validation_verdict not in VALIDATION_VERDICTS:
            raise ValueError(f"validation_verdict must be one of {VALIDATION_VERDICTS}, got {self.validation_verdict!r}")
        if not 0 <= self.fused_gemv_rows <= 64:  # kernels/gemv_norm.MAX_ROWS (this module stays torch-free)
            raise ValueError(f"fused_gemv_rows must be in [0, 64] (0: off), got {self.fused_gemv_rows}")
        if self.fused_gemv_projections not in FUSED_GEMV_PROJECTIONS:
            raise ValueError(
                f"fused_gemv_projections must be one of {FUSED_GEMV_PROJECTIONS}, got {self.fused_gemv_projections!r}"
            )
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {LOAD_FORMATS}, got {self.load_format!r}")
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
        check_mla_rope(self)
        if self.calibration_tokens < 16:
            raise ValueError(f"calibration_tokens must be >= 16, got {self.calibration_tokens}")
        check_tensor_parallel(self)
        if self.tensor_parallel_timeout <= 0:
            raise ValueError(f"tensor_parallel_timeout must be > 0 seconds, got {self.tensor_parallel_timeout}")
