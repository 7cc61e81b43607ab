"""Service-tier fixtures: a real `kvpilot serve` (uvicorn) subprocess on loopback with a tiny CPU model."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

READY_TIMEOUT_SECONDS = 180.0
SERVED_MODEL = "tiny-llama"
STRATEGY = "native-fp32"  # the tiny checkpoint is float32; the server derives this name itself

# The shared server: room for 64 concurrent streams (16 running + 48 queued + spare), a small
# CPU pool sized by the capacity planner from a 16 MiB budget.
DEFAULT_FLAGS = (
    "--max-model-len", "256", "--max-num-seqs", "16", "--max-queue", "128",
    "--cpu-memory-budget", "16MiB", "--max-num-batched-tokens", "512",
)  # fmt: skip


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """One `kvpilot serve` subprocess: its URLs, its log, its stats feed, and a clean stop."""

    def __init__(self, model_dir: Path, log_path: Path, flags: tuple[str, ...], nofile: int | None = None) -> None:
        self.port, self.stats_port = free_port(), free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.stats_url = f"http://127.0.0.1:{self.stats_port}/stats"
        self.log_path = log_path
        cmd = [
            sys.executable, "-m", "kvpilot.cli", "serve", "--model", str(model_dir),
            "--served-model-name", SERVED_MODEL, "--port", str(self.port),
            "--stats-port", str(self.stats_port), "--log-level", "warning", *flags,
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     preexec_fn=None if nofile is None else lambda: _limit_open_files(nofile))  # fmt: skip

    def log_tail(self, n: int = 60) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        return ""

    def wait_healthy(self, timeout: float = READY_TIMEOUT_SECONDS) -> None:
        self._wait("/health", timeout)

    def wait_ready(self, timeout: float = READY_TIMEOUT_SECONDS) -> None:
        self._wait("/ready", timeout)

    def _wait(self, path: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvpilot serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.base_url + path, timeout=2).status_code == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"kvpilot serve: {path} not 200 within {timeout} s:\n{self.log_tail()}")

    def stats(self) -> dict[str, Any]:
        response = httpx.get(self.stats_url, timeout=10)
        response.raise_for_status()
        return response.json()

    def wait_stats(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 10.0
    ) -> dict[str, Any]:
        """Poll the stats feed until `predicate` holds; returns that snapshot (or fails with the last)."""
        deadline = time.monotonic() + timeout
        snapshot = self.stats()
        while not predicate(snapshot):
            if time.monotonic() > deadline:
                raise AssertionError(f"stats feed never satisfied the condition; last: {snapshot}")
            time.sleep(0.05)
            snapshot = self.stats()
        return snapshot

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait: the exit code (the server drains or aborts, then exits 0)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return int(self.proc.returncode)


def _limit_open_files(soft: int) -> None:
    """In the child before exec: at most `soft` open files (as `ulimit -n` or a container's limit)."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


def make_tiny_model(out: Path, *flags: str) -> Path:
    """A random tiny Llama checkpoint written by `kvpilot make-model` (`flags` go to it)."""
    result = subprocess.run(
        [sys.executable, "-m", "kvpilot.cli", "make-model", str(out), "--family", "llama", "--size", "tiny", *flags],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"kvpilot make-model failed:\n{result.stdout}\n{result.stderr}"
    return out


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny Llama checkpoint (2 KV heads)."""
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_mha_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama with 4 KV heads, so that GQA can pool them (the probe-gate tests)."""
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-mha", "--kv-heads", "4")


@pytest.fixture(scope="session")
def start_server(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., ServerProcess]]:
    """Factory: start a `kvpilot serve` with extra flags; every server started is stopped at the end."""
    started: list[ServerProcess] = []
    logs = tmp_path_factory.mktemp("server-logs")

    def start(*flags: str, wait: str = "ready", nofile: int | None = None) -> ServerProcess:
        server = ServerProcess(tiny_model, logs / f"serve-{len(started)}.log", flags, nofile)
        started.append(server)
        if wait == "ready":
            server.wait_ready()
        elif wait == "health":
            server.wait_healthy()
        return server

    yield start
    for server in started:
        server.terminate()


@pytest.fixture(scope="session")
def server(start_server: Callable[..., ServerProcess]) -> ServerProcess:
    """The shared server most service tests talk to."""
    return start_server(*DEFAULT_FLAGS)
