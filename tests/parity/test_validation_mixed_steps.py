"""Runtime validation on steps that hold prefill chunks and decodes together, for every strategy's check.

A new request arrives on every step, so each due decode (every 4th completion token, every sequence
sampled) shares its step with another request's prefill. Beside a fallback reserve (MLA and GQA
conversions, layers/reserve_attention.py) the validated layer's attention is called once per pool part,
prefill then decode, and its served rows must still be those of the sampled decode: the checks run (none
skipped, nothing raised) and the cosine each records is the one of an exact or near-exact strategy.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from safetensors.torch import load_file, save_file

import kvpilot.engine.validation.runner as runner_mod
from kvpilot.engine.sampling_params import SamplingParams
from tests.helpers.models import build_hf_checkpoint
from tests.parity.helpers import make_engine

pytestmark = pytest.mark.parity

EVERY, MAX_TOKENS, REQUESTS = 4, 9, 12  # checks at completion tokens 4 and 8 of each request


@dataclass(frozen=True)
class Case:
    settings: dict
    lowest: float  # the lowest cosine a check of the sampled sequence's own rows may record
    checks: int = 2 * REQUESTS  # due decodes: two per request
    mixed: int = 12  # of them at least this many in a step with a prefill chunk
    fallbacks: int = 0
    beside_reserve: bool = False  # some checks run in a step that also serves reserve sequences


CASES = {
    "mla": Case({"attention": "mla", "latent_rank": 64}, 0.99999),  # full rank: exact
    # threshold 1.0 fails each sequence's first check: it moves to the reserve (recomputed there, a prefill),
    # and the later sequences' checks run in steps split between the latent pool and the reserve
    "mla_to_reserve": Case(
        {"attention": "mla", "latent_rank": 64, "validation_threshold": 1.0, "fallback_reserve": 0.5},
        0.99999, checks=REQUESTS, mixed=6, fallbacks=REQUESTS, beside_reserve=True,
    ),
    "gqa": Case({"attention": "gqa", "kv_head_groups": 1}, 0.99999),  # the two KV heads are twins: merging is exact
    "kv_int8": Case({"kv_cache_dtype": "int8"}, 0.9999),  # measured 0.99992
    "kv_fp8": Case({"kv_cache_dtype": "fp8"}, 0.99),  # measured 0.9974
    "linear": Case({"attention": "linear", "linear_window": 128}, 0.99999),  # the window holds every context
    # only sequences that evicted something (the longer ones) are checked; a low cosine is expected there
    "eviction": Case(
        {"eviction": "sinks", "eviction_sinks": 4, "eviction_window": 8, "validation_threshold": 0.0},
        0.5, checks=11, mixed=3,  # lowest measured 0.66
    ),
}


@pytest.fixture(scope="module")
def twin_ckpt(tmp_path_factory):
    """A tiny Llama with 2 KV heads whose K/V projections are equal (GQA to 1 head loses nothing)."""
    path = build_hf_checkpoint(tmp_path_factory.mktemp("mixed") / "llama", "llama", seed=1, num_key_value_heads=2)
    weights = load_file(path / "model.safetensors")
    for name, t in weights.items():
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            heads = t.reshape(2, -1, t.shape[1]).clone()
            heads[1] = heads[0]
            weights[name] = heads.reshape(t.shape).contiguous()
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


@pytest.mark.parametrize("case", list(CASES))
def test_checks_on_mixed_prefill_and_decode_steps_compare_the_sampled_decode(twin_ckpt, case, monkeypatch):
    expect = CASES[case]
    strategy = case.split("_to_")[0]
    cosines: list[tuple[str, float]] = []
    decide = runner_mod.verdict

    def recording(finite, cosine, name, *args, **kw):
        result = decide(finite, cosine, name, *args, **kw)
        cosines.append((name, result.cosine))
        return result

    monkeypatch.setattr(runner_mod, "verdict", recording)
    due = mixed = beside_reserve = 0  # sequences due for a check; of them beside a prefill; beside a reserve one
    before_run = runner_mod.ValidationRunner.before_run

    def counting(self, out):
        nonlocal due, mixed, beside_reserve
        before_run(self, out)
        due += len(self._due)
        mixed += len(self._due) * any(s.num_new_tokens > 1 for s in out.scheduled)
        beside_reserve += len(self._due) * any(s.seq.exact_path for s in out.scheduled)

    monkeypatch.setattr(runner_mod.ValidationRunner, "before_run", counting)
    eng = make_engine(
        twin_ckpt, device="cpu", block_size=8, num_kv_blocks=160, validate_every=EVERY, validation_sample_rate=1.0,
        validation_layer=-1, **expect.settings,
    )  # fmt: skip
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    produced: dict[str, int] = {}
    step = 0
    while step < REQUESTS or eng.has_unfinished_requests():
        if step < REQUESTS:  # one request a step, prompts of 2..38 tokens: prefills smaller and larger than a
            # step's decodes (whose packed rows come after every prefill row)
            eng.add_request(f"r{step}", [(step * 31 + i * 7) % 300 + 3 for i in range(2 + step * 9 % 40)], params)
        for output in eng.step():
            produced[output.request_id] = produced.get(output.request_id, 0) + len(output.new_token_ids)
        step += 1
    assert produced == {f"r{i}": MAX_TOKENS for i in range(REQUESTS)}
    assert due == expect.checks and mixed >= expect.mixed, "the schedule must put due decodes beside prefills"
    assert bool(beside_reserve) == expect.beside_reserve
    feed = eng.stats()["validation"]
    assert feed["checks_skipped_total"] == 0 and feed["unrecovered_total"] == {}
    assert feed["checks_total"] == len(cosines) == due
    assert sum(sum(reasons.values()) for reasons in feed["fallbacks_total"].values()) == expect.fallbacks
    assert {name for name, _ in cosines} == {strategy}
    assert min(c for _, c in cosines) >= expect.lowest, cosines
    assert eng.block_manager.num_used_blocks == 0
