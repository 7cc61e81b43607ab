"""Conversions calibrated on text: GQA merges the heads whose keys are alike (not neighbours by index),
and the MLA conversion factorises K/V weighted by the activations it will see."""

from __future__ import annotations

import pytest
import torch

from kvpilot.engine.strategies.gqa.calibrate import group_cost, group_heads, head_distances
from kvpilot.engine.strategies.mla.svd import factorize_kv, reconstruct_k, reconstruct_v
from tests.helpers.models import build_hf_checkpoint
from tests.parity.helpers import engine_greedy, make_engine

pytestmark = pytest.mark.parity

TEXT = " ".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(80))


@pytest.fixture(scope="module")
def calibration(tmp_path_factory):
    path = tmp_path_factory.mktemp("calib") / "calibration.txt"
    path.write_text(TEXT)
    return str(path)


@pytest.fixture(scope="module")
def twin_heads(tmp_path_factory):
    """4 KV heads with heads 0 = 2 and 1 = 3: merging by index (0+1, 2+3) loses, by similarity (0+2, 1+3) not."""
    from safetensors.torch import load_file, save_file

    path = build_hf_checkpoint(tmp_path_factory.mktemp("twins") / "llama", "llama", num_key_value_heads=4)
    weights = load_file(path / "model.safetensors")
    for name, t in weights.items():
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            heads = t.reshape(4, -1, t.shape[1]).clone()
            heads[2], heads[3] = heads[0], heads[1]
            weights[name] = heads.reshape(t.shape).contiguous()
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def test_grouping_finds_the_alike_heads():
    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(50, 6, 8, generator=gen), torch.randn(50, 6, 8, generator=gen)
    # head i's twin is head i + 3 (plus a little noise)
    k[:, 3:], v[:, 3:] = k[:, :3] + 0.01 * torch.randn(50, 3, 8, generator=gen), v[:, :3]
    dist = head_distances(k, v)
    order = group_heads(dist, 3)
    assert sorted(tuple(sorted(order[i : i + 2])) for i in (0, 2, 4)) == [(0, 3), (1, 4), (2, 5)]
    assert group_cost(dist, order[:2]) < 0.01 < group_cost(dist, [0, 1])
    assert sorted(order) == list(range(6))


def test_calibrated_gqa_merges_twin_heads_exactly(twin_heads, calibration):
    prompt = [(i * 37 + 11) % 370 + 3 for i in range(30)]
    native = engine_greedy(make_engine(twin_heads, device="cpu"), [prompt], 12)[0]
    by_index = make_engine(twin_heads, device="cpu", attention="gqa", kv_head_groups=2)
    calibrated = make_engine(twin_heads, device="cpu", attention="gqa", kv_head_groups=2,
                             conversion_calibration=calibration, calibration_tokens=256)
    assert calibrated.runner.gqa_orders == [[0, 2, 1, 3]] * 2
    assert engine_greedy(calibrated, [prompt], 12)[0] == native
    assert engine_greedy(by_index, [prompt], 12)[0] != native
    # the runtime check's exact side follows the permutation: identical outputs, cosine 1
    checked = make_engine(twin_heads, device="cpu", attention="gqa", kv_head_groups=2, validate_every=4,
                          validation_sample_rate=1.0, conversion_calibration=calibration)
    engine_greedy(checked, [prompt], 12)
    feed = checked.stats()["validation"]
    assert feed["checks_total"] == 2 and feed["last_cosine"] > 0.99999


