"""The `kvpilot serve` command line of one track: model, strategy flags, planner's limits."""

from __future__ import annotations

from kvpilot.operator import constants as c
from kvpilot.operator.builders.calibration import conversion_flags
from kvpilot.operator.builders.security import API_KEY_FILE
from kvpilot.operator.spec import ServiceSpec, StrategySpec
from kvpilot.planner import CapacityPlan
from kvpilot.storage.uri import FORMS, BadModelUri, is_remote, parse


class UnsupportedModelUri(ValueError):
    """The model URI names a scheme the operator cannot mount."""


def model_path(uri: str) -> str:
    """Where the engine finds the checkpoint inside the pod: `pvc://claim/dir` -> /models/dir."""
    if uri.startswith("pvc://"):
        _claim, _, sub = uri.removeprefix("pvc://").partition("/")
        return f"{c.MODEL_MOUNT}/{sub}".rstrip("/")
    if uri.startswith("file://"):
        return uri.removeprefix("file://")
    if uri.startswith("/"):
        return uri
    if is_remote(uri):  # fetched by the storage initializer into the volume mounted here (model_init.py)
        try:
            parse(uri)
        except BadModelUri as exc:
            raise UnsupportedModelUri(str(exc)) from None
        return c.MODEL_MOUNT
    raise UnsupportedModelUri(f"model.uri {uri!r}: use pvc://<claim>/<dir>, file:///<dir>, /<dir>, {FORMS}")


def pvc_claim(uri: str) -> str | None:
    return uri.removeprefix("pvc://").partition("/")[0] if uri.startswith("pvc://") else None


# spec.strategy.kvCacheDtype -> `kvpilot serve --kv-cache-dtype` (torch dtype names for 16-bit)
_KV_DTYPE_FLAG = {"auto": "auto", "bf16": "bfloat16", "fp16": "float16", "int8": "int8", "fp8": "fp8"}
DRAIN_MARGIN_SECONDS = 15  # the pod's grace period minus this is the engine's --shutdown-grace


def strategy_flags(strategy: StrategySpec) -> list[str]:
    """Flags of `kvpilot serve` for the memory strategy; parameters only for the chosen attention."""
    flags = ["--attention", strategy.attention]
    if strategy.attention == "gqa" and strategy.kv_head_groups:
        flags += ["--kv-head-groups", str(strategy.kv_head_groups)]
    if strategy.attention == "mla" and strategy.latent_rank:
        flags += ["--latent-rank", str(strategy.latent_rank)]
    flags += conversion_flags(strategy)  # calibration text (gqa, mla) and partial RoPE (mla)
    if strategy.attention == "linear":
        flags += ["--linear-window", str(strategy.linear_window)]
    if strategy.eviction != "none":
        flags += ["--eviction", strategy.eviction]
    if strategy.kv_cache_dtype == "auto" and strategy.kv_quant_auto_threshold is not None:
        flags += ["--kv-quant-auto-threshold", str(strategy.kv_quant_auto_threshold),
                  "--kv-quant-auto-split", str(strategy.kv_quant_auto_split)]
    flags += ["--fallback-reserve", str(strategy.fallback_reserve)]  # the share the planner reserved
    return [
        *flags,
        "--kv-cache-dtype", _KV_DTYPE_FLAG[strategy.kv_cache_dtype],
        "--max-model-len", str(strategy.max_seq_len),
        "--block-size", str(strategy.block_size),
        "--max-num-batched-tokens", str(strategy.max_num_batched_tokens),
    ]


def engine_args(spec: ServiceSpec, plan: CapacityPlan, served_name: str = "") -> list[str]:
    """Arguments after `kvpilot serve`; the concurrency limit comes from the capacity plan.

    `served_name` (the InferenceService's name) is the `model` clients send, on both tracks: left to
    the engine it would be the checkpoint's directory name, so a canary with a new checkpoint would
    answer 404 to every request naming the stable one, and after its promotion so would stable.
    """
    args = ["--model", model_path(spec.model.uri), "--host", "0.0.0.0", "--port", str(c.ENGINE_PORT)]
    if served_name:
        args += ["--served-model-name", served_name]
    if spec.model.sha256:  # the engine refuses weights whose manifest digest differs
        args += ["--model-sha256", spec.model.sha256]
    args += strategy_flags(spec.strategy)
    if spec.gpus > 1:  # the engine splits the model over every GPU the pod requests (tensor parallel)
        args += ["--tensor-parallel-size", str(spec.gpus)]
    grace = max(1, spec.engine.termination_grace_period_seconds - DRAIN_MARGIN_SECONDS)
    args += ["--max-num-seqs", str(plan.max_concurrency), "--strategy-name", plan.strategy,
             "--shutdown-grace", str(grace)]
    args += [f"--disable-{name}" for name in spec.engine.disable]
    if spec.engine.api_key_secret:  # a file from the mounted Secret: a flag value would show in the spec
        args += ["--api-key-file", API_KEY_FILE]
    return args + list(spec.engine.args)
