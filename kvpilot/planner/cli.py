"""`kvpilot plan`: print the capacity plan for a model config and a GPU, without loading weights."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvpilot.planner.capacity import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    DEFAULT_WATERMARK,
    max_seq_len_from_p95,
    plan_capacity,
)
from kvpilot.planner.errors import PlannerError
from kvpilot.planner.gpus import GPU_PRODUCTS, gpu_spec
from kvpilot.planner.model_shape import ModelShape
from kvpilot.planner.strategy import KVStrategy
from kvpilot.planner.table import format_plan
from kvpilot.strategy_schema import ATTENTIONS, EVICTION_MODES, SPEC_KV_CACHE_DTYPES, default


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", type=Path, help="an HF config.json")
    source.add_argument("--model", type=Path, help="a checkpoint directory (config.json, *.safetensors)")
    parser.add_argument("--gpu", required=True, help=f"GPU product label, one of: {', '.join(GPU_PRODUCTS)}")
    parser.add_argument("--gpus", type=_positive_int, default=1, help="GPUs per replica (tensor parallel)")
    parser.add_argument("--attention", choices=ATTENTIONS, default=default("attention"))
    parser.add_argument("--kv-head-groups", type=_positive_int, help="gqa: KV heads after merging")
    parser.add_argument("--latent-rank", type=_positive_int, help="mla: width of the cached latent")
    parser.add_argument("--mla-rope-dims", type=int,
                        help="mla conversion: exact RoPE dims per KV head cached beside the latent (partial RoPE)")
    parser.add_argument("--linear-window", type=int, default=default("linear_window"), help="linear: exact recent window (tokens)")
    parser.add_argument("--kv-cache-dtype", choices=SPEC_KV_CACHE_DTYPES, default=default("kv_cache_dtype"))
    parser.add_argument("--eviction", choices=EVICTION_MODES, default=default("eviction"),
                        help="KV eviction: a sequence keeps its sinks and recent window resident (ladder: and a ladder)")
    parser.add_argument("--eviction-sinks", type=int, default=default("eviction_sinks"), help="eviction: first tokens kept")
    parser.add_argument("--eviction-window", type=int, default=default("eviction_window"),
                        help="eviction: recent tokens kept")
    parser.add_argument("--eviction-ladder-span", type=int, help="ladder: tokens per level (default: the window)")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--max-seq-len", type=_positive_int, help="longest request (prompt + output), tokens")
    length.add_argument("--p95-tokens", type=_positive_int, help="P95 request length; max_seq_len = +20%%")
    parser.add_argument("--block-size", type=_power_of_two, default=default("block_size"))
    parser.add_argument("--max-num-batched-tokens", type=_positive_int, default=DEFAULT_MAX_NUM_BATCHED_TOKENS)
    parser.add_argument("--max-num-seqs", type=_positive_int, default=DEFAULT_MAX_NUM_SEQS)
    parser.add_argument("--watermark", type=_share, default=DEFAULT_WATERMARK)
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


def run(args: argparse.Namespace) -> int:
    try:
        config_path = args.config or args.model / "config.json"
        config = json.loads(Path(config_path).read_text(), parse_constant=_not_json)
        if not isinstance(config, dict):
            raise PlannerError(f"{config_path} must hold a JSON object (an HF config.json), not a {type(config).__name__}")
        weights = _safetensors_bytes(args.model) if args.model else None
        strategy = KVStrategy(
            attention=args.attention, kv_head_groups=args.kv_head_groups, latent_rank=args.latent_rank,
            kv_cache_dtype=args.kv_cache_dtype, block_size=args.block_size, linear_window=args.linear_window,
            mla_rope_dims=args.mla_rope_dims, eviction=args.eviction, eviction_sinks=args.eviction_sinks,
            eviction_window=args.eviction_window, eviction_ladder_span=args.eviction_ladder_span,
        )
        max_seq_len = args.max_seq_len or (
            max_seq_len_from_p95(args.p95_tokens, block_size=args.block_size) if args.p95_tokens
            else _max_positions(config)
        )
        plan = plan_capacity(
            ModelShape.from_hf_config(config), strategy, gpu_spec(args.gpu), max_seq_len=max_seq_len,
            gpus=args.gpus, max_num_batched_tokens=args.max_num_batched_tokens,
            max_num_seqs=args.max_num_seqs, watermark=args.watermark, weights_bytes_override=weights,
        )
    except (OSError, json.JSONDecodeError, PlannerError) as exc:
        print(f"kvpilot plan: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(plan.to_dict(), indent=2) if args.json else format_plan(plan))
    return 0 if plan.feasible else 1


def _max_positions(config: dict) -> int:
    value = config.get("max_position_embeddings")
    if value is None:
        return 4096
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlannerError(f"model config max_position_embeddings must be a positive integer, got {value!r}; "
                           "or give --max-seq-len")  # fmt: skip
    return value


def _not_json(constant: str) -> None:
    raise PlannerError(f"the model config holds {constant}, which JSON does not allow: give every field a number")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _power_of_two(text: str) -> int:
    value = _positive_int(text)
    if value & (value - 1):
        raise argparse.ArgumentTypeError(f"must be a power of two (1, 2, 4, ..., 16, 32), got {value}: "
                                         "KV blocks hold a power of two of tokens")  # fmt: skip
    return value


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def _safetensors_bytes(directory: Path) -> int | None:
    """Bytes of the weight files (their small JSON headers included), or None without any."""
    files = sorted(directory.glob("*.safetensors"))
    return sum(f.stat().st_size for f in files) if files else None
