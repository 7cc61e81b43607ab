"""Where engine readings come from: the kvpilot feed (JSON) or another engine's /metrics page."""

from __future__ import annotations

import json
import time
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

import httpx

from kvpilot.engine.metrics import stats_contract as contract
from kvpilot.sidecar.adapters import ADAPTERS, Adapter, AdapterError, read_page
from kvpilot.sidecar.feed import FeedError, feed_readings
from kvpilot.sidecar.readings import Readings

ENGINE_KINDS = ("kvpilot", *ADAPTERS)
MAX_PAGE_BYTES = 16 * 1024 * 1024  # a stats feed is kilobytes; a vLLM /metrics page rarely a megabyte
DEFAULT_DEADLINE_SECONDS = 2.0


class SourceError(RuntimeError):
    """The engine could not be read at this scrape."""


class EngineSource(Protocol):
    url: str

    def read(self, client: httpx.Client) -> tuple[str | None, Readings]:
        """(engine identity, readings); raises SourceError when the engine cannot be read."""
        ...


def with_default_path(url: str, path: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"engine URL must look like http://HOST:PORT, got {url!r}")
    if parts.path in ("", "/"):
        parts = parts._replace(path=path)
    return urlunsplit(parts)


def _get(client: httpx.Client, url: str) -> bytes:
    """The page's bytes, read within one total deadline (the client's read timeout, i.e. --scrape-timeout)
    and at most MAX_PAGE_BYTES: a feed that trickles in or never ends is 'not readable', not a hung scrape."""
    deadline_s = client.timeout.read or DEFAULT_DEADLINE_SECONDS
    started = time.monotonic()
    try:
        with client.stream("GET", url) as response:
            if response.status_code != 200:
                raise SourceError(f"GET {url} answered HTTP {response.status_code}")
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > MAX_PAGE_BYTES:
                raise SourceError(f"GET {url}: the page is {declared} bytes; at most {MAX_PAGE_BYTES} are read")
            chunks, size = [], 0
            for chunk in response.iter_bytes():  # decoded: a small gzip of a huge page counts as huge
                size += len(chunk)
                if size > MAX_PAGE_BYTES:
                    raise SourceError(f"GET {url}: the page exceeds {MAX_PAGE_BYTES} bytes; at most that is read")
                if time.monotonic() - started > deadline_s:
                    raise SourceError(f"GET {url}: the page did not arrive within {deadline_s:g} s (--scrape-timeout)")
                chunks.append(chunk)
    except httpx.HTTPError as exc:
        raise SourceError(f"GET {url} failed: {type(exc).__name__}: {exc}") from exc
    return b"".join(chunks)


class KvpilotFeedSource:
    """kvpilot's own engine: the JSON stats feed on 127.0.0.1:8001/stats."""

    def __init__(self, engine_url: str) -> None:
        self.url = with_default_path(engine_url, contract.STATS_PATH)

    def read(self, client: httpx.Client) -> tuple[str | None, Readings]:
        content = _get(client, self.url)
        try:
            feed = json.loads(content)
            readings = feed_readings(feed)
        except RecursionError as exc:
            raise SourceError(f"{self.url}: the feed nests deeper than the JSON parser goes") from exc
        except (ValueError, FeedError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise SourceError(f"{self.url}: {exc}") from exc
        return str(feed["engine"]["instance_id"]), readings


class PrometheusPageSource:
    """vLLM or SGLang: their /metrics page, mapped through the adapter's table."""

    def __init__(self, engine_url: str, adapter: Adapter) -> None:
        self.url = with_default_path(engine_url, "/metrics")
        self.adapter = adapter

    def read(self, client: httpx.Client) -> tuple[str | None, Readings]:
        content = _get(client, self.url)
        try:
            return read_page(self.adapter, content.decode("utf-8", errors="replace"))
        except AdapterError as exc:
            raise SourceError(f"{self.url}: {exc}") from exc


def make_source(engine_url: str, engine_kind: str) -> EngineSource:
    if engine_kind == "kvpilot":
        return KvpilotFeedSource(engine_url)
    if engine_kind in ADAPTERS:
        return PrometheusPageSource(engine_url, ADAPTERS[engine_kind])
    raise ValueError(f"unknown engine kind {engine_kind!r}; choose one of {', '.join(ENGINE_KINDS)}")
