"""One nginx master process serving the rendered configuration; reloads are graceful."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

from kvpilot.cluster import processes

NGINX = os.environ.get("KVPILOT_NGINX", "/usr/sbin/nginx")


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
        theirs)."""
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
            self.proc.send_signal(signal.SIGHUP)
            self.reloads += 1

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
