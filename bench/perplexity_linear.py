"""Held-out perplexity of the Performer conversion (attention="linear") against the exact model.

Uses a checkpoint from bench/train_tiny.py (its heldout.json names the stdlib files kept out of
training). Each held-out file is tokenised and cut into `--context`-token pieces; every piece is
scored by `LLMEngine.score` (the dense path: the converted layers run window + random features).

    python bench/perplexity_linear.py /tmp/tiny-trained --context 512 --windows 32,128 --features 32,128
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from kvpilot.engine.llm import LLM


def pieces(model_dir: Path, context: int, max_pieces: int) -> list[list[int]]:
    llm_tok = LLM(str(model_dir), show_progress=False).tokenizer
    files = json.loads((model_dir / "heldout.json").read_text())["heldout_files"]
    out: list[list[int]] = []
    for name in files:
        ids = llm_tok.encode(Path(name).read_text(encoding="utf-8", errors="replace"))
        out += [ids[i : i + context] for i in range(0, len(ids) - context + 1, context)]
    return out[:max_pieces]


def print_summary(chunks: list[list[int]], context: int, started: float, rows: list[dict]) -> None:
    """The run's one JSON line: pieces, scored tokens, wall seconds and the result rows."""
    tokens = len(chunks) * (context - 1)
    summary = {"pieces": len(chunks), "tokens": tokens, "seconds": time.monotonic() - started, "rows": rows}
    print(json.dumps(summary))


def perplexity(llm: LLM, chunks: list[list[int]]) -> float:
    nll, count = 0.0, 0
    for chunk in chunks:
        logprobs = llm.engine.score(chunk[:1], chunk[1:])
        nll -= sum(logprobs)
        count += len(logprobs)
    return math.exp(nll / count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--windows", default="32,128")
    parser.add_argument("--features", default="32,128")
    parser.add_argument("--max-pieces", type=int, default=8)
    args = parser.parse_args()
    chunks = pieces(args.model, args.context, args.max_pieces)
    started = time.monotonic()
    exact = perplexity(LLM(str(args.model), show_progress=False), chunks)
    rows = [{"attention": "exact", "window": None, "features": None, "ppl": exact, "delta_pct": 0.0}]
    for window in (int(w) for w in args.windows.split(",")):
        for m in (int(f) for f in args.features.split(",")):
            llm = LLM(str(args.model), show_progress=False, attention="linear", linear_window=window,
                      linear_features=m)  # fmt: skip
            ppl = perplexity(llm, chunks)
            rows.append({"attention": "linear", "window": window, "features": m, "ppl": ppl,
                         "delta_pct": 100 * (ppl / exact - 1)})  # fmt: skip
    print_summary(chunks, args.context, started, rows)
    for r in rows:
        print(f"{r['attention']:6} window={r['window']!s:>5} features={r['features']!s:>4} "
              f"ppl={r['ppl']:.3f} ({r['delta_pct']:+.1f}%)")  # fmt: skip


if __name__ == "__main__":
    main()
