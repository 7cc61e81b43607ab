"""URI -> the fetcher that reads it."""

from __future__ import annotations

from kvpilot.storage.credentials import Credentials
from kvpilot.storage.fetch import Fetcher
from kvpilot.storage.uri import HfRef, OciRef, S3Ref, parse


def fetcher_for(uri: str, credentials: Credentials | None = None, endpoint: str | None = None) -> Fetcher:
    """The fetcher of an oci://, s3:// or hf:// URI (BadModelUri for anything else)."""
    ref = parse(uri)
    creds = credentials or Credentials()
    if isinstance(ref, OciRef):
        from kvpilot.storage.oci import OciFetcher

        return OciFetcher(ref, creds)
    if isinstance(ref, S3Ref):
        from kvpilot.storage.s3 import S3Fetcher

        return S3Fetcher(ref, creds, endpoint)
    assert isinstance(ref, HfRef)
    from kvpilot.storage.hf import HfFetcher

    return HfFetcher(ref, creds, endpoint)
