"""s3://: the served files directly under a bucket prefix, from S3 or any S3-compatible server.

Requests are signed with SigV4 (sigv4.py) when the credentials Secret has AWS_ACCESS_KEY_ID and
AWS_SECRET_ACCESS_KEY, anonymous otherwise. spec.model.endpoint names an S3-compatible server
(path-style addressing, `http://host:port`); without one, AWS in AWS_REGION (default us-east-1),
virtual-hosted style. Only objects directly under the prefix are read (ListObjectsV2 with
delimiter '/'): a model directory's subfolders are not part of what the engine loads.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from kvpilot.checkpoint_digest import is_served_file
from kvpilot.storage import sigv4
from kvpilot.storage.credentials import Credentials
from kvpilot.storage.fetch import TIMEOUT, FetchError, FetchStats, http_error, retrying, safe_path, stream_to
from kvpilot.storage.uri import S3Ref

_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
HINTS = {403: "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY in the credentials Secret and the bucket policy",
         404: "check the bucket, the prefix and spec.model.endpoint",
         301: "the bucket is in another region: set AWS_REGION in the credentials Secret"}


class S3Fetcher:
    """The objects under one prefix of one bucket."""

    def __init__(self, ref: S3Ref, credentials: Credentials, endpoint: str | None = None) -> None:
        self.ref = ref
        self.credentials = credentials
        self.region = credentials.get("AWS_REGION") or "us-east-1"
        if endpoint:
            parts = urlsplit(endpoint.rstrip("/"))
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise FetchError(f"spec.model.endpoint {endpoint!r} is not an http(s)://host[:port] URL")
            self.origin, self.host, self.root = f"{parts.scheme}://{parts.netloc}", parts.netloc, f"/{ref.bucket}"
        else:
            self.host = f"{ref.bucket}.s3.{self.region}.amazonaws.com"
            self.origin, self.root = f"https://{self.host}", ""
        self.client = httpx.Client(timeout=TIMEOUT)

    @property
    def name(self) -> str:
        return f"s3://{self.ref.bucket}/{self.ref.prefix}"

    def fetch(self, dest: Path) -> FetchStats:
        stats = FetchStats()
        keys = self._list()
        if not keys:
            raise FetchError(f"{self.name}: no served files (*.safetensors, *.json, ...) under the prefix")
        for key in keys:
            name = key[len(self.ref.prefix):]
            response = self._get(key, stream=True)
            stats.add(stream_to(response, safe_path(dest, name, f"{self.name}: key"), f"{self.name}{name}"))
        return stats

    def read_config(self) -> bytes:
        return self._get(f"{self.ref.prefix}config.json").read()

    def _list(self) -> list[str]:
        keys: list[str] = []
        params = {"list-type": "2", "prefix": self.ref.prefix, "delimiter": "/"}
        while True:
            response = self._request(self.root + "/", params)
            root = ET.fromstring(response.read())
            for item in root.iter(f"{_NS}Contents"):
                key = item.findtext(f"{_NS}Key") or ""
                if is_served_file(key[len(self.ref.prefix):]):
                    keys.append(key)
            token = root.findtext(f"{_NS}NextContinuationToken")
            if root.findtext(f"{_NS}IsTruncated") != "true" or not token:
                return keys
            params = {**params, "continuation-token": token}

    def _get(self, key: str, stream: bool = False) -> httpx.Response:
        return self._request(f"{self.root}/{sigv4.encode(key, safe='-_.~/')}", {}, stream=stream)

    def _request(self, path: str, params: dict[str, str], stream: bool = False) -> httpx.Response:
        what = f"{self.name}: GET {path}"

        def send() -> httpx.Response:
            headers = self._sign(path, params)
            query = sigv4.canonical_query(params)
            url = f"{self.origin}{path}{'?' + query if query else ''}"
            return self.client.send(self.client.build_request("GET", url, headers=headers), stream=stream)

        response = retrying(what, send)
        if response.status_code != 200:
            raise http_error(what, response, HINTS.get(response.status_code, ""))
        return response

    def _sign(self, path: str, params: dict[str, str]) -> dict[str, str]:
        access, secret = self.credentials.get("AWS_ACCESS_KEY_ID"), self.credentials.get("AWS_SECRET_ACCESS_KEY")
        if not access or not secret:
            return {}
        return sigv4.sign("GET", self.host, path, params, {}, access_key=access, secret_key=secret,
                          region=self.region, session_token=self.credentials.get("AWS_SESSION_TOKEN"))
