"""Which Triton kernel launches would compile a new variant, and which arguments make them: on the CPU.

    python bench/specialization_probe.py [--batch 8 --prompt 48 --new 24 --rounds 3]

On the H200 an eager engine compiled 32 kernel variants in its first decode round, one step taking
457 ms (bench/eager_step_outliers.py, docs/benchmarks.md). Triton compiles one variant per
*specialisation key* (tests/helpers/specialization.py computes it with Triton's own function). This
probe runs the Triton kernels under the interpreter (TRITON_INTERPRET=1, KVPILOT_KERNELS=triton) in a
tiny CPU engine and prints, per phase (the prefill of each round, then its decode steps), the keys
never seen before: the kernel, and the arguments whose specialisation differs from the closest key
seen earlier. No device needed: a fix is checked here, its compile count on a GPU afterwards.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("KVPILOT_KERNELS", "triton")

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))
from kvpilot.engine.config import EngineConfig
from kvpilot.engine.llm_engine import LLMEngine
from kvpilot.engine.sampling_params import SamplingParams
from tests.helpers.models import build_hf_checkpoint
from tests.helpers.specialization import Recorder, recording


def report(phase: str, recorder: Recorder) -> None:
    new = recorder.take_new()
    print(f"{phase}: {len(new)} new specialisations")
    for name, changed in new:
        print(f"    {name}" + (f"  ({'; '.join(changed)})" if changed else "  (first launch)"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=48)
    parser.add_argument("--new", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--family", default="llama")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, recording() as recorder:
        path = build_hf_checkpoint(Path(tmp) / "model", args.family, seed=0)
        eng = LLMEngine(EngineConfig(model=str(path), show_progress=False, device="cpu", dtype="float32",
                                     max_num_seqs=args.batch, max_num_batched_tokens=max(64, args.prompt),
                                     enable_prefix_caching=False, validation_sample_rate=0.0))  # fmt: skip
        prompts = [[3 + (i * 7 + j) % 300 for j in range(args.prompt + i)] for i in range(args.batch)]
        params = SamplingParams(temperature=0.0, max_tokens=args.new, ignore_eos=True)
        for r in range(args.rounds):
            for i, p in enumerate(prompts):
                eng.add_request(f"r{r}-{i}", p, params)
            started: set[str] = set()
            while len(started) < len(prompts):
                started.update(o.request_id for o in eng.step() if o.new_token_ids)
            report(f"round {r} prefill", recorder)
            while eng.has_unfinished_requests():
                eng.step()
            report(f"round {r} decode", recorder)


if __name__ == "__main__":
    main()
