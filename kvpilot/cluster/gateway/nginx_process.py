"""One nginx master process serving the rendered configuration; reloads are graceful."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from kvpilot.cluster import processes

NGINX = os.environ.get("KVPILOT_NGINX", "/usr/sbin/nginx")
RELOAD_TIMEOUT_S = 10.0
log = logging.getLogger("kvpilot.gateway")


def children(pid: int) -> set[int]:
    """The live child processes of `pid` (from /proc/*/stat: the parent is the field after the state)."""
    out: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 1 and fields[1] == str(pid) and fields[0] not in ("Z", "X"):
            out.add(int(entry.name))
    return out


def accepting(worker: int) -> bool:
    """True while an nginx worker still takes new connections: it is alive and has not yet retitled
    itself "worker process is shutting down" (which it does right before it closes its listening
    sockets on the master's QUIT)."""
    return processes.is_alive(worker) and "shutting down" not in processes.cmdline(worker)


def nginx_missing() -> str | None:
    """Why nginx cannot run here, or None."""
    if shutil.which(NGINX) is None:
        return f"{NGINX} not found: install Debian's nginx-light (`apt-get install -y nginx-light`)"
    return None


class NginxProcess:
    """`nginx -p <prefix> -c <prefix>/nginx.conf -g 'daemon off;'`, a child of the controller."""

    def __init__(self, prefix: Path) -> None:
        self.prefix = prefix
        self.conf = prefix / "nginx.conf"
        self.proc: subprocess.Popen[bytes] | None = None
        self.reloads = 0

    def _args(self) -> list[str]:
        return [NGINX, "-p", str(self.prefix), "-c", str(self.conf)]

    def check(self, text: str) -> str | None:
        """`nginx -t` on `text` (in a scratch file); the error output, or None when valid."""
        self._dirs()
        scratch = self.prefix / "nginx.conf.check"
        scratch.write_text(text)
        result = subprocess.run([NGINX, "-t", "-q", "-p", str(self.prefix), "-c", str(scratch)],
                                capture_output=True, text=True, timeout=30)
        return None if result.returncode == 0 else (result.stderr or result.stdout).strip()

    def apply(self, text: str) -> None:
        """Write the configuration; start nginx on the first call, reload it gracefully later
        (SIGHUP, what `nginx -s reload` sends: new workers take new connections, old ones finish
        theirs). A reload returns once the old workers stopped accepting, so whatever the caller
        does next (the route status it writes) is true of every new connection; without the wait a
        client saw the new configuration answer and the next connection answered by an old worker
        (the CI failure of test_unsupported_route_features_are_reported_in_status: 500 then 404)."""
        self._dirs()
        tmp = self.conf.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(self.conf)
        if self.proc is None or self.proc.poll() is not None:
            self.proc = processes.spawn([*self._args(), "-g", "daemon off;"], self.prefix / "nginx.out",
                                        die_with_parent=True)
            processes.wait_until(lambda: (self.prefix / "nginx.pid").exists(), "nginx", 30, self.proc.pid,
                                 self.prefix / "error.log")
        else:
            self._reload()

    def _reload(self) -> None:
        assert self.proc is not None
        old = children(self.proc.pid)
        self.proc.send_signal(signal.SIGHUP)
        self.reloads += 1
        deadline = time.monotonic() + RELOAD_TIMEOUT_S
        while time.monotonic() < deadline:
            workers = children(self.proc.pid)
            if not any(accepting(w) for w in old) and any(accepting(w) for w in workers - old):
                return
            time.sleep(0.005)
        # nginx refused the new configuration at run time (a port it cannot bind): the old workers
        # go on serving the previous one; its error log says why.
        log.error("nginx reload %d did not take effect within %.0f s (old workers still accepting); "
                  "see %s", self.reloads, RELOAD_TIMEOUT_S, self.prefix / "error.log")

    def reopen_logs(self) -> None:
        """SIGUSR1: nginx reopens its log files (after the caller renamed one)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)

    def _dirs(self) -> None:
        for sub in ("tmp/body", "tmp/proxy"):
            (self.prefix / sub).mkdir(parents=True, exist_ok=True)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def stop(self) -> None:
        if self.proc is not None:
            processes.terminate(self.proc.pid, grace_s=10)
            self.proc = None
