"""The HTTP routes: OpenAI-compatible completions, models, score, and the probes."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse, Response

from kvpilot.engine.server.endpoints.completions import serve_completion
from kvpilot.engine.server.endpoints.responses_stream import serve_response
from kvpilot.engine.server.endpoints.scoring import score
from kvpilot.engine.server.http.errors import STRATEGY_HEADER
from kvpilot.engine.server.runtime.server_runtime import ServerRuntime
from kvpilot.engine.server.wire.request_bodies import ChatCompletionRequest, CompletionRequest, ScoreRequest
from kvpilot.engine.server.wire.response_bodies import (
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    ErrorResponse,
    HealthStatus,
    ModelCard,
    ModelList,
    ScoreResponse,
)
from kvpilot.engine.server.wire.responses_api import ResponseObject, ResponsesRequest

router = APIRouter()

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": text}
    for status, text in {
        400: "invalid or unsupported request (message says which field and the limit)",
        404: "unknown model",
        422: "malformed body (message names the field), or an Idempotency-Key reused with another body",
        429: "queue full; see Retry-After",
        500: "this request failed inside the server; others are unaffected",
        503: "the engine is not ready; see Retry-After",
    }.items()
}


# Read by serve_completion from the request; declared here so the OpenAPI schema documents it.
_IDEMPOTENCY = Header(
    default=None,
    alias="Idempotency-Key",
    description="Retry-safe key: the same key and body return the same completion (or join it in flight).",
)


def _stream_doc(model: type) -> dict[int | str, dict[str, Any]]:
    return {
        200: {
            "description": "the completion; with stream=true a text/event-stream of `data: <chunk>` "
            "lines ending with `data: [DONE]`",
            "content": {
                "text/event-stream": {
                    "schema": {
                        "type": "object",
                        "description": f"one server-sent event: `data` holds a JSON {model.__name__}, "
                        "an error object, or `[DONE]` at the end",
                        "required": ["data"],
                        "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
                    }
                }
            },
        },
        **_ERRORS,
    }


def _runtime(request: Request) -> ServerRuntime:
    return request.app.state.runtime


@router.post(
    "/v1/chat/completions", response_model=ChatCompletion, responses=_stream_doc(ChatCompletionChunk)
)
async def chat_completions(
    body: ChatCompletionRequest, request: Request, idempotency_key: str | None = _IDEMPOTENCY
) -> Response:
    return await serve_completion(request, _runtime(request), body)


@router.post("/v1/completions", response_model=Completion, responses=_stream_doc(Completion))
async def completions(
    body: CompletionRequest, request: Request, idempotency_key: str | None = _IDEMPOTENCY
) -> Response:
    return await serve_completion(request, _runtime(request), body)


@router.post("/v1/responses", response_model=ResponseObject, responses=_stream_doc(ResponseObject))
async def create_response(
    body: ResponsesRequest, request: Request, idempotency_key: str | None = _IDEMPOTENCY
) -> Response:
    """A minimal subset of OpenAI's Responses API, served as a chat completion (docs/api.md)."""
    return await serve_response(request, _runtime(request), body)


@router.post("/v1/score", response_model=ScoreResponse, responses=_ERRORS)
async def score_continuation(body: ScoreRequest, request: Request) -> ScoreResponse:
    return await score(_runtime(request), body)


@router.get("/v1/models", response_model=ModelList)
async def list_models(request: Request) -> ModelList:
    runtime = _runtime(request)
    max_len = runtime.admission.max_model_len if runtime.admission is not None else 0
    card = ModelCard(
        id=runtime.settings.model_name,
        created=runtime.created,
        max_model_len=max_len,
        strategy=runtime.settings.strategy,
    )
    return ModelList(data=[card])


@router.get("/health", response_model=HealthStatus, responses={503: {"model": HealthStatus}})
async def health(request: Request) -> Response:
    """Liveness: 200 while the process can serve; 503 once the engine loop has died (the pod must restart)."""
    runtime = _runtime(request)
    failure = runtime.engine_failure
    if failure is not None:
        body = HealthStatus(status="failed", detail=failure).model_dump()
        return JSONResponse(body, status_code=503, headers={STRATEGY_HEADER: runtime.settings.strategy})
    return JSONResponse(HealthStatus(status="alive", detail=runtime.state).model_dump())


@router.get("/ready", response_model=HealthStatus, responses={503: {"model": HealthStatus}})
async def ready(request: Request) -> Response:
    runtime = _runtime(request)
    headers = {STRATEGY_HEADER: runtime.settings.strategy}
    if runtime.ready:
        return JSONResponse(HealthStatus(status="ready").model_dump(), headers=headers)
    headers["Retry-After"] = "5"
    body = HealthStatus(status=runtime.state, detail=runtime.readiness_detail()).model_dump()
    return JSONResponse(body, status_code=503, headers=headers)
