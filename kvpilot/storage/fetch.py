"""What every fetcher shares: the result, the errors, safe paths and streamed, verified downloads."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Protocol

import httpx

CHUNK = 1 << 20
RETRIES = 3  # transient failures (connection reset, 5xx) per request before the fetch fails
TIMEOUT = httpx.Timeout(30.0, read=300.0)


class FetchError(RuntimeError):
    """The source could not be read: not found, refused, unreachable, or not a model."""


@dataclass
class FetchStats:
    """What one fetch wrote: files and bytes that came over the network."""

    files: int = 0
    bytes: int = 0

    def add(self, size: int) -> None:
        self.files += 1
        self.bytes += size


class Fetcher(Protocol):
    """One model source."""

    def fetch(self, dest: Path) -> FetchStats:
        """Write the checkpoint's served files into the empty directory `dest`."""
        ...

    def read_config(self) -> bytes:
        """config.json only (the operator's preflight), without the weights."""
        ...


def safe_path(root: Path, name: str, what: str) -> Path:
    """`root/name` for a relative name without '..' (a source never writes outside its directory)."""
    rel = PurePosixPath(name)
    if not name or rel.is_absolute() or ".." in rel.parts or name.startswith("./"):
        raise FetchError(f"{what} {name!r} is not a relative path inside the model directory")
    return root.joinpath(*rel.parts)


def retrying(what: str, call: Callable[[], httpx.Response]) -> httpx.Response:
    """`call()` again after connection errors and 5xx answers (with backoff); other answers as they are."""
    for attempt in range(RETRIES):
        try:
            response = call()
        except httpx.TransportError as exc:
            if attempt == RETRIES - 1:
                raise FetchError(f"{what}: {type(exc).__name__}: {exc}") from None
        else:
            if response.status_code < 500 or attempt == RETRIES - 1:
                return response
            response.close()
        time.sleep(0.5 * 2**attempt)
    raise AssertionError("unreachable")


def stream_to(response: httpx.Response, path: Path, what: str, sha256: str | None = None) -> int:
    """Write a streamed 200 answer to `path`; the bytes' sha256 must be `sha256` when given."""
    digest = hashlib.sha256()
    size = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(path, "wb") as out:
            for chunk in response.iter_bytes(CHUNK):
                out.write(chunk)
                digest.update(chunk)
                size += len(chunk)
    except httpx.TransportError as exc:
        raise FetchError(f"{what}: the transfer broke after {size} bytes: {exc}") from None
    finally:
        response.close()
    if sha256 is not None and digest.hexdigest() != sha256:
        raise FetchError(f"{what}: the content's sha256 is {digest.hexdigest()}, the source names {sha256}: "
                         "the transfer or the source is corrupt")
    return size


def http_error(what: str, response: httpx.Response, hint: str = "") -> FetchError:
    body = response.read().decode(errors="replace").strip().replace("\n", " ")[:300]
    return FetchError(f"{what}: HTTP {response.status_code}{': ' + body if body else ''}{'; ' + hint if hint else ''}")
