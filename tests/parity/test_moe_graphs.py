"""DeepSeek (native MLA, absorbed decode, fused MoE) and MiniMax (lightning + softmax layers, fused MoE)
decode steps replay CUDA graphs (worker/cuda_graphs.py): the capture decision allows them, the padded
static-buffer forward a CUDA engine captures gives the eager engine's tokens, and with the Triton
kernels (interpreter on CPU) that forward dispatches no op that waits for the device.

CPU: the runner's DecodeGraphs, uncaptured, run the padded static forward eagerly (what a CUDA engine
replays). DeepSeek with --disable-mla decodes through the torch path (per-sequence `.tolist()` plans)
and stays eager.
"""

from __future__ import annotations

import os

import pytest

from kvpilot.engine.strategies.linear.strategy import kernel_decoded_state
from kvpilot.engine.strategies.mla.strategy import kernel_decoded_latent
from kvpilot.engine.worker.cuda_graphs import runner_fallback_reason
from tests.helpers.deepseek import build_deepseek_checkpoint
from tests.helpers.minimax import build_minimax_checkpoint
from tests.parity.helpers import engine_greedy, make_engine
from tests.parity.test_kv_quant_graphs import with_cpu_graphs
from tests.parity.test_mla_absorbed_engine import prompt_of
from tests.parity.test_mla_conversion_graphs import HOST_SYNCS, OpRecorder

pytestmark = pytest.mark.parity

SYNCS = (*HOST_SYNCS, "_unique2")  # torch.unique sizes its output on the host
MAX_SEQS = 4  # buckets 1, 2, 4: three sequences decode padded to 4


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("moe-graphs")
    return {
        "deepseek_v2": str(build_deepseek_checkpoint(root / "v2", version=2, seed=4)),
        "deepseek_v3": str(build_deepseek_checkpoint(root / "v3", version=3, seed=5)),
        "minimax": str(build_minimax_checkpoint(root / "minimax")),
    }


def engine(path: str, **kw):
    return make_engine(path, **{"device": "cpu", "dtype": "float32", "block_size": 8, "num_kv_blocks": 128,
                                "max_num_seqs": MAX_SEQS, **kw})  # fmt: skip


@pytest.mark.parametrize("family", ["deepseek_v2", "deepseek_v3", "minimax"])
def test_moe_families_are_captured(models: dict[str, str], family: str) -> None:
    runner = engine(models[family]).runner
    assert runner.model_config.family == family
    assert runner_fallback_reason(runner, device_type="cuda") is None
    if family == "minimax":
        assert kernel_decoded_state(runner) and runner.linear_state is not None
    else:
        assert kernel_decoded_latent(runner) and runner.mla.mode == "native"


def test_unabsorbed_mla_stays_eager(models: dict[str, str]) -> None:
    runner = engine(models["deepseek_v2"], disable_mla=True).runner
    reason = runner_fallback_reason(runner, device_type="cuda")
    assert not kernel_decoded_latent(runner) and reason is not None and "MLA" in reason


@pytest.mark.parametrize("family", ["deepseek_v2", "deepseek_v3", "minimax"])
def test_decode_through_graph_steps_matches_eager(models: dict[str, str], family: str) -> None:
    """Three sequences (padded to bucket 4) finishing at different steps (buckets 2 and 1 follow)."""
    prompts = [prompt_of(23), prompt_of(9, seed=1), prompt_of(31, seed=2)]
    lengths = [12, 7, 4]
    want = engine_greedy(engine(models[family]), prompts, lengths)
    eng = engine(models[family])
    graphs, steps = with_cpu_graphs(eng)
    assert engine_greedy(eng, prompts, lengths) == want
    replayed = [reason for reason, _ in steps if reason is None]
    assert len(replayed) == graphs.steps_total >= max(lengths) - 2, steps
    assert eng.block_manager.num_used_blocks == 0


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs the Triton kernels on CPU (interpreter)")
@pytest.mark.parametrize("family", ["deepseek_v3", "minimax"])
def test_graph_steps_hold_no_host_sync(models: dict[str, str], monkeypatch, family: str) -> None:
    """The static forward with the Triton kernels (fused MoE, mla_decode / lightning decode, stores)
    dispatches no op that waits for the device: a CUDA capture would fail on one."""
    monkeypatch.setenv("KVPILOT_KERNELS", "triton")
    eng = engine(models[family])
    graphs, _ = with_cpu_graphs(eng)
    recorder, forward = OpRecorder(), graphs._forward

    def recorded(bucket: int) -> None:
        with recorder:
            forward(bucket)

    graphs._forward = recorded
    engine_greedy(eng, [prompt_of(19), prompt_of(11, seed=1), prompt_of(7, seed=2)], 3)
    assert graphs.steps_total >= 2
    syncs = {op: n for op, n in recorder.ops.items() if op.split("::")[-1].split(".")[0] in SYNCS}
    assert recorder.ops and syncs == {}, syncs


def test_the_torch_moe_path_would_sync(models: dict[str, str]) -> None:
    """The test above can fail: the CPU reference (KVPILOT_KERNELS=torch) routes with unique().tolist()."""
    eng = engine(models["deepseek_v2"])
    graphs, _ = with_cpu_graphs(eng)
    recorder, forward = OpRecorder(), graphs._forward

    def recorded(bucket: int) -> None:
        with recorder:
            forward(bucket)

    graphs._forward = recorded
    engine_greedy(eng, [prompt_of(19)], 3)
    assert any(op.split("::")[-1].split(".")[0] in SYNCS for op in recorder.ops), recorder.ops
