"""`kvpilot storage-init URI --dest DIR`: the engine pod's init container (fetch, verify, cache).

Exit 0 leaves DIR complete (fetched now, or found in the node cache: then nothing is
downloaded); exit 1 leaves nothing in DIR and prints why as the last line, which the pod's
status carries (terminationMessagePolicy FallbackToLogsOnError) to the operator and the user.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvpilot.checkpoint_digest import parse_digest
from kvpilot.planner import human_bytes


def _digest(value: str) -> str:
    try:
        return parse_digest(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("uri", help="oci://registry/repo:tag, s3://bucket/prefix or hf://owner/repo[@revision]")
    parser.add_argument("--dest", type=Path, required=True, help="the model directory to leave complete")
    parser.add_argument("--sha256", type=_digest, default=None,
                        help="lineage digest (`kvpilot digest DIR`) the fetched files must match")
    parser.add_argument("--endpoint", default=None,
                        help="S3-compatible server (http(s)://host:port) or Hugging Face endpoint (a mirror)")
    parser.add_argument("--credentials", type=Path, default=None,
                        help="directory of the mounted credentials Secret (one file per key)")


def run(args: argparse.Namespace) -> int:
    from kvpilot.storage.cache import DigestRefused, ensure
    from kvpilot.storage.credentials import BadCredentials, Credentials
    from kvpilot.storage.fetch import FetchError
    from kvpilot.storage.sources import fetcher_for
    from kvpilot.storage.uri import BadModelUri

    try:
        fetcher = fetcher_for(args.uri, Credentials.from_dir(args.credentials), args.endpoint)
        outcome = ensure(args.dest, args.uri, args.sha256, fetcher.fetch)
    except (BadModelUri, BadCredentials, FetchError, DigestRefused, PermissionError, FileNotFoundError) as exc:
        print(f"kvpilot storage-init: {exc}", file=sys.stderr, flush=True)
        return 1
    if outcome.hit:
        print(f"kvpilot storage-init: {args.uri} found in the node cache at {outcome.path} "
              f"(digest {outcome.digest}): nothing downloaded", flush=True)
    else:
        print(f"kvpilot storage-init: fetched {args.uri} to {outcome.path}: {outcome.stats.files} file(s), "
              f"{human_bytes(outcome.stats.bytes)} in {outcome.seconds:.1f} s, digest {outcome.digest}"
              f"{' (verified)' if args.sha256 else ' (not pinned: set spec.model.sha256)'}", flush=True)
    return 0
