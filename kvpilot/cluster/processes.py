"""Start, probe and stop the control plane's processes; each is tracked by PID alone so a later
`kvpilot cluster down` (another Python process) can stop what `up` started."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path


def free_ports(count: int) -> list[int]:
    """`count` distinct free TCP ports on 127.0.0.1 (held open together so none repeats)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the parent dies (Linux prctl PR_SET_PDEATHSIG)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM, 0, 0, 0)


def spawn(argv: list[str], log_path: Path, die_with_parent: bool = False) -> subprocess.Popen[bytes]:
    """Start `argv` in its own session, logging to a file. It outlives us (`kvpilot cluster up`)
    unless `die_with_parent` (test sessions: a killed pytest leaves no control plane behind)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_die_with_parent if die_with_parent else None,
        )


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def is_alive(pid: int, binary: str | None = None) -> bool:
    """True while `pid` runs (and, when given, still runs `binary`: PIDs get reused)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    if state in ("Z", "X"):
        return False
    return binary is None or cmdline(pid).startswith(binary)


def terminate(pid: int, binary: str | None = None, grace_s: float = 10.0) -> None:
    """SIGTERM, wait up to `grace_s`, then SIGKILL; a PID now running something else is left alone."""
    if not is_alive(pid, binary):
        _reap(pid)
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap(pid)
        if not is_alive(pid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    for _ in range(50):
        _reap(pid)
        if not is_alive(pid):
            return
        time.sleep(0.1)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def http_ok(url: str, context: ssl.SSLContext | None = None, expect: str | None = None) -> bool:
    """GET `url`: True on 200 (whose body contains `expect`, when given)."""
    try:
        with urllib.request.urlopen(url, timeout=3, context=context) as response:
            body = response.read().decode(errors="replace")
            return response.status == 200 and (expect is None or expect in body)
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False


def wait_until(check: Callable[[], bool], what: str, timeout_s: float, pid: int | None = None,
               log_path: Path | None = None) -> None:
    """Poll `check` until it passes; fail early if `pid` died, quoting the end of its log."""
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while time.monotonic() < deadline:
        if check():
            return
        if pid is not None and not is_alive(pid):
            raise RuntimeError(f"{what}: the process exited during start-up{_log_tail(log_path)}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)
    raise TimeoutError(f"{what} was not ready after {timeout_s:.0f} s{_log_tail(log_path)}")


def _log_tail(log_path: Path | None, lines: int = 20) -> str:
    if log_path is None or not log_path.exists():
        return ""
    tail = log_path.read_text(errors="replace").splitlines()[-lines:]
    return f"; last lines of {log_path}:\n" + "\n".join(tail)


def unverified_tls() -> ssl.SSLContext:
    """For /healthz of components that serve a self-signed certificate on loopback."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def client_tls(ca: Path, cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(str(cert), str(key))
    return context


__all__ = ["client_tls", "cmdline", "free_ports", "http_ok", "is_alive", "spawn", "terminate", "unverified_tls",
           "wait_until"]
