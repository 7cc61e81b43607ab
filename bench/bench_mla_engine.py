"""Engine-level MLA decode: native DeepSeek MLA (absorbed kernel vs --disable-mla) and the MLA conversion.

Random bf16 checkpoints with a few layers (dense MLPs: the MoE is plain torch and would dominate):
- DeepSeek-V2-Lite attention shapes: hidden 2048, 16 heads, kv_lora_rank 512, rope 64, nope 128, v 128,
  no q_lora; KV bytes per token and decode tokens/s, absorbed (mla_decode kernel) vs unabsorbed.
- Llama-3-8B attention shapes (hidden 4096, 32 heads, 8 KV heads of 128): exact vs MLA conversion at
  several latent ranks (KV bytes per token, decode tokens/s; the conversion decompresses the context's
  keys every step (V is absorbed), so it is expected to be slower: its gain is memory); and the
  partial-RoPE conversion (`mla_rope_dims`, `--rope-dims`, default 16) whose decode is absorbed on both
  sides through the mla_decode kernel (strategies/mla/absorbed.py). On CUDA both conversions replay
  CUDA graphs as exact attention does (the one with RoPE on every dim through its fused kernel,
  kernels/mla_conversion); exact attention is also timed with `enforce_eager` ("exact eager") to
  separate the graphs' share from the attention's (its mean carries the Triton compiles of its first
  decode round: bench/eager_step_outliers.py).

Decode tokens/s: B sequences are prefilled (every one has its first token), then the decode steps alone are
timed (synchronised per step) until each has N more tokens; the median step time is printed too.

    python bench/bench_mla_engine.py --device cuda --layers 4 --batch 64 --prompt 2048 --new 64
    python bench/bench_mla_engine.py --device cuda --layers 4 --batch 32 --prompt 8192 --new 64 --ranks 256 \
        --rope-dims 16 --skip-deepseek          # long context: exact vs absorbed partial RoPE (session 9: 1.23x)
    python bench/bench_mla_engine.py --device cpu --tiny          # smoke test of the script itself
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from kvpilot.engine.llm import LLM
from kvpilot.engine.make_model import write_generation_config, write_tokenizer
from kvpilot.engine.sampling_params import SamplingParams


def build(kind: str, out: Path, layers: int, tiny: bool) -> Path:
    import transformers

    if kind == "deepseek":
        dims = dict(hidden_size=2048, num_attention_heads=16, kv_lora_rank=512, qk_rope_head_dim=64,
                    qk_nope_head_dim=128, v_head_dim=128, intermediate_size=10944)  # fmt: skip
        if tiny:
            dims = dict(hidden_size=64, num_attention_heads=4, kv_lora_rank=32, qk_rope_head_dim=8,
                        qk_nope_head_dim=16, v_head_dim=16, intermediate_size=128)  # fmt: skip
        config = transformers.DeepseekV2Config(
            vocab_size=32000 if not tiny else 384, num_hidden_layers=layers, q_lora_rank=None,
            num_key_value_heads=dims["num_attention_heads"], first_k_dense_replace=layers,
            n_routed_experts=1, num_experts_per_tok=1, max_position_embeddings=16384, **dims,
        )  # fmt: skip
        model = transformers.DeepseekV2ForCausalLM(config)
    else:
        dims = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336)
        if tiny:
            dims = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)
        config = transformers.LlamaConfig(vocab_size=32000 if not tiny else 384, num_hidden_layers=layers,
                                          max_position_embeddings=16384, **dims)  # fmt: skip
        model = transformers.LlamaForCausalLM(config)
    model.to(torch.bfloat16).save_pretrained(out)
    write_tokenizer(out, 384)
    write_generation_config(out)
    return out


def decode_rate(path: Path, device: str, batch: int, prompt: int, new: int, **engine: object) -> dict:
    llm = LLM(str(path), device=device, dtype="bfloat16" if device != "cpu" else "float32",
              show_progress=False, max_num_seqs=batch, max_num_batched_tokens=max(4096, prompt),
              num_kv_blocks=batch * ((prompt + new) // 16 + 2), fallback_reserve=0.0, validation_sample_rate=0.0,
              enable_prefix_caching=False, **engine)  # fmt: skip
    # no reserve, no validation: pure decode, every block a latent block; no prefix caching: each timed run
    # prefills the same way (a cached prompt in one run and not the other made the difference of two runs
    # negative: the "exact" row of session 8 read 4e12 tok/s)
    prompts = [[3 + (i * 7 + j) % 300 for j in range(prompt)] for i in range(batch)]

    decode_only(llm, prompts, device, 4, 0)  # warm-up: kernel compilation, allocator
    seconds, tokens, steps = decode_only(llm, prompts, device, 1 + new, 1)
    slowest = max(steps, default=0.0)
    return {
        "bytes_per_token": llm.engine.runner.bytes_per_block // llm.engine.config.block_size,
        "decode_tokens_per_s": tokens / max(seconds, 1e-9),
        "median_step_ms": 1e3 * sorted(steps)[len(steps) // 2] if steps else None,
        "max_step_ms": 1e3 * slowest,
        "mla": llm.engine.stats()["engine"]["mla"],
    }


def decode_only(
    llm: LLM, prompts: list[list[int]], device: str, n: int, round_: int
) -> tuple[float, int, list[float]]:
    """Prefill every sequence (steps until each has its first token), then time the decode steps alone:
    (seconds, tokens decoded, per-step seconds in order). Differences of two whole generate() calls mixed
    the prefill's run-to-run noise into a 64-token decode (session 9's first device run: exact 765 tok/s)."""
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    eng = llm.engine
    for i, p in enumerate(prompts):
        eng.add_request(f"r{round_}-{i}", p, params)
    started: set[str] = set()
    while len(started) < len(prompts):
        started.update(o.request_id for o in eng.step() if o.new_token_ids)
    sync(device)
    tokens, steps = 0, []
    start = time.perf_counter()
    while eng.has_unfinished_requests():
        t0 = time.perf_counter()
        tokens += sum(len(o.new_token_ids) for o in eng.step())
        sync(device)
        steps.append(time.perf_counter() - t0)
    return time.perf_counter() - start, tokens, steps


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=2048)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--ranks", default="256,512,1024")
    parser.add_argument(
        "--rope-dims", default="16", help="partial-RoPE rows: mla_rope_dims values ('' for none)"
    )
    parser.add_argument("--skip-deepseek", action="store_true", help="only the Llama rows")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (checks the script on CPU)")
    args = parser.parse_args()
    if args.tiny:
        args.batch, args.prompt, args.new, args.ranks, args.rope_dims = 2, 24, 4, "16,48", "4"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_deepseek:
            ds = build("deepseek", Path(tmp) / "ds", args.layers, args.tiny)
            for absorbed in (True, False):
                r = decode_rate(ds, args.device, args.batch, args.prompt, args.new, disable_mla=not absorbed)
                rows.append(
                    {"model": "deepseek-v2-lite-attn", "path": "absorbed" if absorbed else "unabsorbed", **r}
                )
        llama = build("llama", Path(tmp) / "llama", args.layers, args.tiny)
        for path, extra in (("exact", {}), ("exact eager", {"enforce_eager": True})):
            rows.append({"model": "llama3-8b-attn", "path": path,
                         **decode_rate(llama, args.device, args.batch, args.prompt, args.new, **extra)})  # fmt: skip
        ropes = [int(x) for x in args.rope_dims.split(",") if x]
        for rank in (int(x) for x in args.ranks.split(",")):
            r = decode_rate(
                llama, args.device, args.batch, args.prompt, args.new, attention="mla", latent_rank=rank
            )
            rows.append({"model": "llama3-8b-attn", "path": f"mla r={rank}", **r})
            for rope in ropes:
                r = decode_rate(llama, args.device, args.batch, args.prompt, args.new, attention="mla",
                                latent_rank=rank, mla_rope_dims=rope)  # fmt: skip
                rows.append({"model": "llama3-8b-attn", "path": f"mla r={rank} rope{rope}", **r})
    for row in rows:
        err = row["mla"]["reconstruction_error"]
        print(f"{row['model']:22} {row['path']:18} {row['bytes_per_token']:>8} B/token "
              f"{row['decode_tokens_per_s']:>10.1f} tok/s {row['median_step_ms'] or 0:>8.2f} ms/step"
              + (f"  err={err:.3f}" if err is not None else ""))  # fmt: skip
    print(json.dumps({"args": vars(args), "rows": rows}))


if __name__ == "__main__":
    main()
