"""Pure ASGI middleware that stamps every response, streams included, with the serving strategy."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvpilot.engine.server.http.errors import STRATEGY_HEADER


class StrategyHeaderMiddleware:
    """Adds `X-Model-Strategy: <strategy>` to every HTTP response that lacks it."""

    def __init__(self, app: ASGIApp, strategy: str) -> None:
        self.app = app
        self._name = STRATEGY_HEADER.lower().encode("latin-1")
        self._value = strategy.encode("latin-1")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_header(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(name.lower() == self._name for name, _ in headers):
                    headers.append((self._name, self._value))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_header)
