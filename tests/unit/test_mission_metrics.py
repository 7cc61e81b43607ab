"""The mission metrics of the stats feed: kv_cache_efficiency and gqa_head_utilization, exactly as
../shared/DESIGN.md defines them, on layouts whose answer is known."""

from __future__ import annotations

import math

import pytest
import torch

from kvpilot.engine.core.block_manager import BlockManager
from kvpilot.engine.core.scheduler import Scheduler
from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.metrics.head_utilization import head_utilization
from kvpilot.engine.metrics.stats import EngineStats, build_feed, kv_occupancy
from kvpilot.engine.sampling_params import SamplingParams
from kvpilot.engine.strategies.eviction.policy import EvictionPolicy, Evictor

pytestmark = pytest.mark.unit


def computed(bm: BlockManager, seq: Sequence, n: int, hits=None) -> None:
    bm.allocate(seq, n, [] if hits is None else hits)
    seq.num_computed_tokens += n
    bm.commit(seq)


def test_kv_efficiency_counts_shared_partial_and_evicted_blocks() -> None:
    bm = BlockManager(num_blocks=20, block_size=4)
    a = Sequence("a", list(range(10)), SamplingParams())  # blocks: 4 + 4 + 2 live slots
    computed(bm, a, 10)
    b = Sequence("b", [*range(8), 99], SamplingParams())  # shares a's 2 full blocks, 1 slot of its own
    hits = bm.match_prefix(b)
    assert len(hits) == 2
    computed(bm, b, 1, hits)
    c = Sequence("c", list(range(100, 130)), SamplingParams())  # 30 tokens, 4 of 7 full blocks evicted
    computed(bm, c, 30)
    Evictor(EvictionPolicy("sinks", 1, 2, 2), bm).evict(c)
    assert c.num_evicted_tokens == 16 and len(c.block_table) == 4
    live, allocated = kv_occupancy([a, b, c], 4)
    # distinct blocks: a/b shared 2 (8 slots), a's tail 2, b's tail 1, c's resident 4 + 4 + 4 + 2
    assert (live, allocated) == (8 + 2 + 1 + 14, 4 * (2 + 1 + 1 + 4))
    scheduler = Scheduler(bm)
    scheduler.running = [a, b, c]
    feed = build_feed(EngineStats(), {}, bm, scheduler, bytes_per_block=4096, memory={})
    assert feed["kv"]["efficiency"] == pytest.approx(25 / 32)
    # bytes view: live entries' bytes over the bytes of the blocks live sequences hold
    per_slot = 4096 / 4
    assert feed["kv"]["efficiency"] == pytest.approx(live * per_slot / (allocated * per_slot))


def test_kv_efficiency_is_null_with_no_live_sequence() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    feed = build_feed(EngineStats(), {}, bm, Scheduler(bm), bytes_per_block=64, memory={})
    assert feed["kv"]["efficiency"] is None


def paged(keys: list[torch.Tensor], block_size: int, num_blocks: int):
    """Scatter each sequence's keys [L, Hkv, D] into shuffled blocks of a cache."""
    hkv, d = keys[0].shape[1:]
    cache = torch.randn(num_blocks, block_size, hkv, d)  # garbage outside the sequences' slots
    free = torch.randperm(num_blocks).tolist()
    tables = []
    for k in keys:
        ids = [free.pop() for _ in range(-(-k.shape[0] // block_size))]
        for p in range(k.shape[0]):
            cache[ids[p // block_size], p % block_size] = k[p]
        tables.append(ids)
    width = max(len(t) for t in tables)
    table = torch.tensor([t + [-1] * (width - len(t)) for t in tables], dtype=torch.int32)
    return cache, table


def reference(q: torch.Tensor, keys: list[torch.Tensor], scale: float) -> torch.Tensor:
    hq, hkv = q.shape[1], keys[0].shape[1]
    group = hq // hkv
    per_seq = []
    for b, k in enumerate(keys):
        values = []
        for h in range(hq):
            p = torch.softmax((k[:, h // group] @ q[b, h]).double() * scale, 0)
            values.append(math.exp(-(p * p.log()).sum().item()) / k.shape[0])
        per_seq.append(torch.tensor(values).view(hkv, group).mean(1))
    return torch.stack(per_seq).mean(0)


@pytest.mark.parametrize("lens", [[1], [15, 63], [300, 5, 17]])
def test_head_utilization_matches_the_definition(lens) -> None:
    torch.manual_seed(0)
    hq, hkv, d, bs = 8, 2, 16, 16
    keys = [torch.randn(n, hkv, d) for n in lens]
    q = 2 * torch.randn(len(lens), hq, d)
    cache, table = paged(keys, bs, 40)
    got = head_utilization(q, cache, table, torch.tensor(lens, dtype=torch.int32), d**-0.5)
    assert got.shape == (hkv,)
    torch.testing.assert_close(got.double(), reference(q, keys, d**-0.5).double(), rtol=1e-4, atol=1e-6)


def test_head_utilization_extremes() -> None:
    hkv, d, n = 2, 8, 48
    keys = torch.randn(n, hkv, d)
    cache, table = paged([keys], 16, 8)
    lens = torch.tensor([n], dtype=torch.int32)
    uniform = head_utilization(torch.zeros(1, 4, d), cache, table, lens, 1.0)
    torch.testing.assert_close(uniform, torch.ones(hkv))  # equal weight everywhere: all positions used
    spike = keys[7].repeat_interleave(2, dim=0)[None] * 1e3  # each query aligned with one key only
    one_hot = head_utilization(spike, cache, table, lens, 1.0)
    torch.testing.assert_close(one_hot, torch.full((hkv,), 1 / n), rtol=1e-3, atol=1e-5)
