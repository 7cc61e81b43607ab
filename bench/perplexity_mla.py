"""Held-out perplexity of the MLA conversion (attention="mla", latent_rank r) against the exact model.

Uses a checkpoint from bench/train_tiny.py (its heldout.json names the stdlib files kept out of
training) and bench/perplexity_linear.py's pieces: every `--context`-token piece is scored by
`LLMEngine.score` (the dense path: the converted layers reconstruct K/V from the rank-r latent).
Also reports the logit cosine and top-1 agreement with the exact model over the same tokens, and
the reconstruction error logged at load.

    python bench/perplexity_mla.py /tmp/tiny-trained --context 512 --ranks 16,32,64,128,192,256
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

from kvpilot.engine.context import dense_context
from kvpilot.engine.llm import LLM

try:
    from bench.perplexity_linear import pieces, print_summary
except ImportError:  # run as a script from bench/
    from perplexity_linear import pieces, print_summary  # type: ignore[no-redef]


@torch.inference_mode()
def logits(llm: LLM, tokens: list[int]) -> torch.Tensor:
    runner = llm.engine.runner
    with dense_context():
        hidden = runner.model(
            torch.tensor(tokens, device=runner.device), torch.arange(len(tokens), device=runner.device)
        )
    return runner.model.compute_logits(hidden).float()


def evaluate(llm: LLM, chunks: list[list[int]], exact: list[torch.Tensor] | None) -> dict:
    nll, count, cos, top1 = 0.0, 0, [], 0
    outs = []
    for i, chunk in enumerate(chunks):
        out = logits(llm, chunk)
        outs.append(out)
        logprobs = torch.log_softmax(out[:-1], dim=-1).gather(-1, torch.tensor(chunk[1:])[:, None])
        nll -= float(logprobs.sum())
        count += len(chunk) - 1
        if exact is not None:
            cos.append(torch.nn.functional.cosine_similarity(out, exact[i], dim=-1))
            top1 += int((out.argmax(-1) == exact[i].argmax(-1)).sum())
    result = {"ppl": math.exp(nll / count), "logits": outs}
    if exact is not None:
        result["cosine"] = float(torch.cat(cos).mean())
        result["top1"] = top1 / sum(len(c) for c in chunks)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--ranks", default="16,32,64,128,192,256")
    parser.add_argument("--max-pieces", type=int, default=8)
    args = parser.parse_args()
    chunks = pieces(args.model, args.context, args.max_pieces)
    started = time.monotonic()
    base = evaluate(LLM(str(args.model), show_progress=False), chunks, None)
    rows = [
        {"latent_rank": None, "ppl": base["ppl"], "delta_pct": 0.0, "cosine": 1.0, "top1": 1.0, "error": 0.0}
    ]
    for rank in (int(r) for r in args.ranks.split(",")):
        llm = LLM(str(args.model), show_progress=False, attention="mla", latent_rank=rank)
        res = evaluate(llm, chunks, base["logits"])
        err = llm.engine.stats()["engine"]["mla"]["reconstruction_error"]
        rows.append({"latent_rank": rank, "ppl": res["ppl"], "delta_pct": 100 * (res["ppl"] / base["ppl"] - 1),
                     "cosine": res["cosine"], "top1": res["top1"], "error": err})  # fmt: skip
    print_summary(chunks, args.context, started, rows)
    for r in rows:
        print(f"latent_rank={r['latent_rank']!s:>5} ppl={r['ppl']:.3f} ({r['delta_pct']:+.1f}%) "
              f"cos={r['cosine']:.4f} top1={r['top1']:.3f} err={r['error']:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
