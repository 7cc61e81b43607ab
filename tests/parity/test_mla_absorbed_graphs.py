"""The MLA conversion with partial RoPE (absorbed decode) decodes through the CUDA-graph path
(worker/cuda_graphs.py, `absorbed_conversion`): decode-only steps go through the static buffers, with its
fallback reserve too (block ids rebased on the device); steps with a sequence on the reserve, or a
validation hook, run eagerly. Tokens equal the eager engine's.

CPU: the runner's DecodeGraphs, uncaptured, run the padded static forward eagerly (what a CUDA engine
replays). The MLA conversion with RoPE on every dim still refuses graphs (it plans each step on the host).
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
from torch.utils._python_dispatch import TorchDispatchMode

from kvpilot.engine.worker.cuda_graphs import (
    _kv_kind,
    absorbed_conversion,
    engine_fallback_reason,
    graph_attention,
)
from tests.helpers.models import build_hf_checkpoint
from tests.parity.helpers import engine_greedy, make_engine
from tests.parity.test_kv_quant_graphs import with_cpu_graphs
from tests.parity.test_mla_absorbed_engine import prompt_of
from tests.unit.test_cuda_graphs import PLAIN

pytestmark = pytest.mark.parity

ABSORBED = {"attention": "mla", "latent_rank": 12, "mla_rope_dims": 4}
# rank 1 fails its check at token EVERY; 'b' is validated (rate 0.5 by request id: crc32), 'a' is not
GUARDED = {"validate_every": 4, "validation_sample_rate": 0.5, "validation_threshold": 0.92, "fallback_reserve": 0.5}
LENGTHS = {"a": 26, "b": 10}  # 'a' outlives 'b' on the reserve, so it returns to graph steps


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> str:
    # test_mla_absorbed_engine's checkpoint: 4 query heads on 2 KV heads of head_dim 16, hidden 64
    return str(build_hf_checkpoint(tmp_path_factory.mktemp("llama-gqa"), "llama", seed=2, num_key_value_heads=2))


def engine(path: str, **kw):
    return make_engine(path, **{"device": "cpu", "block_size": 8, "num_kv_blocks": 256, **kw})


def capture_reason(runner) -> str | None:
    """engine_fallback_reason for this runner as a CUDA engine of the same make would see it."""
    return engine_fallback_reason(**{
        **PLAIN, "kv_kind": _kv_kind(runner), "plain_attention": graph_attention(runner),
        "latent_cache": runner.mla.latent_width is not None and not absorbed_conversion(runner),
    })  # fmt: skip


@pytest.mark.parametrize("reserve", [0.0, 0.5])
def test_only_the_absorbed_conversion_is_captured(llama: str, reserve: float) -> None:
    absorbed = engine(llama, **ABSORBED, fallback_reserve=reserve).runner
    assert absorbed_conversion(absorbed) and capture_reason(absorbed) is None
    assert len(absorbed.kv_pool_sizes) == (2 if reserve else 1)
    every_dim = engine(llama, attention="mla", latent_rank=12, fallback_reserve=reserve).runner
    reason = capture_reason(every_dim)
    assert not absorbed_conversion(every_dim) and reason is not None
    assert ("conversion's fallback reserve" if reserve else "per-step decode plans") in reason


def test_absorbed_decode_through_graph_steps_matches_eager(llama: str) -> None:
    prompts = [prompt_of(40), prompt_of(33, seed=2)]
    want = engine_greedy(engine(llama, **ABSORBED), prompts, 12)
    eng = engine(llama, **ABSORBED)
    graphs, steps = with_cpu_graphs(eng)
    assert engine_greedy(eng, prompts, 12) == want
    replayed = [reason for reason, _ in steps if reason is None]
    assert len(replayed) == graphs.steps_total >= 10, steps


def test_fallback_mid_generation_through_graph_steps_matches_eager(llama: str) -> None:
    """'b' fails its check, moves to the K/V reserve and shares steps with 'a' (eager); before and after,
    'a' decodes through the static path over the rebased latent pool."""
    mla = {**ABSORBED, "latent_rank": 1, "mla_rope_dims": 2, **GUARDED}
    prompts = [prompt_of(40), prompt_of(33, seed=2)]
    want = engine_greedy(engine(llama, **mla), prompts, list(LENGTHS.values()), list(LENGTHS))
    eng = engine(llama, **mla)
    assert len(eng.runner.kv_pool_sizes) == 2
    graphs, steps = with_cpu_graphs(eng)
    got = engine_greedy(eng, prompts, list(LENGTHS.values()), list(LENGTHS))
    feed = eng.stats()["validation"]
    assert got == want
    assert feed["fallbacks_total"]["mla"]["low_cosine"] == 1, feed
    replayed = [i for i, (reason, _) in enumerate(steps) if reason is None]
    on_reserve = [i for i, (reason, exact) in enumerate(steps) if exact]
    assert all(steps[i][1] == 0 for i in replayed)
    assert on_reserve and all("fallback reserve" in steps[i][0] for i in on_reserve)
    assert replayed[0] < on_reserve[0] and replayed[-1] > on_reserve[-1], steps
    assert graphs.steps_total == len(replayed)
    assert eng.block_manager.num_used_blocks == 0


HOST_SYNCS = ("nonzero", "_local_scalar_dense", "item", "masked_select", "unique", "bincount")


class OpRecorder(TorchDispatchMode):
    """Names of the aten ops a forward dispatches."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.name()] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs the Triton kernels on CPU (interpreter)")
@pytest.mark.parametrize(("extra", "absorbed"), [({"mla_rope_dims": 4}, True),
                                                  ({"mla_rope_dims": 4, "fallback_reserve": 0.5}, True),
                                                  ({}, False)])  # fmt: skip
def test_graph_steps_hold_no_host_sync(llama: str, monkeypatch, extra: dict, absorbed: bool) -> None:
    """What a CUDA engine captures is the static forward with the Triton kernels: for the absorbed
    conversion it dispatches no op that waits for the device (a capture would fail on one); the
    conversion with RoPE on every dim plans its step on the host (`.item()`), hence its refusal."""
    monkeypatch.setenv("KVPILOT_KERNELS", "triton")
    eng = engine(llama, attention="mla", latent_rank=12, **{"fallback_reserve": 0.0, **extra})
    graphs, _ = with_cpu_graphs(eng)
    recorder, forward = OpRecorder(), graphs._forward

    def recorded(bucket: int) -> None:
        with recorder:
            forward(bucket)

    graphs._forward = recorded
    engine_greedy(eng, [prompt_of(27), prompt_of(21, seed=1)], 4)
    assert graphs.steps_total >= 2
    syncs = {op: n for op, n in recorder.ops.items() if op.split("::")[-1].split(".")[0] in HOST_SYNCS}
    assert (syncs == {}) if absorbed else syncs, syncs
