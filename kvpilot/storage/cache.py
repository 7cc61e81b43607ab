"""The node-local model cache: one directory per lineage digest, complete or absent.

A fetch writes into a hidden partial directory beside the target, verifies the digest there and
renames it into place, so a reader never sees half a checkpoint. An exclusive lock per key lets
the second replica on a node wait for the first one's fetch instead of downloading again; a
marker file inside the directory records what was fetched and makes the next pod's start a hit.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kvpilot.checkpoint_digest import checkpoint_digest, parse_digest
from kvpilot.storage.fetch import FetchStats

MARKER = ".kvpilot-fetched.json"


class DigestRefused(RuntimeError):
    """The fetched files do not digest to the lineage SHA256: nothing was put in place."""


def cache_key(sha256: str) -> str:
    """The directory name of a pinned checkpoint in the cache."""
    return f"sha256-{parse_digest(sha256)}"


@dataclass(frozen=True)
class Outcome:
    """What `ensure` did: a cache hit downloads nothing."""

    path: Path
    hit: bool
    stats: FetchStats
    digest: str
    seconds: float


def _marker(dest: Path) -> dict | None:
    try:
        return json.loads((dest / MARKER).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _complete(dest: Path, uri: str, sha256: str | None) -> dict | None:
    marker = _marker(dest)
    if marker is None:
        return None
    if sha256 is not None:
        return marker if marker.get("digest") == sha256 else None
    return marker if marker.get("uri") == uri else None


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the process dies, so a killed pod never wedges a key
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure(dest: Path, uri: str, sha256: str | None, fetch: Callable[[Path], FetchStats]) -> Outcome:
    """`dest` holds the checkpoint `uri` names (digest `sha256` when given), fetched at most once per node."""
    started = time.monotonic()
    want = parse_digest(sha256) if sha256 else None
    parent = dest.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        lock = parent / f".{dest.name}.lock"
        lock.touch(exist_ok=True)
    except OSError as exc:
        raise PermissionError(f"cannot write the model cache {parent} ({exc.strerror}): the volume must be writable "
                              f"by the pod's user (uid {os.getuid()}); see docs/operator.md, model cache") from None
    if marker := _complete(dest, uri, want):
        return Outcome(dest, True, FetchStats(), marker["digest"], time.monotonic() - started)
    with _locked(lock):
        if marker := _complete(dest, uri, want):  # another pod fetched it while this one waited
            return Outcome(dest, True, FetchStats(), marker["digest"], time.monotonic() - started)
        for leftover in parent.glob(f".{dest.name}.partial-*"):  # a fetch killed mid-way; nobody else holds the lock
            shutil.rmtree(leftover, ignore_errors=True)
        partial = parent / f".{dest.name}.partial-{os.getpid()}"
        partial.mkdir()
        try:
            stats = fetch(partial)
            got = checkpoint_digest(partial)
            if want is not None and got != want:
                raise DigestRefused(
                    f"{uri} does not match spec.model.sha256: expected {want}, the fetched files (weights, config, "
                    f"tokenizer, chat template) digest to {got}; nothing was cached and the engine does not start. "
                    "The source changed or the digest is wrong: check it with `kvpilot digest DIR` on the checkpoint "
                    "you trust")
            (partial / MARKER).write_text(json.dumps({"uri": uri, "digest": got, "files": stats.files,
                                                     "bytes": stats.bytes, "fetchedAt": time.time()}))
            if dest.exists():  # an incomplete directory of an older layout, or a pinned key that changed content
                shutil.rmtree(dest)
            partial.rename(dest)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return Outcome(dest, False, stats, got, time.monotonic() - started)
