"""int8 / fp8 caches with the 16-bit fallback reserve decode through the CUDA-graph path (worker/cuda_graphs.py):
steps whose sequences are all in the 8-bit pool go through the static buffers (rebased block ids, no host
split), steps with a sequence moved to the reserve run eagerly, split by pool; tokens equal those of the eager
engine that splits every step by pool on the host.

CPU: the runner's DecodeGraphs, uncaptured, replay the padded static forward eagerly (what a CUDA engine
replays). Runtime validation checks only the request 'in' (validation_sample_rate 0.5 samples request ids by
crc32: 'in' 0.37, 'out' 0.73); the corrupted 8-bit K scales (runtime guards' test hook) fail it at token EVERY,
it moves to the reserve and shares steps with 'out' (eager), and once it finishes 'out' decodes on graphs again.
The validation step itself goes through the graphs: they copy the validated layer's output (cuda_graphs.OutputTap).
"""

from __future__ import annotations

import pytest

from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.validation.runner import is_sampled
from kvpilot.engine.worker.cuda_graphs import DecodeGraphs, uncaptured_decode_graphs
from tests.parity import test_runtime_guards as guards
from tests.parity.helpers import engine_greedy

pytestmark = pytest.mark.parity

LENGTHS = {"in": 10, "out": 26}  # 'out' outlives 'in' on the reserve, so it returns to graph steps


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return guards.build_hf_checkpoint(tmp_path_factory.mktemp("kv-graphs") / "llama", "llama")


def guarded_engine(ckpt, kv: str, **kw) -> LLMEngine:
    eng = guards.engine(ckpt, kv_cache_dtype=kv, **{**guards.GUARDED, "validation_sample_rate": 0.5, **kw})
    guards.corrupt_k_scales(eng)
    return eng


def with_cpu_graphs(eng: LLMEngine) -> tuple[DecodeGraphs, list[tuple[str | None, int | None]]]:
    """Give the engine the decode graphs a CUDA engine captures (run eagerly here)."""
    graphs = uncaptured_decode_graphs(eng.runner)
    eng.runner.decode_graphs = graphs
    return graphs, record_steps(graphs)


def record_steps(graphs: DecodeGraphs) -> list[tuple[str | None, int | None]]:
    """Each decode step's (eager reason or None: through the graphs, exact-pool sequences), as they run."""
    steps: list[tuple[str | None, int | None]] = []
    decide = graphs.fallback_reason

    def recorded(ctx, num_tokens):
        reason = decide(ctx, num_tokens)
        if not ctx.num_prefill_tokens:
            steps.append((reason, ctx.exact_pool_seqs))
        return reason

    graphs.fallback_reason = recorded
    return steps


def split_on_the_host(eng: LLMEngine) -> None:
    """Leave the step's exact-pool sequences uncounted: every step is split by pool on the host, the
    eager path int8/fp8 with a reserve took before steps were counted (the reference here)."""
    prepare = eng.runner._prepare

    def uncounted(out, prev=None):
        ctx, *rest = prepare(out, prev)
        ctx.exact_pool_seqs = None
        return (ctx, *rest)

    eng.runner._prepare = uncounted


def generate(eng: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    return engine_greedy(eng, prompts, list(LENGTHS.values()), list(LENGTHS))


@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_fallback_mid_generation_through_graph_steps_matches_eager(ckpt, kv):
    assert is_sampled("in", 0.5) and not is_sampled("out", 0.5)
    prompts = [guards.prompt_of(40), guards.prompt_of(36, seed=1)]
    eager = guarded_engine(ckpt, kv)
    split_on_the_host(eager)
    want = generate(eager, prompts)
    eng = guarded_engine(ckpt, kv)
    assert len(eng.runner.kv_pool_sizes) == 2  # a 16-bit reserve beside the 8-bit pool
    graphs, steps = with_cpu_graphs(eng)
    got = generate(eng, prompts)
    feed = eng.stats()["validation"]
    print(kv, feed["fallbacks_total"], steps)
    assert got == want
    assert feed["fallbacks_total"][f"kv_{kv}"]["low_cosine"] == 1 == guards.fallbacks(feed, f"kv_{kv}")
    assert eager.stats()["validation"]["fallbacks_total"] == feed["fallbacks_total"]
    # 'in' after its fallback: the exact engine's continuation, recomputed on the reserve
    k = guards.EVERY + 1
    assert got[0][k:] == engine_greedy(guards.engine(ckpt), [prompts[0] + got[0][:k]], LENGTHS["in"] - k)[0]
    assert graphs.steps_total == check_steps(steps)
    assert eng.block_manager.num_used_blocks == 0


def check_steps(steps: list[tuple[str | None, int | None]]) -> int:
    """Graph steps only with every sequence in the 8-bit pool, eager ones while 'in' is on the reserve,
    graph steps before and after them; returns the number of graph steps."""
    replayed = [i for i, (reason, _) in enumerate(steps) if reason is None]
    on_reserve = [i for i, (reason, exact) in enumerate(steps) if exact]
    # the validation step (token EVERY) replays too: the graphs tap the validated layer, no hook is armed
    assert not [reason for reason, _ in steps if reason and "hook" in reason]
    assert all(steps[i][1] == 0 for i in replayed)
    assert on_reserve and all("fallback reserve" in steps[i][0] for i in on_reserve)
    # 'in''s decodes on the reserve ran eagerly (one fewer where its check was read a step later: CUDA's
    # async scheduling, validation_verdict=next_step)
    assert len(on_reserve) >= LENGTHS["in"] - guards.EVERY - 3
    assert replayed[0] < on_reserve[0] and replayed[-1] > on_reserve[-1]
    assert len(replayed) >= LENGTHS["out"] - LENGTHS["in"]
    return len(replayed)
