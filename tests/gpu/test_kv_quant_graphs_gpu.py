"""GPU tier: int8 / fp8 caches with the 16-bit fallback reserve capture CUDA graphs; a sequence that runtime
validation moves to the reserve mid-generation runs eagerly, the others keep replaying.

Run on the device machine: `pytest -m gpu tests/gpu/test_kv_quant_graphs_gpu.py -q -s`.
The scenario of tests/parity/test_kv_quant_graphs.py (corrupted 8-bit K scales, only request 'in' validated)
with real captures, fp32: the graphs are re-captured after the corruption hook is installed, so replays
negate the scales as the eager steps do; the reference engine splits every step by pool on the host.
"""

from __future__ import annotations

import pytest

from kvpilot.engine.worker.cuda_graphs import build_decode_graphs, graph_batch_sizes
from tests.parity import test_runtime_guards as guards
from tests.parity.test_kv_quant_graphs import (
    LENGTHS,
    check_steps,
    generate,
    guarded_engine,
    record_steps,
    split_on_the_host,
)

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
CUDA = {"device": "cuda", "dtype": "float32", "max_num_seqs": 4}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return guards.build_hf_checkpoint(tmp_path_factory.mktemp("kv-graphs-gpu") / "llama", "llama")


@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_reserve_engine_replays_and_falls_back_eagerly(ckpt, kv):
    prompts = [guards.prompt_of(40), guards.prompt_of(36, seed=1)]
    eager = guarded_engine(ckpt, kv, cuda_graphs=False, **CUDA)
    split_on_the_host(eager)
    want = generate(eager, prompts)
    eng = guarded_engine(ckpt, kv, **CUDA)
    assert len(eng.runner.kv_pool_sizes) == 2 and eng.runner.decode_graphs is not None  # captured at start
    graphs = eng.runner.decode_graphs = build_decode_graphs(eng.runner)  # again, with the corruption hook
    assert sorted(graphs.graphs) == graph_batch_sizes(4)
    steps = record_steps(graphs)
    got = generate(eng, prompts)
    feed = eng.stats()["validation"]
    same = sum(a == b for g, w in zip(got, want, strict=True) for a, b in zip(g, w, strict=True))
    print(f"{kv}: {graphs.replays_total} replays of {len(steps)} decode steps, fallbacks {feed['fallbacks_total']}, "
          f"{same}/{sum(LENGTHS.values())} tokens as the host-split eager engine")
    assert guards.fallbacks(feed, f"kv_{kv}") == 1
    assert graphs.replays_total == graphs.steps_total == check_steps(steps) > 0
    assert got[0][: guards.EVERY + 1] == want[0][: guards.EVERY + 1]  # up to the fallback: identical
    assert same >= 0.9 * sum(LENGTHS.values())  # fp32, the same kernels; a padded batch may split contexts otherwise
    assert eng.block_manager.num_used_blocks == 0
