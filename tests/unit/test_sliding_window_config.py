"""Where the engine applies a model's sliding window, and the length limit where it does not."""

from __future__ import annotations

import pytest

from kvpilot.engine.config import EngineConfig, ModelConfig
from kvpilot.engine.config.sliding_window import layer_window, window_limit, window_not_applied
from kvpilot.engine.make_model import model_config


def model(family: str = "mistral", window: int | None = 4096) -> ModelConfig:
    raw = model_config(family, sliding_window=window, **({"use_sliding_window": True} if family == "qwen2" else {}))
    return ModelConfig.from_dict(raw)


@pytest.mark.parametrize("kw", [{}, {"kv_cache_dtype": "bf16"}, {"kv_cache_dtype": "fp16"},
                                {"attention": "gqa", "kv_head_groups": 1, "disable_gqa": True},
                                {"eviction": "sinks", "eviction_sinks": 0, "eviction_window": 4095}])  # fmt: skip
def test_native_16_bit_paths_apply_the_window(kw: dict) -> None:
    config = EngineConfig(model="m", max_model_len=32768, **kw)
    assert window_not_applied(config, model()) == "" and window_limit(config, model()) is None
    assert layer_window(model()) == 4096


@pytest.mark.parametrize(("kw", "why"), [
    ({"kv_cache_dtype": "int8"}, "int8 KV cache"), ({"kv_cache_dtype": "fp8"}, "fp8 KV cache"),
    ({"kv_cache_dtype": "auto", "kv_quant_auto_threshold": 4}, "auto-switch KV cache"),
    ({"attention": "gqa", "kv_head_groups": 1}, "attention 'gqa'"), ({"eviction": "sinks"}, "eviction 'sinks'"),
    ({"eviction": "sinks", "eviction_sinks": 0, "eviction_window": 1024}, "a window of >= 4095 tokens"),
    ({"eviction": "ladder", "eviction_sinks": 0, "eviction_window": 8192}, "eviction 'ladder'"),
])  # fmt: skip
def test_other_paths_keep_the_length_within_the_window(kw: dict, why: str) -> None:
    assert why in window_not_applied(EngineConfig(model="m", **kw), model())
    assert window_limit(EngineConfig(model="m", **kw), model()) == 4096
    assert window_limit(EngineConfig(model="m", max_model_len=4096, **kw), model()) == 4096
    with pytest.raises(ValueError, match=f"max_model_len 8192 is past the model's sliding window.*{why}"):
        window_limit(EngineConfig(model="m", max_model_len=8192, **kw), model())


def test_no_window_or_an_unmodelled_family() -> None:
    assert window_not_applied(EngineConfig(model="m", kv_cache_dtype="int8"), model(window=None)) == ""
    assert layer_window(model(window=None)) == 0
    qwen = model("qwen2")
    assert layer_window(qwen) == 0 and "qwen2 family" in window_not_applied(EngineConfig(model="m"), qwen)


MISTRAL_V01 = {**model_config("mistral", sliding_window=4096), "max_position_embeddings": 32768}


@pytest.mark.parametrize(("strategy", "disable", "refused"), [
    ({"attention": "native", "kvCacheDtype": "int8", "maxSeqLen": 8192}, [], "the int8 KV cache's kernels"),
    ({"attention": "native", "kvCacheDtype": "int8", "maxSeqLen": 8192}, ["kv-quant"], ""),  # served 16-bit
    ({"attention": "native", "kvCacheDtype": "int8", "maxSeqLen": 4096}, [], ""),  # within the window
    ({"attention": "native", "kvCacheDtype": "bf16", "maxSeqLen": 32768}, [], ""),
    ({"attention": "gqa", "kvHeadGroups": 4, "kvCacheDtype": "bf16", "maxSeqLen": 8192}, [], "attention 'gqa'"),
    ({"attention": "native", "kvCacheDtype": "bf16", "maxSeqLen": 32768, "eviction": "sinks"}, [], "leaves gaps"),
    ({"attention": "native", "kvCacheDtype": "bf16", "maxSeqLen": 32768, "eviction": "sinks", "evictionSinks": 0,
      "evictionWindow": 4096}, [], ""),
])  # fmt: skip
def test_the_operator_refuses_before_any_pod_what_the_engine_would_refuse(strategy: dict, disable: list[str],
                                                                          refused: str) -> None:
    """preflight == the engine: a maxSeqLen the engine would refuse at start (a crash-looping pod) is a
    StrategyRefused naming the window; one it serves plans."""
    from operator_fakes import service

    from kvpilot.operator.reconcile.preflight import preflight
    from kvpilot.operator.spec import ServiceSpec
    from kvpilot.planner import PlannerError

    body = service(config=MISTRAL_V01, strategy=strategy)
    body["spec"]["engine"]["disable"] = disable
    spec = ServiceSpec.from_dict(body["spec"])
    engine = EngineConfig(model="m", max_model_len=strategy["maxSeqLen"], attention=strategy["attention"],
                          kv_head_groups=strategy.get("kvHeadGroups"), kv_cache_dtype=strategy["kvCacheDtype"],
                          disable_kv_quant="kv-quant" in disable, eviction=strategy.get("eviction", "none"),
                          eviction_sinks=strategy.get("evictionSinks", 4),
                          eviction_window=strategy.get("evictionWindow", 1024))
    if refused:
        with pytest.raises(PlannerError, match=f"past the model's sliding window \\(4096 tokens\\).*{refused}"):
            preflight(spec, MISTRAL_V01)
        with pytest.raises(ValueError, match=refused):
            window_limit(engine, ModelConfig.from_dict(MISTRAL_V01))
    else:
        preflight(spec, MISTRAL_V01)
        window_limit(engine, ModelConfig.from_dict(MISTRAL_V01))
