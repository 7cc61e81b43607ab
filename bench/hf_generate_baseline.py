"""Same-run baselines for `kvpilot bench offline`: HF transformers `generate` in static batches, and the
HBM copy bandwidth (the roofline the decode bytes bound is taken against).

    PYTHONPATH=. python3 bench/hf_generate_baseline.py [--shape llama-3-8b] [--num-requests 64] [--batch 64] \
        [--copy-gib 4]

The workload is `kvpilot bench offline`'s (kvpilot/bench/workload.py, seed 0): the first
`--num-requests` of its 256 requests, run in batches of `--batch` (prompts left-padded, every
request of a batch generates the batch's largest max_tokens, EOS off, greedy). Throughput counts
only the tokens each request asked for (padding and overshoot are HF's cost, not output). Random
bf16 weights of the shape (transformers `from_config` on the GPU). CUDA only. Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from kvpilot.bench.shapes import _COMMON, SHAPES
from kvpilot.bench.workload import DEFAULT_LENGTHS, DEFAULT_NUM_REQUESTS, random_requests


def hbm_copy_gbps(gib: float, reps: int = 20) -> float:
    """Device-to-device copy: bytes read + written per second (GB/s), best of `reps`."""
    n = int(gib * 2**30) // 2
    src, dst = torch.empty(n, dtype=torch.bfloat16, device="cuda"), torch.empty(n, dtype=torch.bfloat16, device="cuda")
    dst.copy_(src)
    best = float("inf")
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return 2 * n * 2 / best / 1e9


def main() -> None:
    import transformers

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-3-8b")
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--copy-gib", type=float, default=4.0)
    args = parser.parse_args()
    record: dict = {"bench": "hf_generate_static", "shape": args.shape, "torch": torch.__version__,
                    "transformers": transformers.__version__, "gpu": torch.cuda.get_device_name()}  # fmt: skip
    record["hbm_copy_gbps"] = round(hbm_copy_gbps(args.copy_gib), 1)
    print(f"HBM copy: {record['hbm_copy_gbps']:.0f} GB/s", flush=True)
    raw = {**_COMMON, **SHAPES[args.shape]}
    config = transformers.AutoConfig.for_model(raw.pop("model_type"), **{k: v for k, v in raw.items()
                                                                        if k != "architectures"})
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 2
    requests = random_requests(DEFAULT_NUM_REQUESTS, DEFAULT_LENGTHS, DEFAULT_LENGTHS, config.vocab_size)
    requests = requests[: args.num_requests]
    useful = 0
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(0, len(requests), args.batch):
        batch = requests[i : i + args.batch]
        width = max(len(r.prompt) for r in batch)
        ids = torch.full((len(batch), width), 2, dtype=torch.long, device="cuda")
        mask = torch.zeros_like(ids)
        for row, r in enumerate(batch):
            ids[row, width - len(r.prompt) :] = torch.tensor(r.prompt)
            mask[row, width - len(r.prompt) :] = 1
        new = max(r.max_tokens for r in batch)
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                                 do_sample=False)  # fmt: skip
        assert out.shape[1] == width + new, out.shape
        useful += sum(r.max_tokens for r in batch)
        print(f"batch {i // args.batch}: {len(batch)} requests, {new} steps, "
              f"{time.perf_counter() - start:.1f} s so far", flush=True)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    record.update(requests=len(requests), batch=args.batch, output_tokens=useful, total_s=round(seconds, 2),
                  output_tok_s=round(useful / seconds, 1))
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
