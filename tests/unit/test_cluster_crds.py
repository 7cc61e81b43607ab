"""crds.established reads a CRD the API server may not have finished: absent, null status, null conditions."""

from __future__ import annotations

from typing import Any

import pytest

from kvpilot.cluster import crds
from kvpilot.cluster.api import ApiError

pytestmark = pytest.mark.unit


class _Api:
    def __init__(self, answer: dict[str, Any] | int) -> None:
        self.answer = answer

    def request(self, method: str, path: str, *_: Any, **__: Any) -> dict[str, Any]:
        if isinstance(self.answer, int):
            raise ApiError(method, path, self.answer, "x")
        return self.answer


@pytest.mark.parametrize("crd", [
    {}, {"status": None}, {"status": {}}, {"status": {"conditions": None}},   # just applied: null at any level
    {"status": {"conditions": [{"type": "NamesAccepted", "status": "True"}]}},
    {"status": {"conditions": [{"type": "Established", "status": "False"}]}},
])
def test_a_crd_not_yet_established_reads_false(crd: dict[str, Any]) -> None:
    assert crds.established(_Api(crd), "x.example.com") is False  # type: ignore[arg-type]


def test_an_established_crd_reads_true_and_an_absent_one_false() -> None:
    ok = {"status": {"conditions": [{"type": "Established", "status": "True"}]}}
    assert crds.established(_Api(ok), "x.example.com") is True  # type: ignore[arg-type]
    assert crds.established(_Api(404), "x.example.com") is False  # type: ignore[arg-type]
    assert crds.established(_Api(503), "x.example.com") is False  # type: ignore[arg-type]


def test_other_api_errors_are_not_hidden() -> None:
    with pytest.raises(ApiError, match="403"):
        crds.established(_Api(403), "x.example.com")  # type: ignore[arg-type]
