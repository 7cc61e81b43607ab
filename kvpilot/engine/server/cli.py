"""`kvpilot serve`: the engine behind an OpenAI-compatible API, plus the stats feed for the sidecar."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import signal
import sys
from collections.abc import Iterator
from typing import Any

from kvpilot.engine.config.arguments import add_config_arguments, config_kwargs
from kvpilot.engine.server.runtime.settings import (
    API,
    FAULTS,
    PLAN,
    ServerSettings,
    add_setting_arguments,
    settings_from_args,
)

log = logging.getLogger("kvpilot.server")

DRAIN_FLUSH_SECONDS = 5.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """ServerSettings' flags (runtime/settings.py) around one flag per EngineConfig knob, in the help's order."""
    add_setting_arguments(parser, None)
    add_config_arguments(parser.add_argument_group("engine"))  # one flag per EngineConfig knob
    for section in (PLAN, API, FAULTS):
        add_setting_arguments(parser.add_argument_group(section), section)


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
    return asyncio.run(_serve(config, settings))


def _prepare(args: argparse.Namespace) -> tuple[Any, ServerSettings, str]:
    from kvpilot.checkpoint_digest import verify_checkpoint
    from kvpilot.engine.config import EngineConfig
    from kvpilot.engine.config.batch import fill_batch_defaults
    from kvpilot.engine.server.runtime.capacity_plan import (
        device_memory,
        parse_bytes,
        plan_for,
        resolve_device,
        strategy_name,
    )
    from kvpilot.planner import PlannerError, format_plan

    if args.shape:  # the shape's config and tokenizer in a directory that lives as long as the server
        import atexit
        import shutil
        import tempfile

        from kvpilot.bench.shapes import write_shape

        tmp = tempfile.mkdtemp(prefix=f"kvpilot-{args.shape}-")
        atexit.register(shutil.rmtree, tmp, True)
        args.model, args.load_format = write_shape(args.shape, tmp), "dummy"
        args.model_name = args.model_name or args.shape
    if not (args.model / "config.json").is_file():
        raise ValueError(f"{args.model} is not a model directory: config.json is missing")
    settings = settings_from_args(args)  # the flags checked, the key and the chat template read
    assert settings.model is not None
    if settings.model_sha256:
        verify_checkpoint(settings.model, settings.model_sha256)
    config = EngineConfig(model=str(settings.model), show_progress=False, **config_kwargs(args))
    device = resolve_device(config.device)
    budget = parse_bytes(settings.cpu_memory_budget)
    fill_batch_defaults(config, device.split(":")[0], device_memory(device, budget).memory_bytes)  # as LLM() does
    try:
        plan = plan_for(config, device, budget, settings.kv_watermark)
    except PlannerError as exc:
        raise ValueError(f"capacity plan: {exc}") from exc
    lines = ["capacity plan (kvpilot.planner):", format_plan(plan)]
    if config.num_kv_blocks is not None:
        lines.append(f"KV pool: {config.num_kv_blocks} blocks, as --num-kv-blocks asks (plan not applied)")
    elif not plan.feasible:
        raise ValueError(f"the capacity plan does not fit: {plan.reason}")
    else:
        config.num_kv_blocks = plan.engine_blocks  # the reserve's and the approximate pool's together
        lines.append(f"KV pool: {plan.engine_blocks} blocks, sized from the plan")
    settings = dataclasses.replace(
        settings, model_name=settings.model_name or settings.model.resolve().name,
        strategy=settings.strategy or strategy_name(config),
    )  # fmt: skip
    faults = settings.faults
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


async def _serve(config: Any, settings: ServerSettings) -> int:
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

    core = settings.engine_core
    if core == "auto":
        core = "process" if resolve_device(config.device).startswith("cuda") and config.tensor_parallel_size == 1 \
            else "thread"  # fmt: skip

    def engine_factory() -> Any:
        if core == "process":
            from kvpilot.engine.server.runtime.core_client import EngineCoreClient

            return EngineCoreClient(config, on_fatal=lambda m: on_failure(m), log_level=settings.log_level)
        return LLMEngine(config, on_fatal=lambda m: on_failure(m))

    runtime = ServerRuntime(settings, engine_factory, warm_up=warm_up, on_ready=on_ready)
    # uvicorn's own deadline is a backstop: runtime.drain() ends what is left at --shutdown-grace
    # with an error event, and the streams need a moment to send it.
    backstop = settings.shutdown_grace + DRAIN_FLUSH_SECONDS
    # h11 with a header deadline and a connection cap (connections.py): slow or idle sockets cannot pile up
    guarded = guarded_h11(settings.header_timeout, settings.max_connections)
    api = _Server.make(create_app(runtime), settings.host, settings.port, settings.log_level, backstop, guarded,
                       settings.keep_alive_timeout)  # fmt: skip
    stats = _Server.make(create_stats_app(runtime), settings.stats_host, settings.stats_port, settings.log_level, 1.0)
    limit_repeats()  # uvicorn's handlers exist now: repeated records (a flood of failing connections) are rate-limited
    failure: list[str] = []
    drains: list[asyncio.Task] = []

    def stop(*_: Any) -> None:
        # The stats feed stays up during the drain (the sidecar keeps reporting); it stops after the API.
        runtime.begin_drain()
        api.should_exit = True
        if not drains:
            drains.append(loop.create_task(runtime.drain(settings.shutdown_grace)))

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
