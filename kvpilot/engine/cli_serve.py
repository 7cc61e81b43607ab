"""`kvpilot serve`: the engine behind an OpenAI-compatible API, plus the stats feed for the sidecar."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvpilot.engine.kv_strategy import KV_CACHE_DTYPES
from kvpilot.engine.stats_contract import DEFAULT_STATS_PORT

log = logging.getLogger("kvpilot.server")

DEFAULT_CPU_MEMORY_BUDGET = "256MiB"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, type=Path, help="HF-format model directory")
    parser.add_argument(
        "--model-sha256",
        metavar="HEX",
        help="refuse to start unless the checkpoint digest matches (sha256 of the sha256sum-style "
        "manifest of the *.safetensors files; print it with `kvpilot digest DIR`)",
    )
    parser.add_argument(
        "--served-model-name", help="name clients pass as `model` (default: the directory name)"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--stats-host", default="127.0.0.1", help="the stats feed binds here (sidecar only)")
    parser.add_argument("--stats-port", type=int, default=DEFAULT_STATS_PORT)
    engine = parser.add_argument_group("engine")
    engine.add_argument("--dtype", default="auto", choices=("auto", "float32", "float16", "bfloat16"))
    engine.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    engine.add_argument("--max-num-seqs", type=int, default=64, help="sequences running at once")
    engine.add_argument(
        "--max-num-batched-tokens", type=int, default=2048, help="tokens per step (prefill budget)"
    )
    engine.add_argument(
        "--max-model-len", type=int, help="prompt + output tokens at most (default: config.json)"
    )
    engine.add_argument("--block-size", type=int, default=16)
    engine.add_argument(
        "--num-kv-blocks", type=int, help="KV pool size in blocks (default: from the capacity plan)"
    )
    engine.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    engine.add_argument("--chunked-prefill", action=argparse.BooleanOptionalAction, default=True)
    engine.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=KV_CACHE_DTYPES,
        help="auto: the model dtype (switching to int8 by batch size with --kv-quant-auto-threshold); "
        "int8 / fp8: 8-bit KV dequantised in the attention kernels",
    )
    engine.add_argument(
        "--kv-quant-auto-threshold", type=int, help="auto: new sequences get int8 blocks at this running batch size"
    )
    engine.add_argument(
        "--kv-quant-auto-hysteresis", type=int, help="auto: back to 16-bit below threshold minus this (threshold/4)"
    )
    engine.add_argument(
        "--kv-quant-auto-split", type=float, default=0.5, help="auto: share of the KV memory for 16-bit blocks"
    )
    engine.add_argument("--disable-kv-quant", action="store_true", help="serve the 16-bit KV cache")
    engine.add_argument("--attention", default="native", help="memory strategy: native | gqa | mla | linear")
    engine.add_argument("--kv-head-groups", type=int, help="gqa: KV heads after mean-pooling the checkpoint's")
    engine.add_argument("--disable-gqa", action="store_true", help="serve the checkpoint's own KV heads")
    engine.add_argument(
        "--linear-window", type=int, default=64, help="linear: most recent tokens attended exactly"
    )
    engine.add_argument("--linear-features", type=int, help="linear: random features per KV head (head_dim)")
    engine.add_argument("--disable-linear", action="store_true", help="serve the checkpoint's softmax attention")
    engine.add_argument("--latent-rank", type=int, help="mla: width of the SVD latent cached per token and layer")
    engine.add_argument(
        "--disable-mla", action="store_true", help="serve the original attention (DeepSeek: no absorbed decode)"
    )
    engine.add_argument(
        "--eviction", default="none", choices=("none", "sinks", "ladder"),
        help="long context: keep attention sinks + a recent window (ladder: older spans kept sparsely)",
    )  # fmt: skip
    engine.add_argument("--eviction-sinks", type=int, default=4, help="eviction: first tokens always kept")
    engine.add_argument("--eviction-window", type=int, default=1024, help="eviction: recent tokens kept")
    engine.add_argument("--eviction-ladder-span", type=int, help="ladder: tokens per level (default: window)")
    engine.add_argument("--validate-every", type=int, default=100, help="decode tokens between validations")
    engine.add_argument("--validation-sample-rate", type=float, default=0.1, help="share of sequences validated")
    engine.add_argument(
        "--head-utilization-every", type=int, default=64, help="decode steps between head-utilisation samples"
    )
    engine.add_argument("--cuda-graphs", action="store_true", help="replay CUDA graphs for decode-only steps (CUDA)")
    plan = parser.add_argument_group("capacity plan")
    plan.add_argument("--kv-watermark", type=float, default=0.8, help="share of free memory for the KV pool")
    plan.add_argument(
        "--cpu-memory-budget",
        default=DEFAULT_CPU_MEMORY_BUDGET,
        help=f"memory the plan may use on CPU, weights included (default {DEFAULT_CPU_MEMORY_BUDGET})",
    )
    api = parser.add_argument_group("API")
    api.add_argument("--strategy-name", help="X-Model-Strategy value (default: from the engine config)")
    api.add_argument("--max-queue", type=int, default=256, help="requests waiting beyond max-num-seqs")
    api.add_argument(
        "--idempotency-ttl", type=float, default=600.0, help="seconds an Idempotency-Key is kept"
    )
    api.add_argument("--idempotency-max-keys", type=int, default=10_000)
    api.add_argument("--no-warmup", action="store_true", help="skip the start-up warm-up")
    api.add_argument(
        "--shutdown-grace", type=float, default=30.0, help="seconds in-flight requests get on SIGTERM"
    )
    api.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    faults = parser.add_argument_group(
        "fault injection (TEST ONLY: for rollout and reliability tests; never in production)"
    )
    faults.add_argument(
        "--fault-latency-ms", type=float, default=0.0, metavar="MS",
        help="TEST ONLY: sleep MS before every engine step, so TTFT and every inter-token gap rise by "
        "about MS (default 0: off)",
    )  # fmt: skip
    faults.add_argument(
        "--fault-error-rate", type=float, default=0.0, metavar="P",
        help="TEST ONLY: answer this share (0-1) of generation requests with HTTP 500, counted in "
        "requests_failed_total{reason=\"fault\"} (default 0: off)",
    )  # fmt: skip
    faults.add_argument("--fault-seed", type=int, help="TEST ONLY: seed for --fault-error-rate draws")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config, settings, plan_text = _prepare(args)
    except (OSError, ValueError) as exc:
        print(f"kvpilot serve: {exc}", file=sys.stderr)
        return 2
    print(plan_text, flush=True)
    return asyncio.run(_serve(args, config, settings))


def _prepare(args: argparse.Namespace) -> tuple[Any, Any, str]:
    from kvpilot.checkpoint_digest import verify_checkpoint
    from kvpilot.engine.config import EngineConfig
    from kvpilot.engine.server import ServerSettings
    from kvpilot.engine.server.capacity import parse_bytes, plan_for, resolve_device, strategy_name
    from kvpilot.engine.server.faults import FaultSettings
    from kvpilot.planner import PlannerError, format_plan

    if not (args.model / "config.json").is_file():
        raise ValueError(f"{args.model} is not a model directory: config.json is missing")
    faults = FaultSettings(args.fault_latency_ms, args.fault_error_rate, args.fault_seed)
    if args.model_sha256:
        verify_checkpoint(args.model, args.model_sha256)
    config = EngineConfig(
        model=str(args.model),
        dtype=args.dtype,
        device=args.device,
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        enable_prefix_caching=args.enable_prefix_caching,
        enable_chunked_prefill=args.chunked_prefill,
        strategy=args.attention,
        kv_cache_dtype=args.kv_cache_dtype,
        show_progress=False,
        attention=args.attention,
        kv_head_groups=args.kv_head_groups,
        disable_gqa=args.disable_gqa,
        linear_window=args.linear_window,
        linear_features=args.linear_features,
        disable_linear=args.disable_linear,
        latent_rank=args.latent_rank,
        disable_mla=args.disable_mla,
        kv_quant_auto_threshold=args.kv_quant_auto_threshold,
        kv_quant_auto_hysteresis=args.kv_quant_auto_hysteresis,
        kv_quant_auto_split=args.kv_quant_auto_split,
        disable_kv_quant=args.disable_kv_quant,
        eviction=args.eviction,
        eviction_sinks=args.eviction_sinks,
        eviction_window=args.eviction_window,
        eviction_ladder_span=args.eviction_ladder_span,
        validate_every=args.validate_every,
        validation_sample_rate=args.validation_sample_rate,
        head_utilization_every=args.head_utilization_every,
        cuda_graphs=args.cuda_graphs,
    )
    device = resolve_device(config.device)
    try:
        plan = plan_for(config, device, parse_bytes(args.cpu_memory_budget), args.kv_watermark)
    except PlannerError as exc:
        raise ValueError(f"capacity plan: {exc}") from exc
    lines = ["capacity plan (kvpilot.planner):", format_plan(plan)]
    if config.num_kv_blocks is not None:
        lines.append(f"KV pool: {config.num_kv_blocks} blocks, as --num-kv-blocks asks (plan not applied)")
    elif not plan.feasible:
        raise ValueError(f"the capacity plan does not fit: {plan.reason}")
    else:
        config.num_kv_blocks = plan.num_blocks
        lines.append(f"KV pool: {plan.num_blocks} blocks, sized from the plan")
    settings = ServerSettings(
        model_name=args.served_model_name or args.model.resolve().name,
        strategy=args.strategy_name or strategy_name(config),
        max_queue=args.max_queue,
        idempotency_ttl_seconds=args.idempotency_ttl,
        idempotency_max_keys=args.idempotency_max_keys,
        warmup=not args.no_warmup,
        faults=faults,
    )
    if faults.active:
        lines.append(
            f"TEST-ONLY FAULTS ON: +{faults.latency_ms:g} ms per engine step, "
            f"{faults.error_rate:g} of generations answered 500"
        )
    return config, settings, "\n".join(lines)


class _Server:
    """uvicorn.Server whose signal handling is ours: one SIGTERM stops both servers, exit 0."""

    @staticmethod
    def make(app: Any, host: str, port: int, log_level: str, grace: float | None) -> Any:
        import uvicorn

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                yield

        config = uvicorn.Config(
            app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=grace, lifespan="on"
        )
        return Server(config)


async def _serve(args: argparse.Namespace, config: Any, settings: Any) -> int:
    from kvpilot.engine.llm_engine import LLMEngine
    from kvpilot.engine.server import ServerRuntime, create_app, create_stats_app
    from kvpilot.engine.server.warmup import warm_up

    def on_ready(engine: Any) -> None:
        stats = engine.stats()
        kv = stats.get("kv", {})
        print(
            f"engine ready: {kv.get('blocks_total')} KV blocks of {kv.get('block_size')} tokens "
            f"({kv.get('bytes_per_block')} bytes each), max_model_len {engine.max_model_len}, "
            f"max_num_seqs {engine.config.max_num_seqs}, strategy {settings.strategy}",
            flush=True,
        )

    runtime = ServerRuntime(settings, lambda: LLMEngine(config), warm_up=warm_up, on_ready=on_ready)
    api = _Server.make(create_app(runtime), args.host, args.port, args.log_level, args.shutdown_grace)
    stats = _Server.make(create_stats_app(runtime), args.stats_host, args.stats_port, args.log_level, 1.0)
    failure: list[str] = []

    def stop(*_: Any) -> None:
        runtime.begin_drain()
        api.should_exit = True
        stats.should_exit = True

    def on_failure(message: str) -> None:
        failure.append(message)
        loop.call_soon_threadsafe(stop)

    loop = asyncio.get_running_loop()
    runtime.on_failure = on_failure
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    stats_task = asyncio.create_task(stats.serve())
    await api.serve()
    stop()
    await stats_task
    runtime.shutdown()
    if failure:
        print(f"kvpilot serve: the engine failed to start: {failure[0]}", file=sys.stderr)
        return 1
    if not api.started:
        return 1
    return 0
