"""int8 / fp8 KV caches and auto switching in the running engine against the exact (fp32-cache) engine.

Same checkpoint, CPU fp32, the same token sequences teacher-forced through both engines' paged
paths (prefill, then decode steps: forced_logits.py), compared per generated position. Bounds
(docs/strategies.md, "KV quantisation in the engine"), measured on these tiny random checkpoints:
int8 logit cosine mean >= 0.99997 (min 0.99987), top-1 0.98-1.0; fp8 mean >= 0.9990 (min 0.9954),
top-1 0.94-0.97. Random logits have many near-ties, so top-1 is the looser of the two measures.
"""

from __future__ import annotations

import pytest

from kvpilot.engine.llm_engine import LLMEngine
from tests.helpers.forced_logits import compare_logits, teacher_forced_logits
from tests.helpers.models import build_hf_checkpoint
from tests.parity.helpers import engine_greedy, make_engine, random_length_prompts

pytestmark = pytest.mark.parity

BOUNDS = {  # kv_cache_dtype -> (min mean cosine, min per-position cosine, min top-1 agreement)
    "int8": (0.999, 0.99, 0.9),
    "fp8": (0.995, 0.98, 0.85),
}
# llama-gqa-hd32: head_dim 32, where int8 decode scores against the int8-rounded query (kv_quant/qk_policy.py)
VARIANTS = {"llama-mha": ("llama", 4, {}), "qwen2-gqa": ("qwen2", 2, {}),
            "llama-gqa-hd32": ("llama", 2, {"head_dim": 32, "hidden_size": 128})}
NEW_TOKENS = 24


def engine(path, **kw) -> LLMEngine:
    return make_engine(path, block_size=8, **kw)


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def checkpoint(request, tmp_path_factory):
    family, kv_heads, overrides = VARIANTS[request.param]
    path = build_hf_checkpoint(tmp_path_factory.mktemp(request.param), family, num_key_value_heads=kv_heads,
                               **overrides)
    prompts = random_length_prompts()
    continuations = engine_greedy(engine(path), prompts, NEW_TOKENS)
    exact = teacher_forced_logits(engine(path), prompts, continuations)
    return path, prompts, continuations, exact


@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_quantised_cache_tracks_exact(checkpoint, kv):
    path, prompts, continuations, exact = checkpoint
    if path.name.startswith("llama-gqa-hd32") and kv == "fp8":
        pytest.skip("the head_dim-32 variant is here for int8's query rounding; fp8 is bounded on the others")
    eng = engine(path, kv_cache_dtype=kv)
    assert eng.stats()["engine"]["kv_cache_dtype"] == kv
    got = compare_logits(exact, teacher_forced_logits(eng, prompts, continuations))
    print(f"{path.name} {kv}: {got}")
    mean, low, top1 = BOUNDS[kv]
    assert got["positions"] == len(prompts) * NEW_TOKENS
    assert got["cosine_mean"] >= mean and got["cosine_min"] >= low and got["top1"] >= top1, got
    assert got["cosine_mean"] < 1 - 1e-7, "the 8-bit cache changed nothing: is it really used?"


def test_chunked_prefill_over_the_8bit_cache_tracks_exact(checkpoint):
    """Chunks after a sequence's first attend to its cached 8-bit context through the dequantising prefill, with
    the step's longest chunk sizing the prefill grid (Context.max_seqlen_q); the whole stays within int8's bounds."""
    path, prompts, continuations, exact = checkpoint
    eng = engine(path, kv_cache_dtype="int8", max_num_batched_tokens=16, max_num_seqs=2)
    got = compare_logits(exact, teacher_forced_logits(eng, prompts, continuations))
    mean, low, top1 = BOUNDS["int8"]
    assert got["cosine_mean"] >= mean and got["cosine_min"] >= low and got["top1"] >= top1, got


