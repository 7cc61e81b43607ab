"""Sampled steps go through the CUDA-graph path: gqa_head_utilization (16-bit cache) reads the query rows the
rotary kernel taps (cuda_graphs.QueryTap) after the replay, instead of hooking the layer and forcing the step
eager; its values and the tokens equal those of the engine without graphs.

CPU: the runner's DecodeGraphs, uncaptured, run the padded static forward eagerly (what a CUDA engine
replays); a hook that a replay would skip makes a step eager ("a forward hook is armed"), so a sampled step
that replays here replays on CUDA too. tests/gpu/test_cuda_graphs_gpu.py holds the captured engines.
Runtime validation of 8-bit caches through the graphs: tests/parity/test_kv_quant_graphs.py.
"""

from __future__ import annotations

import pytest

from kvpilot.engine.worker.cuda_graphs import uncaptured_decode_graphs
from tests.helpers.models import build_hf_checkpoint
from tests.parity.helpers import engine_greedy, make_engine
from tests.parity.test_kv_quant_graphs import record_steps

pytestmark = pytest.mark.parity

PROMPTS = [[(i * 37 + 11) % 370 + 3 for i in range(30)], [(i * 13 + 5) % 370 + 3 for i in range(19)]]
EVERY = 2


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_hf_checkpoint(tmp_path_factory.mktemp("sampled-graphs") / "llama", "llama")


def sampled_engine(ckpt):
    return make_engine(ckpt, device="cpu", head_utilization_every=EVERY, max_num_seqs=4, num_kv_blocks=64)


def test_head_utilization_samples_replayed_steps_as_the_eager_engine(ckpt):
    eager = sampled_engine(ckpt)
    want = engine_greedy(eager, PROMPTS, 12)
    eng = sampled_engine(ckpt)
    graphs = eng.runner.decode_graphs = uncaptured_decode_graphs(eng.runner)
    assert graphs.query_tap is not None
    steps = record_steps(graphs)
    got = engine_greedy(eng, PROMPTS, 12)
    assert got == want
    sampler, reference = eng.checks.head_utilization, eager.checks.head_utilization
    assert sampler.samples_total == reference.samples_total >= 5
    assert sampler.values.keys() == reference.values.keys()
    for layer, values in reference.values.items():
        assert sampler.values[layer] == pytest.approx(values, rel=1e-5)
    assert steps and all(reason is None for reason, _ in steps)  # every decode step, sampled or not, replayed
    assert graphs.steps_total == len(steps)


def test_query_tap_leaves_8bit_caches_and_sampling_off_alone(ckpt):
    assert uncaptured_decode_graphs(make_engine(ckpt, device="cpu", head_utilization_every=0).runner).query_tap is None
    int8 = make_engine(ckpt, device="cpu", kv_cache_dtype="int8", head_utilization_every=EVERY)
    graphs = uncaptured_decode_graphs(int8.runner)
    assert graphs.query_tap is None and graphs.tap is not None  # validation's output tap instead
