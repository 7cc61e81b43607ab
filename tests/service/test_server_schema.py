"""schemathesis against the server's own OpenAPI schema (GET /openapi.json = app.openapi()):
valid and invalid requests to every operation, never a 5xx, and documented bodies conform."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from tests.service.conftest import SERVED_MODEL, ServerProcess

pytestmark = pytest.mark.service

MAX_EXAMPLES = 25
SHORT = 8  # keep generations short: the point is the API's handling, not the model's speed


def _aim(case: Any, use_served_model: bool) -> Any:
    """Half the valid cases name the served model, so they get past the 404 and reach the engine."""
    body = case.body
    if use_served_model and isinstance(body, dict) and "model" in body:
        body["model"] = SERVED_MODEL
        for field in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
            if not isinstance(body.get(field), int) or body[field] > SHORT:
                body[field] = SHORT
    return case


@pytest.fixture(scope="module")
def api(server: ServerProcess) -> Any:
    return schemathesis.openapi.from_url(server.base_url + "/openapi.json")


OPERATIONS = (
    "POST /v1/chat/completions",
    "POST /v1/completions",
    "POST /v1/score",
    "POST /v1/responses",
    "GET /v1/models",
    "GET /health",
    "GET /ready",
    "POST /tokenize",
    "POST /detokenize",
    "GET /version",
    "GET /tokenizer_info",
)


def test_schema_lists_every_route(api: Any) -> None:
    assert {result.ok().label for result in api.get_all_operations()} == set(OPERATIONS)


CASES = [(label, GenerationMode.POSITIVE) for label in OPERATIONS] + [
    # Only the POST operations take input that can be made invalid.
    (label, GenerationMode.NEGATIVE)
    for label in OPERATIONS
    if label.startswith("POST")
]


@pytest.mark.parametrize(("label", "mode"), CASES, ids=[f"{label}-{mode.value}" for label, mode in CASES])
def test_no_server_errors(api: Any, server: ServerProcess, label: str, mode: GenerationMode) -> None:
    operation = api.find_operation_by_label(label)
    assert operation is not None, label
    checks = [not_a_server_error]
    if mode is GenerationMode.POSITIVE:
        checks.append(response_schema_conformance)

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.tuples(operation.as_strategy(generation_mode=mode), st.booleans()))
    def run(drawn: tuple[Any, bool]) -> None:
        case = _aim(*drawn) if mode is GenerationMode.POSITIVE else drawn[0]
        case.call_and_validate(base_url=server.base_url, checks=checks, timeout=60)

    run()
