"""Where a converted-MLA decode step spends its time on the GPU (torch profiler), beside exact attention.

    python bench/profile_mla_absorbed.py [--batch 64 --prompt 2048 --new 16 --rank 256 --rope-dims 16]

Llama-3-8B attention shapes, 4 random bf16 layers (bench/bench_mla_engine.py's checkpoint); prints the
top CUDA kernels and host ops of the decode steps for exact attention (eager) and the partial-RoPE
conversion with absorbed decode.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
from bench_mla_engine import build

from kvpilot.engine.llm import LLM
from kvpilot.engine.sampling_params import SamplingParams


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=2048)
    parser.add_argument("--new", type=int, default=16)
    parser.add_argument("--rank", type=int, default=256)
    parser.add_argument("--rope-dims", type=int, default=16)
    parser.add_argument("--rows", type=int, default=14)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes on any device (checks the script)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = build("llama", Path(tmp) / "llama", 4, args.tiny)
        cases = {"exact eager": {"enforce_eager": True},
                 f"mla r={args.rank} rope{args.rope_dims}": {"attention": "mla", "latent_rank": args.rank,
                                                            "mla_rope_dims": args.rope_dims}}  # fmt: skip
        prompts = [[3 + (i * 7 + j) % 300 for j in range(args.prompt)] for i in range(args.batch)]
        for label, engine in cases.items():
            llm = LLM(str(path), device=args.device, dtype="bfloat16" if args.device != "cpu" else "float32", show_progress=False, max_num_seqs=args.batch,
                      max_num_batched_tokens=max(4096, args.prompt), enable_prefix_caching=False,
                      num_kv_blocks=args.batch * ((args.prompt + args.new) // 16 + 2), fallback_reserve=0.0,
                      validation_sample_rate=0.0, **engine)  # fmt: skip
            llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))  # compile
            for i, p in enumerate(prompts):
                llm.engine.add_request(f"r{i}", p, SamplingParams(temperature=0.0, max_tokens=args.new + 1,
                                                                  ignore_eos=True))  # fmt: skip
            while any(s.num_completion_tokens == 0 for s in llm.engine.scheduler.running) or llm.engine.scheduler.waiting:
                llm.engine.step()  # prefill every sequence first: only decode steps are profiled
            sync(args.device)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                steps = 0
                while llm.engine.has_unfinished_requests():
                    llm.engine.step()
                    steps += 1
                sync(args.device)
            events = prof.key_averages()
            print(f"\n=== {label}: {steps} decode steps, batch {args.batch}, context {args.prompt}")
            print(events.table(sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=60))
            print(events.table(sort_by="self_cpu_time_total", row_limit=8, max_name_column_width=60))
            del llm


if __name__ == "__main__":
    main()
