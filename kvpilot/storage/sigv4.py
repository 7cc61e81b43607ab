"""AWS Signature Version 4 for S3 GET requests (the header form, unsigned empty payload of a GET)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from datetime import UTC, datetime
from urllib.parse import quote

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
ALGORITHM = "AWS4-HMAC-SHA256"


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def encode(text: str, safe: str = "-_.~") -> str:
    """RFC 3986 percent-encoding as SigV4 wants it (spaces as %20, '~' left alone)."""
    return quote(text, safe=safe)


def canonical_query(params: Mapping[str, str]) -> str:
    return "&".join(f"{encode(k)}={encode(v)}" for k, v in sorted(params.items()))


def sign(method: str, host: str, path: str, params: Mapping[str, str], headers: Mapping[str, str], *,
         access_key: str, secret_key: str, region: str, session_token: str | None = None,
         service: str = "s3", payload_sha256: str = EMPTY_SHA256, now: datetime | None = None) -> dict[str, str]:
    """The headers to send: `headers` plus host, x-amz-date, x-amz-content-sha256, Authorization.

    `path` is the already-encoded canonical URI (S3 encodes each key segment once, keeps '/').
    """
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    out = {**headers, "host": host, "x-amz-date": stamp, "x-amz-content-sha256": payload_sha256}
    if session_token:
        out["x-amz-security-token"] = session_token
    lower = {k.lower(): " ".join(str(v).split()) for k, v in out.items()}
    signed = ";".join(sorted(lower))
    canonical = "\n".join([method, path, canonical_query(params),
                           "".join(f"{k}:{lower[k]}\n" for k in sorted(lower)), signed, payload_sha256])
    scope = f"{stamp[:8]}/{region}/{service}/aws4_request"
    to_sign = "\n".join([ALGORITHM, stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(f"AWS4{secret_key}".encode(), stamp[:8])
    for part in (region, service, "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    out["Authorization"] = f"{ALGORITHM} Credential={access_key}/{scope}, SignedHeaders={signed}, Signature={signature}"
    return out
