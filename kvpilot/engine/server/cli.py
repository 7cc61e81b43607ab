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

from kvpilot.engine.config.arguments import add_config_arguments, config_kwargs
from kvpilot.engine.metrics.stats_contract import DEFAULT_STATS_PORT
from kvpilot.engine.server.http.connections import DEFAULT_HEADER_TIMEOUT_SECONDS, DEFAULT_MAX_CONNECTIONS
from kvpilot.engine.server.http.request_guard import DEFAULT_BODY_TIMEOUT_SECONDS, DEFAULT_MAX_BODY_BYTES
from kvpilot.engine.server.runtime.idempotency import DEFAULT_MAX_BYTES as DEFAULT_IDEMPOTENCY_BYTES
from kvpilot.engine.structured.compile_pool import COMPILE_TIMEOUT_SECONDS
from kvpilot.engine.structured.compiler import CACHE_BYTES as GRAMMAR_CACHE_BYTES
from kvpilot.engine.structured.compiler import MAX_GRAMMAR_BYTES

log = logging.getLogger("kvpilot.server")

DEFAULT_CPU_MEMORY_BUDGET = "256MiB"
DRAIN_FLUSH_SECONDS = 5.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kvpilot.bench.shapes import SHAPES

    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", type=Path, help="HF-format model directory")
    source.add_argument("--shape", choices=sorted(SHAPES),
                        help="random weights of a published model's shape (--load-format dummy), with a "
                        "tokenizer over its whole vocabulary")  # fmt: skip
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
    add_config_arguments(parser.add_argument_group("engine"))  # one flag per EngineConfig knob
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
    api.add_argument(
        "--idempotency-max-bytes", type=int, default=DEFAULT_IDEMPOTENCY_BYTES,
        help=f"memory the kept results may hold together; the oldest go first (default {DEFAULT_IDEMPOTENCY_BYTES})",
    )  # fmt: skip
    api.add_argument(
        "--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
        help=f"largest request body accepted; larger ones get a 413 before they are read (default {DEFAULT_MAX_BODY_BYTES})",
    )  # fmt: skip
    api.add_argument(
        "--header-timeout", type=float, default=DEFAULT_HEADER_TIMEOUT_SECONDS, metavar="S",
        help="seconds a connection may take to send its request headers (from opening, or from its previous "
        f"response); slower ones get a 408 and are closed (default {DEFAULT_HEADER_TIMEOUT_SECONDS:g})",
    )  # fmt: skip
    api.add_argument(
        "--keep-alive-timeout", type=float, default=5.0, metavar="S",
        help="seconds an idle keep-alive connection stays open (default 5)",
    )  # fmt: skip
    api.add_argument(
        "--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
        help="API connections open at most (never more than half the open-files limit); at the cap a new one "
        f"closes the longest-idle one, or gets a 503 when all are busy (default {DEFAULT_MAX_CONNECTIONS})",
    )  # fmt: skip
    api.add_argument(
        "--body-timeout", type=float, default=DEFAULT_BODY_TIMEOUT_SECONDS, metavar="S",
        help="seconds a request body may take to arrive once its headers have; slower ones get a 408 "
        f"(default {DEFAULT_BODY_TIMEOUT_SECONDS:g})",
    )  # fmt: skip
    api.add_argument(
        "--max-concurrent-scores", type=int, default=4,
        help="POST /v1/score requests in flight at most; more get a 429 with Retry-After",
    )  # fmt: skip
    api.add_argument(
        "--no-score-route", action="store_true",
        help="serve no POST /v1/score (404), as an engine without it; the accuracy gate then scores with echo",
    )
    api.add_argument(
        "--grammar-compile-timeout", type=float, default=COMPILE_TIMEOUT_SECONDS, metavar="S",
        help="seconds a structured-output constraint may take to compile; slower ones get a 400 naming this limit "
        f"(default {COMPILE_TIMEOUT_SECONDS:g})",
    )  # fmt: skip
    api.add_argument(
        "--grammar-cache-bytes", type=int, default=GRAMMAR_CACHE_BYTES,
        help=f"memory the compiled-grammar cache may hold; the least recently used go first (default {GRAMMAR_CACHE_BYTES})",
    )  # fmt: skip
    api.add_argument(
        "--max-grammar-bytes", type=int, default=MAX_GRAMMAR_BYTES,
        help=f"largest compiled grammar accepted; larger ones get a 400 (default {MAX_GRAMMAR_BYTES})",
    )  # fmt: skip
    key = api.add_mutually_exclusive_group()
    key.add_argument(
        "--api-key", help="require `Authorization: Bearer KEY` on every route but /health and /ready "
        "(prefer --api-key-file: a flag shows in the process list)",
    )  # fmt: skip
    key.add_argument("--api-key-file", type=Path, help="read the API key from this file (e.g. a mounted Secret)")
    api.add_argument(
        "--chat-template", type=Path,
        help="a Jinja chat template file for /v1/chat/completions (checkpoints without one, or to replace theirs)",
    )  # fmt: skip
    api.add_argument(
        "--tool-call-parser", choices=["auto", "hermes", "llama3_json", "none"], default="auto",
        help="how tool calls are read from the output under tool_choice 'auto': hermes (<tool_call>{...}</tool_call>), "
             "llama3_json ({\"name\", \"parameters\"}), none (auto refused), or auto: from the chat template",
    )  # fmt: skip
    api.add_argument("--no-warmup", action="store_true", help="skip the start-up warm-up")
    api.add_argument(
        "--engine-core", choices=("auto", "thread", "process"), default="auto",
        help="where the engine steps: a thread of the API process, or a process of its own (HTTP, tokenising "
        "and streaming then never wait for the engine's Python; engine/server/runtime/core_process.py). auto: a "
        "process on one CUDA device, a thread on CPU and under tensor parallelism",
    )  # fmt: skip
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
    from kvpilot.engine.config.batch import fill_batch_defaults
    from kvpilot.engine.server import ServerSettings
    from kvpilot.engine.server.http.auth import read_key_file
    from kvpilot.engine.server.runtime.capacity_plan import (
        device_memory,
        parse_bytes,
        plan_for,
        resolve_device,
        strategy_name,
    )
    from kvpilot.engine.server.runtime.faults import FaultSettings
    from kvpilot.planner import PlannerError, format_plan

    if args.shape:  # the shape's config and tokenizer in a directory that lives as long as the server
        import atexit
        import shutil
        import tempfile

        from kvpilot.bench.shapes import write_shape

        tmp = tempfile.mkdtemp(prefix=f"kvpilot-{args.shape}-")
        atexit.register(shutil.rmtree, tmp, True)
        args.model, args.load_format = write_shape(args.shape, tmp), "dummy"
        args.served_model_name = args.served_model_name or args.shape
    if not (args.model / "config.json").is_file():
        raise ValueError(f"{args.model} is not a model directory: config.json is missing")
    faults = FaultSettings(args.fault_latency_ms, args.fault_error_rate, args.fault_seed)
    api_key = read_key_file(args.api_key_file) if args.api_key_file else args.api_key
    if args.max_body_bytes < 1 or args.max_concurrent_scores < 1 or args.idempotency_max_bytes < 1:
        raise ValueError("--max-body-bytes, --max-concurrent-scores and --idempotency-max-bytes must be at least 1")
    if not args.body_timeout > 0:
        raise ValueError(f"--body-timeout must be positive, got {args.body_timeout}")
    if not args.header_timeout > 0 or not args.keep_alive_timeout > 0 or args.max_connections < 1:
        raise ValueError(f"--header-timeout and --keep-alive-timeout must be positive and --max-connections >= 1, got "
                         f"{args.header_timeout}, {args.keep_alive_timeout}, {args.max_connections}")  # fmt: skip
    if not args.grammar_compile_timeout > 0 or args.max_grammar_bytes < 1 or args.grammar_cache_bytes < args.max_grammar_bytes:
        raise ValueError("--grammar-compile-timeout must be > 0, --max-grammar-bytes >= 1 and --grammar-cache-bytes "
                         f"at least --max-grammar-bytes; got {args.grammar_compile_timeout}, {args.max_grammar_bytes}, "
                         f"{args.grammar_cache_bytes}")  # fmt: skip
    chat_template = read_chat_template(args.chat_template) if args.chat_template else None
    if args.model_sha256:
        verify_checkpoint(args.model, args.model_sha256)
    config = EngineConfig(model=str(args.model), show_progress=False, **config_kwargs(args))
    device = resolve_device(config.device)
    budget = parse_bytes(args.cpu_memory_budget)
    fill_batch_defaults(config, device.split(":")[0], device_memory(device, budget).memory_bytes)  # as LLM() does
    try:
        plan = plan_for(config, device, budget, args.kv_watermark)
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
        idempotency_max_bytes=args.idempotency_max_bytes,
        max_body_bytes=args.max_body_bytes,
        body_timeout_seconds=args.body_timeout,
        max_concurrent_scores=args.max_concurrent_scores,
        score_route=not args.no_score_route,
        api_key=api_key,
        warmup=not args.no_warmup,
        faults=faults,
        chat_template=chat_template,
        tool_call_parser=args.tool_call_parser,
        grammar_compile_timeout=args.grammar_compile_timeout,
        grammar_cache_bytes=args.grammar_cache_bytes,
        max_grammar_bytes=args.max_grammar_bytes,
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
    def make(
        app: Any, host: str, port: int, log_level: str, grace: float | None, http: Any = "h11", keep_alive: float = 5.0
    ) -> Any:
        import uvicorn

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                yield

        # http/ws pinned: uvicorn's "auto" picks httptools and websockets when some other package
        # (a benchmark client, say) happens to install them, and that would change how malformed,
        # oversized and slow requests are answered under a server whose limits are tested on h11.
        config = uvicorn.Config(
            app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=grace, lifespan="on",
            http=http, ws="none", timeout_keep_alive=keep_alive,
        )
        return Server(config)


