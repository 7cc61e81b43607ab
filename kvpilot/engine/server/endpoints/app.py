"""The API application: routes, error shape, strategy header, and the engine's life cycle."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from kvpilot import __version__
from kvpilot.engine.server.endpoints.routes import router
from kvpilot.engine.server.endpoints.utility_routes import utility_router
from kvpilot.engine.server.endpoints.vllm_metrics import metrics_router
from kvpilot.engine.server.http.auth import ApiKeyMiddleware
from kvpilot.engine.server.http.errors import APIError, install_error_handlers
from kvpilot.engine.server.http.request_guard import RequestGuardMiddleware
from kvpilot.engine.server.http.strategy_header import StrategyHeaderMiddleware
from kvpilot.engine.server.runtime.server_runtime import ServerRuntime


def create_app(runtime: ServerRuntime, *, manage_engine: bool = True) -> FastAPI:
    """The API app. With `manage_engine`, starting the app starts loading the engine (in the
    background: /health answers at once, /ready once the engine has loaded and warmed up) and
    stopping it stops the engine loop, aborting what is still running."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if manage_engine and runtime.state == "starting":
            runtime.start_loading()
        try:
            yield
        finally:
            if manage_engine:
                runtime.shutdown()

    app = FastAPI(
        title="kvpilot engine",
        version=__version__,
        description="OpenAI-compatible completions served by the kvpilot engine, plus /v1/score.",
        lifespan=lifespan,
    )
    app.state.runtime = runtime
    install_error_handlers(
        app,
        runtime.settings.strategy,
        on_invalid=lambda: runtime.record_rejection("invalid"),
        on_internal=lambda: runtime.record_failure("internal"),
    )
    if not runtime.settings.score_route:  # --no-score-route: answered first, as an engine without /v1/score
        app.add_api_route("/v1/score", _no_score_route, methods=["POST"], include_in_schema=False)
    app.include_router(router)
    app.include_router(utility_router)
    app.include_router(metrics_router)  # vLLM's names on the API port (vllm_metrics.py)
    settings = runtime.settings
    # Added last = outermost: the key is checked first, then the body's type and size.
    app.add_middleware(
        RequestGuardMiddleware, max_body_bytes=settings.max_body_bytes, strategy=settings.strategy,
        body_timeout_s=settings.body_timeout_seconds, on_invalid=lambda: runtime.record_rejection("invalid"),
    )  # fmt: skip
    if settings.api_key:
        app.add_middleware(ApiKeyMiddleware, key=settings.api_key, strategy=settings.strategy)
    app.add_middleware(StrategyHeaderMiddleware, strategy=settings.strategy)
    return app


async def _no_score_route() -> None:
    raise APIError(404, "POST /v1/score is off on this server (--no-score-route); score with /v1/completions, "
                        "echo and logprobs", code="not_found")
