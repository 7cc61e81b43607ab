"""Kernels fed per-step metadata compile once: their Triton specialisation key does not move with it.

Triton compiles a variant per specialisation key (tests/helpers/specialization.py). Before session 9
the key moved with the number of tokens stored (1 when one sequence decodes alone) and with the 16-byte
alignment of index tensors that are slices of persistent buffers, so an eager engine on the H200
compiled 32 variants during its first decode round (a 457 ms step). `kernels/specialization.step_kernel`
keeps those arguments out of the key; these tests run the kernels in the interpreter and record keys.
"""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.kernels.store_kvcache.launcher import store_kvcache_triton
from kvpilot.engine.sampling_params import SamplingParams
from tests.helpers.models import build_hf_checkpoint
from tests.helpers.specialization import recording
from tests.kernels.paged_cases import DEVICE, make_paged_case
from tests.parity.helpers import make_engine

pytestmark = pytest.mark.kernels


def test_store_compiles_once_for_any_token_count_and_slot_offset() -> None:
    case = make_paged_case([64], 2, 64, 16, torch.float32)
    slots = torch.arange(64, dtype=torch.int32, device=DEVICE)
    rows = torch.randn(64, 2, 64, device=DEVICE)
    with recording() as recorder:
        for start, count in [(0, 16), (1, 1), (3, 7), (0, 1), (5, 32)]:  # aligned, not, 1, divisible by 16
            store_kvcache_triton(rows[:count], rows[:count], case.k_cache, case.v_cache, slots[start:start + count])
    assert len(recorder.seen["_store_kvcache_kernel"]) == 1, recorder.new


def run_round(eng, prompts: list[list[int]], new: int, tag: str) -> None:  # type: ignore[no-untyped-def]
    params = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True)
    for i, p in enumerate(prompts):
        eng.add_request(f"{tag}-{i}", p, params)
    while eng.has_unfinished_requests():
        eng.step()


def test_engine_compiles_nothing_after_its_first_workload(tmp_path, monkeypatch) -> None:
    """A first workload compiles the variants; a second one of other sizes (batch, prompt lengths, so
    other slice offsets, token counts and a sequence decoding alone) compiles none."""
    monkeypatch.setenv("KVPILOT_KERNELS", "triton")
    path = build_hf_checkpoint(tmp_path / "llama", "llama", seed=1)
    # fused_gemv_rows 4: the first round's decode steps (3 rows) compile the fused GEMV too, and the second
    # round's (4 rows, then 1 alone) must not recompile it by row count (with the default 1, the first
    # round would never launch it: it first compiles when a sequence decodes alone)
    eng = make_engine(path, device="cpu", dtype="float32", max_num_seqs=4, max_num_batched_tokens=64,
                      enable_prefix_caching=False, validation_sample_rate=0.0, fused_gemv_rows=4)  # fmt: skip
    with recording() as recorder:
        run_round(eng, [[3 + (i * 5 + j) % 200 for j in range(18 + 3 * i)] for i in range(3)], 6, "first")
        first = recorder.take_new()
        run_round(eng, [[7 + (i * 11 + j) % 200 for j in range(9 + 5 * i)] for i in range(4)], 9, "second")
        second = recorder.take_new()
    assert {name for name, _ in first} >= {"_paged_decode_kernel", "_rotary_kernel", "_gemv_norm_kernel"}
    assert "_store_kvcache_kernel" not in {name for name, _ in first}  # the rotary kernel writes the K/V
    assert second == [], f"the second workload compiled new variants: {second}"


def test_the_server_warm_up_compiles_what_a_lone_request_needs(tmp_path, monkeypatch) -> None:
    """The server's warm-up runs a sequence decoding alone too: with the default fused_gemv_rows (1) that
    step has its own kernel (kernels/gemv_norm), which the first lone client would otherwise compile."""
    from kvpilot.engine.server.runtime.warmup import warm_up

    monkeypatch.setenv("KVPILOT_KERNELS", "triton")
    path = build_hf_checkpoint(tmp_path / "llama", "llama", seed=2)
    eng = make_engine(path, device="cpu", dtype="float32", max_num_seqs=4, enable_prefix_caching=False,
                      validation_sample_rate=0.0)  # fmt: skip
    assert eng.config.fused_gemv_rows == 1
    with recording() as recorder:
        timings = warm_up(eng)
        warmed = recorder.take_new()
        run_round(eng, [[5 + j % 100 for j in range(13)]], 5, "alone")
        later = recorder.take_new()
    assert set(timings) == {"generate_seconds", "alone_seconds", "score_seconds"}
    assert "_gemv_norm_kernel" in {name for name, _ in warmed}
    assert later == [], f"a lone request after the warm-up compiled new variants: {later}"