def test_auto_switch_tracks_exact(checkpoint):
    """Under auto switching the later sequences of the batch run on int8 blocks; the batch as a whole
    stays within int8's bounds, and the sequences still on 16-bit blocks are exact."""
    path, prompts, continuations, exact = checkpoint
    eng = engine(path, kv_quant_auto_threshold=4, max_num_batched_tokens=512)
    got_logits = teacher_forced_logits(eng, prompts, continuations)
    got = compare_logits(exact, got_logits)
    print(f"{path.name} auto: {got}")
    mean, low, top1 = BOUNDS["int8"]
    assert got["cosine_mean"] >= mean and got["cosine_min"] >= low and got["top1"] >= top1, got
    # the first 4 admitted (one step admits all 8 here) got 16-bit blocks: identical to exact
    sixteen = compare_logits(exact[:4], got_logits[:4])
    assert sixteen["cosine_min"] > 1 - 1e-6 and sixteen["top1"] == 1.0, sixteen
    assert compare_logits(exact[4:], got_logits[4:])["cosine_mean"] < 1 - 1e-7


def test_kv_pool_holds_more_8bit_blocks(checkpoint):
    path, *_ = checkpoint
    budget = 1 << 20
    sizes = {kv: engine(path, kv_cache_dtype=kv, cpu_kv_cache_bytes=budget, fallback_reserve=0.0)
             for kv in ("auto", "int8", "fp8")}
    blocks = {kv: e.runner.num_kv_blocks for kv, e in sizes.items()}
    per_block = {kv: e.stats()["kv"]["bytes_per_block"] for kv, e in sizes.items()}
    # fp32 model on CPU: 4-byte K/V -> int8 is 1 byte per element + a 4-byte scale per head, fp8 1 byte
    head_dim = sizes["int8"].model_config.head_dim
    assert per_block["int8"] * 4 * head_dim == per_block["auto"] * (head_dim + 4)
    assert per_block["fp8"] * 4 == per_block["auto"]
    for kv in blocks:
        assert blocks[kv] == budget // per_block[kv]
        assert sizes[kv].stats()["memory_bytes"]["kv_pool"] <= budget
    for kv in ("int8", "fp8"):  # a 10% 16-bit fallback reserve takes its share of the same budget
        reserved = engine(path, kv_cache_dtype=kv, cpu_kv_cache_bytes=budget, fallback_reserve=0.1)
        n16, n8 = reserved.runner.kv_pool_sizes
        assert n8 == blocks[kv] - round(blocks[kv] * 0.1) and n16 >= 1
        assert reserved.stats()["memory_bytes"]["kv_pool"] <= budget


def test_disable_kv_quant_serves_the_16bit_cache(checkpoint):
    path, prompts, continuations, exact = checkpoint
    for kv in ("int8", "fp8"):
        eng = engine(path, kv_cache_dtype=kv, disable_kv_quant=True)
        assert eng.stats()["engine"]["kv_cache_dtype"] == "float32"
        got = compare_logits(exact[:2], teacher_forced_logits(eng, prompts[:2], continuations[:2]))
        assert got["cosine_min"] > 1 - 1e-6 and got["top1"] == 1.0


@pytest.mark.kernels
def test_quantised_engine_triton_interpreter_matches_torch_reference(checkpoint, monkeypatch):
    """The engine's int8 path (fixed, and auto switching with sequences on both pools) through the
    Triton kernels under the interpreter equals the torch reference path on the same forced tokens.
    Not bit-exact through the layers: the prefill kernels sum in another order, which can flip an
    int8 rounding at a .5 tie in a later layer (measured max |diff| 3e-4 on logits of ~1 with fp32 dots;
    3.2e-3 on the head_dim-32 variant with the default fp16 P x V and int8-rounded queries)."""
    import torch

    path, prompts, continuations, _ = checkpoint
    if path.name.startswith("qwen2"):
        pytest.skip("the interpreter is slow: one variant is enough here (tests/gpu runs the compiled kernels)")
    prompts, continuations = [p[:20] for p in prompts[:2]], [c[:4] for c in continuations[:2]]
    for kw in ({"kv_cache_dtype": "int8"}, {"kv_quant_auto_threshold": 1}):
        monkeypatch.setenv("KVPILOT_KERNELS", "torch")
        ref = teacher_forced_logits(engine(path, **kw), prompts, continuations)
        monkeypatch.setenv("KVPILOT_KERNELS", "triton")
        got = teacher_forced_logits(engine(path, **kw), prompts, continuations)
        for a, b in zip(ref, got, strict=True):
            # the kernel multiplies P x V in fp16 by default (~1e-3 relative per attention output)
            torch.testing.assert_close(b, a, rtol=0, atol=5e-3)
