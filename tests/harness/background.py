"""A locally built tool run in the background for a test: skipped when not built, started with its
output in a log, waited for until it is ready, stopped by PID."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from kvpilot.cluster.build import binary_path

T = TypeVar("T")


def built_binary(name: str) -> Path:
    """The cached binary `kvpilot cluster build` made, or skip the test saying how to build it."""
    path = binary_path(name)
    if not path.exists():
        pytest.skip(f"{name} is not built ({path}): run `kvpilot cluster build {name}`")
    return path


class Background:
    """One process, its stdout and stderr in `log`."""

    def __init__(self, argv: list[str], log: Path, name: str) -> None:
        self.argv, self.log, self.name = argv, log, name
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready: Callable[[], T | None], timeout_s: float = 30.0) -> T:
        """Start it and poll `ready` until it returns something other than None (what it returns)."""
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            result = ready()
            if result is not None:
                return result
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}): {self.log.read_text()}")
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"{self.name} was not ready in {timeout_s:.0f} s: {self.log.read_text()}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