async def _serve(args: argparse.Namespace, config: Any, settings: Any) -> int:
    from kvpilot.engine.llm_engine import LLMEngine
    from kvpilot.engine.server import ServerRuntime, create_app, create_stats_app
    from kvpilot.engine.server.http.connections import guarded_h11, handle_descriptor_exhaustion
    from kvpilot.engine.server.http.log_limits import limit_repeats
    from kvpilot.engine.server.runtime.warmup import warm_up

    def on_ready(engine: Any) -> None:
        stats = engine.stats()
        kv = stats.get("kv", {})
        print(
            f"engine ready: {kv.get('blocks_total')} KV blocks of {kv.get('block_size')} tokens "
            f"({kv.get('bytes_per_block')} bytes each), max_model_len {engine.max_model_len}, "
            f"max_num_seqs {engine.config.max_num_seqs}, strategy {settings.strategy}",
            flush=True,
        )

    # a tensor-parallel rank that dies calls on_failure: the server stops admitting, drains and exits 1
    from kvpilot.engine.server.runtime.capacity_plan import resolve_device

    core = args.engine_core
    if core == "auto":
        core = "process" if resolve_device(config.device).startswith("cuda") and config.tensor_parallel_size == 1 \
            else "thread"  # fmt: skip

    def engine_factory() -> Any:
        if core == "process":
            from kvpilot.engine.server.runtime.core_client import EngineCoreClient

            return EngineCoreClient(config, on_fatal=lambda m: on_failure(m), log_level=args.log_level)
        return LLMEngine(config, on_fatal=lambda m: on_failure(m))

    runtime = ServerRuntime(settings, engine_factory, warm_up=warm_up, on_ready=on_ready)
    # uvicorn's own deadline is a backstop: runtime.drain() ends what is left at --shutdown-grace
    # with an error event, and the streams need a moment to send it.
    backstop = args.shutdown_grace + DRAIN_FLUSH_SECONDS
    # h11 with a header deadline and a connection cap (connections.py): slow or idle sockets cannot pile up
    guarded = guarded_h11(args.header_timeout, args.max_connections)
    api = _Server.make(create_app(runtime), args.host, args.port, args.log_level, backstop, guarded, args.keep_alive_timeout)
    stats = _Server.make(create_stats_app(runtime), args.stats_host, args.stats_port, args.log_level, 1.0)
    limit_repeats()  # uvicorn's handlers exist now: repeated records (a flood of failing connections) are rate-limited
    failure: list[str] = []
    drains: list[asyncio.Task] = []

    def stop(*_: Any) -> None:
        # The stats feed stays up during the drain (the sidecar keeps reporting); it stops after the API.
        runtime.begin_drain()
        api.should_exit = True
        if not drains:
            drains.append(loop.create_task(runtime.drain(args.shutdown_grace)))

    def on_failure(message: str) -> None:
        failure.append(message)
        loop.call_soon_threadsafe(stop)

    loop = asyncio.get_running_loop()
    handle_descriptor_exhaustion(loop, guarded)  # at the open-files limit: shed idle connections, log once
    runtime.on_failure = on_failure
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    stats_task = asyncio.create_task(stats.serve())
    await api.serve()
    stop()
    for drain in drains:
        drain.cancel()
    stats.should_exit = True
    await stats_task
    runtime.shutdown()
    if runtime.engine is not None:
        runtime.engine.shutdown()  # tensor-parallel ranks stop with the server
    if failure:
        started = "failed to start" if runtime.failure else "failed"  # else: a rank died while serving
        print(f"kvpilot serve: the engine {started}: {failure[0]}", file=sys.stderr)
        return 1
    if not api.started:
        return 1
    return 0


def read_chat_template(path: Path) -> str:
    """--chat-template FILE's text, checked to compile, or a ValueError saying what is wrong."""
    from kvpilot.engine.tokenizer import check_chat_template

    if not path.is_file():
        raise ValueError(f"--chat-template {path}: no such file; give a Jinja template file")
    try:
        return check_chat_template(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"--chat-template {path}: {exc}") from exc
