"""The `kvpilot serve` command line of one track: model, strategy flags, planner's limits."""

from __future__ import annotations

from kvpilot.operator import constants as c
from kvpilot.operator.builders.calibration import conversion_flags
from kvpilot.operator.builders.security import API_KEY_FILE
from kvpilot.operator.spec import ServiceSpec, StrategySpec
from kvpilot.planner import CapacityPlan
from kvpilot.storage.uri import FORMS, BadModelUri, is_remote, parse
from kvpilot.strategy_schema import flag, rollback_flag, spec_kv_dtype_flag


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


DRAIN_MARGIN_SECONDS = 15  # the pod's grace period minus this is the engine's --shutdown-grace


def strategy_flags(strategy: StrategySpec) -> list[str]:
    """Flags of `kvpilot serve` for the memory strategy; parameters only for the chosen attention.
    Each field's flag is kvpilot/strategy_schema.py's (the EngineConfig field it sets)."""
    flags = [flag("attention"), strategy.attention]
    if strategy.attention == "gqa" and strategy.kv_head_groups:
        flags += [flag("kv_head_groups"), str(strategy.kv_head_groups)]
    if strategy.attention == "mla" and strategy.latent_rank:
        flags += [flag("latent_rank"), str(strategy.latent_rank)]
    flags += conversion_flags(strategy)  # calibration text (gqa, mla) and partial RoPE (mla)
    if strategy.attention == "linear":
        flags += [flag("linear_window"), str(strategy.linear_window)]
    if strategy.eviction != "none":  # what stays resident: the planner sized max-num-seqs on it
        flags += [flag("eviction"), strategy.eviction, flag("eviction_sinks"), str(strategy.eviction_sinks),
                  flag("eviction_window"), str(strategy.eviction_window)]
        if strategy.eviction == "ladder" and strategy.eviction_ladder_span is not None:
            flags += [flag("eviction_ladder_span"), str(strategy.eviction_ladder_span)]
    if strategy.kv_cache_dtype == "auto" and strategy.kv_quant_auto_threshold is not None:
        flags += [flag("kv_quant_auto_threshold"), str(strategy.kv_quant_auto_threshold),
                  flag("kv_quant_auto_split"), str(strategy.kv_quant_auto_split)]
    flags += [flag("fallback_reserve"), str(strategy.fallback_reserve)]  # the share the planner reserved
    return [
        *flags,
        flag("kv_cache_dtype"), spec_kv_dtype_flag(strategy.kv_cache_dtype),  # bf16 -> bfloat16
        flag("max_seq_len"), str(strategy.max_seq_len),
        flag("block_size"), str(strategy.block_size),
        flag("max_num_batched_tokens"), str(strategy.max_num_batched_tokens),
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
    args += [rollback_flag(name) for name in spec.engine.disable]
    if spec.engine.api_key_secret:  # a file from the mounted Secret: a flag value would show in the spec
        args += ["--api-key-file", API_KEY_FILE]
    return args + list(spec.engine.args)
