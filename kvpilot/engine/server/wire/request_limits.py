"""Bounds on how many items a request may hold, checked before any of them is worked on: each
item costs work per generated token (stop strings) or per request (messages, tools), so their
number is capped, with a 400 that names the field and the limit."""

from __future__ import annotations

import json

from kvpilot.engine.server.wire.api_error import APIError
from kvpilot.engine.server.wire.request_bodies import ChatCompletionRequest, SamplingFields

MAX_STOP_SEQUENCES = 128
MAX_STOP_CHARS = 4096  # all stop strings together
MAX_STOP_TOKEN_IDS = 1024
MAX_MESSAGES = 4096
MAX_TOOLS_CHARS = 512 * 1024  # the tools' JSON together: the chat template renders all of it into the prompt


def check_request_limits(req: SamplingFields) -> None:
    """A 400 for the first field holding more items than this server serves."""
    stops = req.stop_list()
    if len(stops) > MAX_STOP_SEQUENCES:
        _too_many("stop", f"stop holds {len(stops)} sequences; at most {MAX_STOP_SEQUENCES} are accepted")
    chars = sum(len(s) for s in stops)
    if chars > MAX_STOP_CHARS:
        _too_many("stop", f"the stop sequences hold {chars} characters together; at most {MAX_STOP_CHARS} are accepted")
    if req.stop_token_ids is not None and len(req.stop_token_ids) > MAX_STOP_TOKEN_IDS:
        _too_many("stop_token_ids", f"stop_token_ids holds {len(req.stop_token_ids)} ids; at most "
                  f"{MAX_STOP_TOKEN_IDS} are accepted")  # fmt: skip
    if isinstance(req, ChatCompletionRequest) and len(req.messages) > MAX_MESSAGES:
        _too_many("messages", f"messages holds {len(req.messages)} messages; at most {MAX_MESSAGES} are accepted: "
                  "shorten the conversation")  # fmt: skip
    chars = tools_chars(req)
    if chars > MAX_TOOLS_CHARS:
        _too_many("tools", f"the tools' definitions hold {chars} characters of JSON; at most {MAX_TOOLS_CHARS} are "
                  "accepted (the chat template renders them all into the prompt): shorten their descriptions and "
                  "schemas, or send fewer tools")  # fmt: skip


def tools_chars(req: SamplingFields) -> int:
    """Characters of the tools' JSON (what the chat template renders into the prompt)."""
    tools = getattr(req, "tools", None)
    if not tools:
        return 0
    return sum(len(json.dumps(t.model_dump(exclude_none=True), ensure_ascii=False)) for t in tools)


def _too_many(param: str, message: str) -> None:
    raise APIError(400, message, param=param, code="too_many_items")
