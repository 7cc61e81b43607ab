"""`kvpilot operator` command line: scope and peering flags reach kopf.run."""

from __future__ import annotations

import argparse

import pytest

from kvpilot.operator import cli

pytestmark = pytest.mark.unit


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(argv)


def test_needs_a_scope() -> None:
    with pytest.raises(SystemExit, match="--namespace NS"):
        cli.run(parse())


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (("-n", "a", "-n", "b"), {"namespaces": ["a", "b"], "clusterwide": False, "standalone": True,
                                  "peering_name": None, "priority": 0}),
        (("-A", "--peering", "kvpilot", "--priority", "100"),
         {"namespaces": [], "clusterwide": True, "standalone": False, "peering_name": "kvpilot", "priority": 100}),
    ],
)
def test_flags_reach_kopf(monkeypatch: pytest.MonkeyPatch, argv: tuple[str, ...], expected: dict) -> None:
    import kopf

    seen: dict = {}
    monkeypatch.setattr(kopf, "run", lambda **kw: seen.update(kw))
    monkeypatch.setattr(kopf, "configure", lambda **kw: None)
    assert cli.run(parse(*argv)) == 0
    assert {k: seen[k] for k in expected} == expected


def test_peering_and_standalone_exclude_each_other() -> None:
    with pytest.raises(SystemExit):
        parse("-n", "a", "--peering", "x", "--standalone")
