"""Held-out perplexity of a checkpoint under each memory strategy the engine serves.

    python bench/train_tiny.py /tmp/tiny-trained --minutes 3
    python bench/perplexity.py /tmp/tiny-trained [--windows 8 --length 512 --device cpu]

Teacher-forced scoring through the serving path (kvpilot/engine/worker/scoring.py): each held-out
window of `length` tokens is fed through the paged cache in block-sized chunks, so 8-bit K/V,
eviction and the Performer summary act on it exactly as they do in serving (`engine.score()`'s
dense path would not see them). Perplexity = exp(mean negative log-likelihood over all scored
tokens). Strategies the engine refuses for this checkpoint are listed with the reason.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.worker.scoring import score_paged

# calibrated GQA's steps (strategies/gqa/compensate.py), --gqa-steps: calibrate_gqa's arguments
GQA_STEPS = {
    "weighted merge only": {"compensate": (), "grouping": "merge"},
    "+ query side": {"compensate": ("keys",), "grouping": "merge"},
    "+ output side": {"compensate": ("values",), "grouping": "merge"},
    "+ both sides": {"compensate": ("keys", "values"), "grouping": "merge"},
}

# the calibrated MLA conversion's steps (strategies/mla/convert.py), --mla-steps: convert_to_mla's arguments
MLA_STEPS = {
    "input side only": {"weighting": "input"},
    "two-sided, keys x0.25": {"key_balance": 0.25},
    "two-sided, keys x4": {"key_balance": 4.0},
}


def strategies(heads_kv: int, head_dim: int, length: int, calibration: str | None = None, gqa_steps: bool = False,
               mla_steps: bool = False) -> list[tuple[str, dict[str, Any]]]:  # fmt: skip
    """(label, EngineConfig overrides) for every strategy the engine offers; with a calibration text,
    the GQA and MLA conversions also calibrated on it (heads by key similarity, activation-aware SVD
    weighted by the layer's other side); with `gqa_steps` / `mla_steps`, calibrated GQA also without
    (part of) its compensation (key `gqa_calibrate`), calibrated MLA also by other weightings (key
    `mla_convert`)."""
    window = max(32, length // 4)
    out: list[tuple[str, dict[str, Any]]] = [("native", {})]
    out += [("int8 KV", {"kv_cache_dtype": "int8"}), ("fp8 KV", {"kv_cache_dtype": "fp8"})]
    groups = [g for g in (heads_kv // 2, heads_kv // 4) if g >= 1]
    ranks = (head_dim * heads_kv // 2, head_dim * heads_kv // 4)
    out += [(f"gqa {g}", {"attention": "gqa", "kv_head_groups": g}) for g in groups]
    calibrated = {"conversion_calibration": calibration}
    if calibration:
        for g in groups:
            gqa = {"attention": "gqa", "kv_head_groups": g, **calibrated}
            if gqa_steps:
                out += [(f"gqa {g} calibrated, {step}", {**gqa, "gqa_calibrate": how})
                        for step, how in GQA_STEPS.items()]  # fmt: skip
            out.append((f"gqa {g} calibrated", gqa))
    mla_ranks = (*ranks, head_dim * heads_kv // 8)
    out += [(f"mla r={r}", {"attention": "mla", "latent_rank": r}) for r in mla_ranks]
    if calibration:
        for r in mla_ranks:
            mla = {"attention": "mla", "latent_rank": r, **calibrated}
            if mla_steps:
                out += [(f"mla r={r} calibrated, {step}", {**mla, "mla_convert": how}) for step, how in MLA_STEPS.items()]
            out.append((f"mla r={r} calibrated", mla))
    # partial RoPE with absorbed decode (strategies/mla/partial.py) at r = d/4: R dims per KV head keep RoPE
    # (with calibration text both rules use the activation-aware SVD: only the pairs differ)
    rules = [("high", calibrated), ("norm", calibrated), ("turn", calibrated)] if calibration else [("high", {})]
    out += [
        (f"mla-rope{rope} r={ranks[1]} {rule}",
         {"attention": "mla", "latent_rank": ranks[1], "mla_rope_dims": rope, "mla_rope_pairs": rule, **extra})
        for rope in (head_dim // 8, head_dim // 4, head_dim // 2) for rule, extra in rules
    ]  # fmt: skip
    # the same cached width as r = d/4 (latent + Hkv x R rope rows): the memory-matched comparison
    rule, extra = rules[-1]
    out += [
        (f"mla-rope{rope} r={ranks[1] - heads_kv * rope} {rule} (width d/4)",
         {"attention": "mla", "latent_rank": ranks[1] - heads_kv * rope, "mla_rope_dims": rope,
          "mla_rope_pairs": rule, **extra})
        for rope in (head_dim // 8, head_dim // 4) if ranks[1] > heads_kv * rope
    ]  # fmt: skip
    # and the exact-RoPE conversion at each partial-RoPE row's cached width (r = d/4 + Hkv x R)
    out += [
        (f"mla-matched r={ranks[1] + heads_kv * rope} (width of mla-rope{rope} r={ranks[1]})",
         {"attention": "mla", "latent_rank": ranks[1] + heads_kv * rope, **extra})
        for rope in (head_dim // 8, head_dim // 4, head_dim // 2)
    ]  # fmt: skip
    out += [(f"linear (Performer, window {w})", {"attention": "linear", "linear_window": w}) for w in (64, 16)]
    out += [
        (f"eviction sinks 16 + window {window}", {"eviction": "sinks", "eviction_sinks": 16, "eviction_window": window}),
        (f"eviction ladder 16 + window {window // 2}",
         {"eviction": "ladder", "eviction_sinks": 16, "eviction_window": window // 2}),
    ]  # fmt: skip
    return out


def build_engine(config: EngineConfig, gqa_calibrate: dict[str, Any] | None = None,
                 mla_convert: dict[str, Any] | None = None) -> LLMEngine:  # fmt: skip
    """The engine; with `gqa_calibrate`, calibrated GQA runs calibrate_gqa with those arguments, with
    `mla_convert`, the MLA conversion runs convert_to_mla with them (benchmark steps, not engine
    settings: the engine compensates both GQA sides, grouped for it, and weights MLA two-sided)."""
    from functools import partial
    from unittest import mock

    from kvpilot.engine.strategies.gqa import calibrate
    from kvpilot.engine.strategies.mla import convert

    with (
        mock.patch.object(calibrate, "calibrate_gqa", partial(calibrate.calibrate_gqa, **(gqa_calibrate or {}))),
        mock.patch.object(convert, "convert_to_mla", partial(convert.convert_to_mla, **(mla_convert or {}))),
    ):
        return LLMEngine(config)


def heldout_windows(model_dir: Path, tokenizer, length: int, count: int) -> list[list[int]]:
    meta = model_dir / "heldout.json"
    if meta.is_file():
        files = [model_dir / p for p in json.loads(meta.read_text())["heldout_files"]]  # absolute ones stay
    else:  # not trained by train_tiny: fall back to its held-out list
        import sys

        sys.path.insert(0, str(Path(__file__).parent))
        from train_tiny import stdlib_files

        files = stdlib_files()[1]
    ids: list[int] = []
    for path in files:
        ids += tokenizer.encode(path.read_text(encoding="utf-8", errors="replace"))
    windows = [ids[i : i + length] for i in range(0, len(ids) - length + 1, length)]
    return windows[:count]


def perplexity(engine: LLMEngine, windows: list[list[int]]) -> float:
    nll, n = 0.0, 0
    for w in windows:
        logprobs, _ = score_paged(engine.runner, engine.block_manager, engine.evictor, w[:1], w[1:])
        nll -= sum(logprobs)
        n += len(logprobs)
    return math.exp(nll / n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--only", help="comma-separated label prefixes to run (default: all)")
    parser.add_argument("--calibration", help="a text file (not held out) that calibrates extra GQA/MLA rows")
    parser.add_argument("--gqa-steps", action="store_true",
                        help="with --calibration: calibrated GQA also without its query/output compensation")
    parser.add_argument("--mla-steps", action="store_true",
                        help="with --calibration: calibrated MLA also input-side only and with other key/value balances")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3,
                        help="share of the GPU one strategy's engine may take (freed before the next)")
    args = parser.parse_args()
    raw = json.loads((args.model / "config.json").read_text())
    heads_kv = int(raw.get("num_key_value_heads") or raw["num_attention_heads"])
    head_dim = int(raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"])
    windows: list[list[int]] | None = None
    rows: list[tuple[str, str, str, str]] = []
    base_ppl = None
    for label, overrides in strategies(heads_kv, head_dim, args.length, args.calibration, args.gqa_steps,
                                      args.mla_steps):
        if args.only and not any(label.startswith(p.strip()) for p in args.only.split(",")):
            continue
        start = time.perf_counter()
        try:
            overrides = dict(overrides)
            how, mla_how = overrides.pop("gqa_calibrate", None), overrides.pop("mla_convert", None)
            config = EngineConfig(model=str(args.model), device=args.device, show_progress=False,
                                  cpu_kv_cache_bytes=256 * 2**20, cuda_graphs=False,  # scoring never decodes
                                  gpu_memory_utilization=args.gpu_memory_utilization, **overrides)  # fmt: skip
            engine = build_engine(config, how, mla_how)
        except (ValueError, NotImplementedError, RuntimeError) as exc:
            rows.append((label, "n/a", "", f"refused: {str(exc)[:90]}"))
            continue
        if windows is None:
            windows = heldout_windows(args.model, engine.tokenizer, args.length, args.windows)
        ppl = perplexity(engine, windows)
        base_ppl = base_ppl or ppl
        kv = engine.stats()["kv"]
        notes = [f"{kv['bytes_per_block'] / kv['block_size']:.0f} B/token KV"]
        if engine.evictor is not None:  # resident tokens at the end of a window: the eviction's saving
            policy, bs = engine.evictor.policy, kv["block_size"]
            full = args.length // bs
            notes.append(f"keeps {len(policy.kept(full)) * bs + args.length % bs} of {args.length} tokens")
        if label == "native":  # the paged scorer against engine.score's dense path: must agree
            dense = math.exp(-sum(sum(engine.score(w[:1], w[1:])) for w in windows) / sum(len(w) - 1 for w in windows))
            notes.append(f"dense engine.score {dense:.3f}")
        notes.append(f"{time.perf_counter() - start:.0f} s")
        rows.append((label, f"{ppl:.3f}", f"{100 * (ppl / base_ppl - 1):+.2f}%", ", ".join(notes)))
        print(" | ".join(rows[-1]), flush=True)
        del engine  # the next strategy's engine sizes its KV pool from the memory this one frees
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    n_tokens = sum(len(w) - 1 for w in windows or [])
    print(f"\n{len(windows or [])} held-out windows x {args.length} tokens ({n_tokens} scored) from {args.model}\n")
    print("| strategy | perplexity | vs native | notes |\n|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
