"""GPU tier: DeepSeek (native MLA, fused MoE) and MiniMax (lightning + softmax, fused MoE) on CUDA.

Run on the device machine: `pytest -m gpu tests/gpu/test_moe_graphs_gpu.py -q -s`.
- fp32 engines with CUDA graphs give the eager engine's tokens, every decode step replayed (buckets
  1, 2, 4, 8; requests finishing one by one run padded and exact buckets), and HF's greedy tokens;
- the fused MoE kernels at DeepSeek-V2-Lite's and MiniMax-Text-01's layer sizes (bf16, the tiles
  the engine launches) against the torch reference, relative error printed.
"""

from __future__ import annotations

import random

import pytest

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.worker.cuda_graphs import graph_batch_sizes
from tests.helpers.deepseek import build_deepseek_checkpoint
from tests.helpers.minimax import build_minimax_checkpoint
from tests.helpers.models import hf_greedy
from tests.parity.helpers import engine_greedy

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
MAX_SEQS = 8
BUILD = {
    "deepseek_v2": lambda root: build_deepseek_checkpoint(root, version=2, seed=4),
    "deepseek_v3": lambda root: build_deepseek_checkpoint(root, version=3, seed=5),
    "minimax": lambda root: build_minimax_checkpoint(root),
}


@pytest.fixture(scope="module", params=list(BUILD))
def checkpoint(request, tmp_path_factory):
    path = BUILD[request.param](tmp_path_factory.mktemp(request.param))
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 384) for _ in range(rng.randrange(4, 60))] for _ in range(7)]
    lengths = [6 + 2 * i for i in range(7)]
    return path, prompts, lengths


def engine(path, graphs: bool) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(path), device="cuda", dtype="float32", show_progress=False,
                                  num_kv_blocks=256, max_model_len=256, max_num_seqs=MAX_SEQS, cuda_graphs=graphs))


def test_fp32_graphs_match_eager_and_hf(checkpoint):
    path, prompts, lengths = checkpoint
    eager = engine(path, False)
    assert eager.runner.decode_graphs is None
    want = engine_greedy(eager, prompts, lengths)
    eng = engine(path, True)
    graphs = eng.runner.decode_graphs
    assert graphs is not None and sorted(graphs.graphs) == graph_batch_sizes(MAX_SEQS)
    got = engine_greedy(eng, prompts, lengths)
    print(f"{path.name}: {graphs.replays_total} replays of {graphs.steps_total} graph steps")
    assert got == want
    assert graphs.replays_total == graphs.steps_total >= max(lengths) - 2
    assert eng.block_manager.num_used_blocks == 0
    hf = hf_greedy(path, prompts[:3], 6)
    assert [g[:6] for g in got[:3]] == hf


@pytest.mark.parametrize(("hidden", "inter", "experts", "top_k", "tokens"), [
    (2048, 1408, 64, 6, 1), (2048, 1408, 64, 6, 64), (2048, 1408, 64, 6, 256), (2048, 1408, 64, 6, 2048),
    (6144, 9216, 32, 2, 64),
])  # fmt: skip
def test_fused_moe_at_model_sizes(hidden: int, inter: int, experts: int, top_k: int, tokens: int) -> None:
    from kvpilot.engine.kernels.fused_moe.launcher import fused_moe_triton
    from kvpilot.engine.kernels.fused_moe.reference import fused_moe_reference

    gen = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, hidden, device="cuda", generator=gen).bfloat16()
    w13 = (torch.randn(experts, 2 * inter, hidden, device="cuda", generator=gen) * hidden**-0.5).bfloat16()
    w2 = (torch.randn(experts, hidden, inter, device="cuda", generator=gen) * inter**-0.5).bfloat16()
    scores = torch.rand(tokens, experts, device="cuda", generator=gen)
    weights, ids = scores.softmax(-1).topk(top_k, dim=-1)
    got = fused_moe_triton(x, w13, w2, weights, ids)
    want = fused_moe_reference(x, w13, w2, weights, ids)
    err = ((got.float() - want.float()).norm() / want.float().norm()).item()
    print(f"fused_moe H {hidden} I {inter} E {experts} k {top_k} T {tokens}: rel err {err:.2e}")
    assert err < 1e-2
