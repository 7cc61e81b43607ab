"""`kvpilot serve --tensor-parallel-size 2` on CPU (gloo): it serves, and a rank killed while it serves
makes the server fail closed (exit 1 with the rank named), never hang."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.service.conftest import DEFAULT_FLAGS, SERVED_MODEL, ServerProcess

pytestmark = pytest.mark.service


def spawned_ranks(pid: int) -> list[int]:
    """Child processes started by torch.multiprocessing's spawn (not its resource tracker)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


def test_a_killed_rank_makes_the_server_exit_with_the_rank_named(
    start_server: Callable[..., ServerProcess],
) -> None:
    server = start_server(*DEFAULT_FLAGS, "--tensor-parallel-size", "2")
    body = {"model": SERVED_MODEL, "prompt": [5, 6, 7, 8], "max_tokens": 4, "temperature": 0}
    response = httpx.post(server.base_url + "/v1/completions", json=body, timeout=60)
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 4
    assert server.stats()["kv"]["blocks_total"] > 0
    (rank1,) = spawned_ranks(server.proc.pid)
    os.kill(rank1, signal.SIGKILL)
    try:
        code = server.proc.wait(60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server did not fail closed within 60 s of rank 1's death:\n{server.log_tail()}")
    log = server.log_tail(200)
    assert code == 1, log
    assert f"tensor-parallel rank 1 (pid {rank1}) exited with code -9" in log and "fails closed" in log, log
