"""The stats feed for the sidecar: a second, small HTTP app serving GET /stats on its own port."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from kvpilot.engine.metrics.stats_contract import STATS_PATH
from kvpilot.engine.server.http.strategy_header import StrategyHeaderMiddleware
from kvpilot.engine.server.runtime.server_runtime import ServerRuntime


def create_stats_app(runtime: ServerRuntime) -> FastAPI:
    """`GET /stats` returns engine.stats() (taken between two engine steps) as JSON; 503 until the
    engine has started."""
    app = FastAPI(title="kvpilot engine stats feed", openapi_url=None, docs_url=None, redoc_url=None)

    @app.get(STATS_PATH)
    async def stats() -> JSONResponse:
        snapshot = await runtime.stats()
        if snapshot is None:
            detail = runtime.readiness_detail()
            return JSONResponse(
                {
                    "error": {
                        "message": f"no stats yet: {detail}",
                        "type": "service_unavailable",
                        "param": None,
                        "code": "not_ready",
                    }
                },
                status_code=503,
                headers={"Retry-After": "5"},
            )
        return JSONResponse(snapshot)

    app.add_middleware(StrategyHeaderMiddleware, strategy=runtime.settings.strategy)
    return app
