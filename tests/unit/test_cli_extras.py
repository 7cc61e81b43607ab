"""A command whose extra is not installed says which one to install (the operator image has no torch)."""

from __future__ import annotations

import importlib

import pytest

from kvpilot import cli

pytestmark = pytest.mark.unit


def _without(module: str, missing: str):  # type: ignore[no-untyped-def]
    real = importlib.import_module

    def fake(name: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        if name == module:
            raise ModuleNotFoundError(f"No module named {missing!r}", name=missing)
        return real(name, *args, **kwargs)

    return fake


def test_missing_engine_dependency_names_the_engine_extra(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(cli.importlib, "import_module", _without("kvpilot.engine.server.cli", "torch"))
    assert cli.main(["serve", "--help"]) == 2
    err = capsys.readouterr().err
    assert "'serve' command needs the 'engine' extra" in err and "pip install 'kvpilot[engine]'" in err
    assert "'torch'" in err


def test_missing_kvpilot_module_is_not_blamed_on_an_extra(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(cli.importlib, "import_module", _without("kvpilot.operator.cli", "kvpilot.operator.gone"))
    with pytest.raises(ModuleNotFoundError):
        cli.main(["operator", "--help"])


def test_every_extra_named_by_the_cli_exists_in_pyproject() -> None:
    import tomllib
    from pathlib import Path

    extras = tomllib.loads((Path(cli.__file__).parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert set(cli.EXTRAS.values()) <= set(extras)
    assert "torch" not in " ".join(extras["operator"]) and "kvpilot[all]" in extras["test"]
