"""MLA conversions whose decode is a Triton kernel replay CUDA graphs (worker/cuda_graphs.py,
`kernel_decoded_conversion`): partial RoPE (absorbed, kernels/mla_decode) and RoPE on every dim where the
fused kernel fits the head (kernels/mla_conversion: head dims 32/64/128/256). Decode-only steps go through
the static buffers, with the conversion's fallback reserve too (block ids rebased on the device); steps
with a sequence on the reserve, or a validation hook, run eagerly. Tokens equal the eager engine's.

CPU: the runner's DecodeGraphs, uncaptured, run the padded static forward eagerly (what a CUDA engine
replays). A head dim the fused kernel cannot tile (16 here) keeps the torch decode, which plans each step
on the host, and refuses graphs.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
from torch.utils._python_dispatch import TorchDispatchMode

from kvpilot.engine.strategies.mla.strategy import kernel_decoded_conversion
from kvpilot.engine.worker.cuda_graphs import runner_fallback_reason
from tests.helpers.models import build_hf_checkpoint
from tests.parity.helpers import engine_greedy, make_engine
from tests.parity.test_kv_quant_graphs import with_cpu_graphs
from tests.parity.test_mla_absorbed_engine import prompt_of

pytestmark = pytest.mark.parity

ABSORBED = {"attention": "mla", "latent_rank": 12, "mla_rope_dims": 4}  # partial RoPE (head_dim 16 model)
EVERY_DIM = {"attention": "mla", "latent_rank": 24}  # RoPE on every dim (head_dim 32 model: the fused kernel)
# rank 1 fails its check at token EVERY; 'b' is validated (rate 0.5 by request id: crc32), 'a' is not
GUARDED = {"validate_every": 4, "validation_sample_rate": 0.5, "validation_threshold": 0.92, "fallback_reserve": 0.5}
LENGTHS = {"a": 26, "b": 10}  # 'a' outlives 'b' on the reserve, so it returns to graph steps


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[int, str]:
    """head_dim -> checkpoint: test_mla_absorbed_engine's (4 query heads on 2 KV heads of 16, hidden 64), and
    the same heads of 32 (q_proj 64 -> 128)."""
    root = tmp_path_factory.mktemp("mla-graphs")
    return {16: str(build_hf_checkpoint(root / "d16", "llama", seed=2, num_key_value_heads=2)),
            32: str(build_hf_checkpoint(root / "d32", "llama", seed=2, num_key_value_heads=2, head_dim=32))}  # fmt: skip


CASES = {"partial-rope": (16, ABSORBED), "every-dim": (32, EVERY_DIM)}


def engine(path: str, **kw):
    return make_engine(path, **{"device": "cpu", "block_size": 8, "num_kv_blocks": 256, **kw})


def capture_reason(runner) -> str | None:
    """Why this runner would stay eager as a CUDA engine of the same make (None: it captures)."""
    return runner_fallback_reason(runner, device_type="cuda")


@pytest.mark.parametrize("reserve", [0.0, 0.5])
def test_kernel_decoded_conversions_are_captured(models: dict[int, str], reserve: float) -> None:
    for head_dim, mla in CASES.values():
        runner = engine(models[head_dim], **mla, fallback_reserve=reserve).runner
        assert kernel_decoded_conversion(runner) and capture_reason(runner) is None, (head_dim, mla)
        assert len(runner.kv_pool_sizes) == (2 if reserve else 1)
    torch_decoded = engine(models[16], **EVERY_DIM, fallback_reserve=reserve).runner  # head_dim 16: no kernel
    reason = capture_reason(torch_decoded)
    assert not kernel_decoded_conversion(torch_decoded) and reason is not None
    assert "per-step decode plans" in reason  # the MLA strategy's blocker, with a reserve or without


@pytest.mark.parametrize("case", list(CASES))
def test_decode_through_graph_steps_matches_eager(models: dict[int, str], case: str) -> None:
    head_dim, mla = CASES[case]
    prompts = [prompt_of(40), prompt_of(33, seed=2)]
    want = engine_greedy(engine(models[head_dim], **mla), prompts, 12)
    eng = engine(models[head_dim], **mla)
    graphs, steps = with_cpu_graphs(eng)
    assert engine_greedy(eng, prompts, 12) == want
    replayed = [reason for reason, _ in steps if reason is None]
    assert len(replayed) == graphs.steps_total >= 10, steps


@pytest.mark.parametrize("case", list(CASES))
def test_fallback_mid_generation_through_graph_steps_matches_eager(models: dict[int, str], case: str) -> None:
    """'b' fails its check, moves to the K/V reserve and shares steps with 'a' (eager); before and after,
    'a' decodes through the static path over the rebased latent pool."""
    head_dim, mla = CASES[case]
    mla = {**mla, "latent_rank": 1, **({"mla_rope_dims": 2} if "mla_rope_dims" in mla else {}), **GUARDED,
           "num_kv_blocks": 4096}  # a rank-1 latent block is 1/128 of a K/V block: the reserve needs the count

    path = models[head_dim]
    prompts = [prompt_of(40), prompt_of(33, seed=2)]
    want = engine_greedy(engine(path, **mla), prompts, list(LENGTHS.values()), list(LENGTHS))
    eng = engine(path, **mla)
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
@pytest.mark.parametrize(("head_dim", "extra", "kernel"), [
    (16, {**ABSORBED, "fallback_reserve": 0.0}, True),
    (16, {**ABSORBED, "fallback_reserve": 0.5}, True),
    (32, {**EVERY_DIM, "fallback_reserve": 0.5}, True),
    (16, {**EVERY_DIM, "fallback_reserve": 0.0}, False),
])  # fmt: skip
def test_graph_steps_hold_no_host_sync(models, monkeypatch, head_dim: int, extra: dict, kernel: bool) -> None:
    """What a CUDA engine captures is the static forward with the Triton kernels: for a kernel-decoded
    conversion it dispatches no op that waits for the device (a capture would fail on one); the torch
    decode plans its step on the host (`.item()`), hence its refusal."""
    monkeypatch.setenv("KVPILOT_KERNELS", "triton")
    eng = engine(models[head_dim], **extra)
    assert kernel_decoded_conversion(eng.runner) == kernel
    graphs, _ = with_cpu_graphs(eng)
    recorder, forward = OpRecorder(), graphs._forward

    def recorded(bucket: int) -> None:
        with recorder:
            forward(bucket)

    graphs._forward = recorded
    engine_greedy(eng, [prompt_of(27), prompt_of(21, seed=1)], 4)
    assert graphs.steps_total >= 2
    syncs = {op: n for op, n in recorder.ops.items() if op.split("::")[-1].split(".")[0] in HOST_SYNCS}
    assert (syncs == {}) if kernel else syncs, syncs
