"""docs/metrics.md and docs/adapters.md are generated from the tables; the committed files are current."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpilot.sidecar.docs import adapters_markdown, metrics_markdown
from kvpilot.sidecar.schema import SCHEMA

pytestmark = pytest.mark.unit

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize(("page", "render", "command"), [
    ("metrics.md", metrics_markdown, "metrics"),
    ("adapters.md", adapters_markdown, "adapters"),
])
def test_committed_page_is_up_to_date(page, render, command):
    committed = (DOCS / page).read_text()
    assert committed == render(), (
        f"docs/{page} is stale: run `python -m kvpilot.sidecar.docs {command} > docs/{page}`")


def test_reference_lists_every_metric_once():
    text = metrics_markdown()
    for spec in SCHEMA:
        assert text.count(f"| `{spec.name}` |") == 1, spec.name