def test_activation_aware_factorisation_fits_the_keys_the_layer_produces():
    """Inputs with a few dominant directions (as trained activations have): at the same rank, the
    whitened SVD's K/V error on those inputs is far below plain SVD's, while its weight error is higher."""
    gen = torch.Generator().manual_seed(0)
    hidden, heads, dim, rank = 64, 2, 16, 8
    w_k, w_v = torch.randn(heads * dim, hidden, generator=gen), torch.randn(heads * dim, hidden, generator=gen)
    scales = torch.ones(hidden)
    scales[:6] = 30.0
    x = torch.randn(400, hidden, generator=gen) * scales
    plain = factorize_kv(w_k, w_v, heads, rank)
    aware = factorize_kv(w_k, w_v, heads, rank, inputs=x[:300])

    def output_error(conv) -> float:  # relative K/V error on held-out inputs
        held = x[300:]
        exact = torch.cat([held @ w_k.T, held @ w_v.T], 1)
        approx = torch.cat([held @ reconstruct_k(conv, heads).T, held @ reconstruct_v(conv).T], 1)
        return float((exact - approx).norm() / exact.norm())

    assert output_error(aware) < 0.5 * output_error(plain)
    assert aware.error > plain.error  # the weights themselves: plain SVD is optimal there (Eckart-Young)
    full = factorize_kv(w_k, w_v, heads, 2 * heads * dim, inputs=x)
    assert full.error < 1e-6  # full rank is exact either way


def test_calibrated_mla_conversion_serves_and_reports_it(twin_heads, calibration, caplog):
    path = twin_heads
    with caplog.at_level("WARNING", logger="kvpilot.engine.mla"):
        eng = make_engine(path, device="cpu", attention="mla", latent_rank=64, conversion_calibration=calibration)
    assert "activation-aware on " in caplog.text and " calibration tokens" in caplog.text
    native = engine_greedy(make_engine(path, device="cpu"), [[5, 9, 200, 31, 7] * 4], 8)[0]
    assert engine_greedy(eng, [[5, 9, 200, 31, 7] * 4], 8)[0] == native  # full rank: exact, calibrated or not


def test_weighted_merges_reduce_to_the_mean_and_follow_their_weights():
    from kvpilot.engine.strategies.gqa.convert import mean_pool_heads
    from kvpilot.engine.strategies.gqa.merge import merge_keys, merge_values

    gen = torch.Generator().manual_seed(1)
    heads, d, hidden = 4, 8, 16
    w = torch.randn(heads * d, hidden, generator=gen)
    mean = mean_pool_heads(w, heads, 2)
    assert torch.allclose(merge_keys(w, torch.ones(heads, d), 2).float(), mean, atol=1e-6)
    same = torch.eye(d).expand(heads, d, d)
    assert torch.allclose(merge_values(w, same, 2).float(), mean, atol=1e-5)
    # all of a dim's query energy on head 1: the merged key takes head 1's row for that dim
    weights = torch.ones(heads, d)
    weights[0, 3], weights[1, 3] = 1e-9, 1.0
    merged = merge_keys(w, weights, 2).float()
    assert torch.allclose(merged[3], w[d + 3], atol=1e-5)


def test_compensated_gqa_falls_back_to_the_exact_unmerged_attention(twin_heads, calibration):
    """Calibrated GQA folds its compensation into q_proj / o_proj; a sequence moved to the fallback
    reserve attends with the original heads through them (compensate.exact_kv) and continues exactly
    as the native engine does. Four unlike heads in one group, the check's threshold out of reach."""
    guarded = {"device": "cpu", "block_size": 8, "num_kv_blocks": 64, "validate_every": 4,
               "validation_sample_rate": 1.0, "validation_threshold": 0.99999, "fallback_reserve": 0.5}  # fmt: skip
    prompt = [(i * 37 + 11) % 370 + 3 for i in range(40)]
    eng = make_engine(twin_heads, attention="gqa", kv_head_groups=1, conversion_calibration=calibration,
                      calibration_tokens=256, **guarded)  # fmt: skip
    assert eng.runner.model.model.layers[0].self_attn.gqa_compensation.value_maps is not None
    got = engine_greedy(eng, [prompt], 14, ["r"])[0]
    feed = eng.stats()["validation"]
    assert feed["checks_total"] == 1 and sum(feed["fallbacks_total"]["gqa"].values()) == 1, feed
    native = make_engine(twin_heads, device="cpu", block_size=8, num_kv_blocks=64)
    assert got[5:] == engine_greedy(native, [prompt + got[:5]], 9)[0]
