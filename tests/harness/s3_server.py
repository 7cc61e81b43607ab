"""A real S3-compatible server on loopback: versitygw's posix backend (built from its published Go
module by `kvpilot cluster build`, tools/versitygw), with one root account.

    with S3Server(workdir) as s3:
        s3.put_dir("models", "tiny/", model_dir)     # a bucket, and the directory's files under a prefix
        s3.endpoint                                   # http://127.0.0.1:PORT (path-style)
        s3.access_key, s3.secret_key                  # the root account: SigV4 is checked on every request

Objects are uploaded through versitygw's own S3 API (PUT with a signed payload hash), so the server
stores them with its metadata, as any client's upload.
"""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path

import httpx

from kvpilot.storage import sigv4
from tests.harness.background import Background, built_binary

REGION = "us-east-1"


def versitygw_binary() -> Path:
    return built_binary("versitygw")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class S3Server:
    """versitygw on a free loopback port; stopped by PID."""

    access_key = "kvpilot-test-access"
    secret_key = "kvpilot-test-secret-0123456789"

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.root = workdir / "posix"
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "versitygw.log"
        self.process = Background(
            [str(versitygw_binary()), "--access", self.access_key, "--secret", self.secret_key,
             "--region", REGION, "--port", f"127.0.0.1:{self.port}", "posix", "--nometa", str(self.root)],
            self.log, "versitygw")

    def __enter__(self) -> S3Server:
        self.process.start(self._listening)
        return self

    def _listening(self) -> bool | None:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return None

    def stop(self) -> None:
        self.process.stop()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _put(self, path: str, data: bytes) -> None:
        host = f"127.0.0.1:{self.port}"
        headers = sigv4.sign("PUT", host, path, {}, {}, access_key=self.access_key, secret_key=self.secret_key,
                             region=REGION, payload_sha256=hashlib.sha256(data).hexdigest())
        response = httpx.put(f"{self.endpoint}{path}", content=data, headers=headers, timeout=60)
        assert response.status_code == 200, f"PUT {path}: {response.status_code} {response.text}"

    def make_bucket(self, bucket: str) -> None:
        self._put(f"/{bucket}", b"")

    def put_dir(self, bucket: str, prefix: str, directory: Path) -> str:
        """Every file of `directory` (not its subfolders) as `prefix<name>`; returns the s3:// URI."""
        self.make_bucket(bucket)
        for path in sorted(directory.iterdir()):
            if path.is_file():
                self._put(f"/{bucket}/{prefix}{path.name}", path.read_bytes())
        return f"s3://{bucket}/{prefix}"

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self._put(f"/{bucket}/{key}", data)
