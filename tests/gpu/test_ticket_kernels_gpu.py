"""GPU tier: the kernels whose last program reduces (kernels/tickets.py) compiled on CUDA: the fused
small-batch GEMV + add + RMSNorm (kernels/gemv_norm) and the folded paged-decode split reduction.

Run on the device machine: `pytest -m gpu tests/gpu/test_ticket_kernels_gpu.py -q -s`. The ticket protocol
(partials stored, CTA barrier, acquire-release ticket, the last program reduces) is what the interpreter
cannot check: many launches at Llama-3-8B's o_proj and down_proj shapes must each equal the first
bit for bit (a program that read a partial before it was visible would differ now and then), eagerly
and replayed from a CUDA graph; an engine with fused_gemv_rows replays the same tokens as without.
"""

from __future__ import annotations

import pytest

from tests.helpers.forced_logits import compare_logits, teacher_forced_logits
from tests.helpers.models import build_hf_checkpoint

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
SHAPES = {"o_proj": (4096, 4096, False), "down_proj": (4096, 14336, True)}  # name -> (n, k, silu input)


def _inputs(rows: int, n: int, k: int, silu: bool) -> tuple:
    gen = torch.Generator(device="cuda").manual_seed(n + k + rows)
    x = torch.randn(rows, 2 * k if silu else k, device="cuda", generator=gen).bfloat16()
    w = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5).bfloat16()
    res = torch.randn(rows, n, device="cuda", generator=gen).bfloat16()
    return x, w, res, (1 + 0.1 * torch.randn(n, device="cuda", generator=gen)).bfloat16()


@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize("rows", [1, 4])
def test_every_launch_equals_the_first_and_the_composition(name: str, rows: int) -> None:
    from kvpilot.engine.kernels.gemv_norm.launcher import GemvConfig, linear_add_rmsnorm_triton
    from kvpilot.engine.kernels.gemv_norm.reference import linear_add_rmsnorm_reference

    n, k, silu = SHAPES[name]
    x, w, res, norm_w = _inputs(rows, n, k, silu)
    want, want_sum = linear_add_rmsnorm_reference(x, w, res, norm_w, 1e-5, silu)
    for cfg in (None, GemvConfig(block_n=16, block_k=256, split_k=4), GemvConfig(block_n=32, block_k=128, split_k=2),
                GemvConfig(block_n=16, block_k=512, split_k=2, split_epilogue=True),
                GemvConfig(block_n=32, block_k=512, split_k=1, split_epilogue=True)):  # fmt: skip
        first, first_sum = linear_add_rmsnorm_triton(x, w, res, norm_w, 1e-5, silu, cfg)
        rel = ((first_sum.float() - want_sum.float()).norm() / want_sum.float().norm()).item()
        assert rel < 1e-2, (cfg, rel)  # bf16 y rounded once either way; cuBLAS sums K in another order
        for _ in range(300):
            out, total = linear_add_rmsnorm_triton(x, w, res, norm_w, 1e-5, silu, cfg)
            assert torch.equal(total, first_sum) and torch.equal(out, first), cfg
        torch.testing.assert_close(first.float(), want.float(), rtol=0.05, atol=0.05)


def test_a_graph_replay_equals_the_eager_launch() -> None:
    from kvpilot.engine.kernels import linear_add_rmsnorm

    n, k, silu = SHAPES["down_proj"]
    x, w, res, norm_w = _inputs(1, n, k, silu)
    eager = linear_add_rmsnorm(x, w, res, norm_w, 1e-5, silu)  # also allocates the counters outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = linear_add_rmsnorm(x, w, res, norm_w, 1e-5, silu)
    for _ in range(50):
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(captured, eager, strict=True))


@pytest.mark.parametrize("graphs", [False, True])
def test_an_engine_with_fused_gemv_rows_gives_the_unfused_logits(tmp_path, graphs: bool) -> None:
    from kvpilot.engine.config import EngineConfig
    from kvpilot.engine.llm_engine import LLMEngine

    path = build_hf_checkpoint(tmp_path, "llama", seed=7, num_key_value_heads=2)
    prompts = [[3 + (i * 7 + j) % 300 for j in range(20 + 9 * i)] for i in range(4)]
    continuations = [[5 + (i + j) % 200 for j in range(12)] for i in range(4)]

    def engine(**kw) -> LLMEngine:
        return LLMEngine(EngineConfig(model=str(path), device="cuda", dtype="bfloat16", show_progress=False,
                                      num_kv_blocks=256, max_model_len=512, max_num_seqs=8, cuda_graphs=graphs, **kw))

    ref = teacher_forced_logits(engine(fused_gemv_rows=0), prompts, continuations)
    got = teacher_forced_logits(engine(fused_gemv_rows=8), prompts, continuations)
    result = compare_logits(ref, got)
    assert result["cosine_min"] > 0.999 and result["top1"] >= 0.95, result


@pytest.mark.parametrize(("batch", "context", "splits"), [(1, 512, 8), (4, 3000, 16), (64, 700, 2)])
def test_the_folded_decode_reduction_equals_the_reduce_launch(batch: int, context: int, splits: int) -> None:
    from kvpilot.engine.kernels.paged_decode.heuristics import DecodeConfig
    from kvpilot.engine.kernels.paged_decode.launcher import paged_attention_decode_triton

    torch.manual_seed(batch)
    blocks = batch * (context // 16 + 1)
    k_cache, v_cache = (torch.randn(blocks, 16, 8, 128, device="cuda").bfloat16() for _ in range(2))
    tables = torch.randperm(blocks, device="cuda").int().view(batch, -1)
    lens = torch.randint(1, context, (batch,), device="cuda").int()
    q = torch.randn(batch, 32, 128, device="cuda").bfloat16()
    args = (q, k_cache, v_cache, tables, lens, 128**-0.5)
    want = paged_attention_decode_triton(*args, DecodeConfig(num_splits=splits))
    fold = DecodeConfig(num_splits=splits, fold_reduce=True)
    first = paged_attention_decode_triton(*args, fold)
    torch.testing.assert_close(first.float(), want.float(), rtol=0, atol=2e-2)  # bf16 out, fp32 combine
    for _ in range(300):
        assert torch.equal(paged_attention_decode_triton(*args, fold), first)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = paged_attention_decode_triton(*args, fold)
    for _ in range(50):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, first)
