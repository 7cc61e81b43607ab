"""Where engine readings come from: the kvpilot feed (JSON) or another engine's /metrics page."""

from __future__ import annotations

import json
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

import httpx

from kvpilot.engine.metrics import stats_contract as contract
from kvpilot.sidecar.adapters import ADAPTERS, Adapter, AdapterError, read_page
from kvpilot.sidecar.feed import FeedError, feed_readings
from kvpilot.sidecar.readings import Readings

ENGINE_KINDS = ("kvpilot", *ADAPTERS)


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


def _get(client: httpx.Client, url: str) -> httpx.Response:
    try:
        response = client.get(url)
    except httpx.HTTPError as exc:
        raise SourceError(f"GET {url} failed: {type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        raise SourceError(f"GET {url} answered HTTP {response.status_code}")
    return response


class KvpilotFeedSource:
    """kvpilot's own engine: the JSON stats feed on 127.0.0.1:8001/stats."""

    def __init__(self, engine_url: str) -> None:
        self.url = with_default_path(engine_url, contract.STATS_PATH)

    def read(self, client: httpx.Client) -> tuple[str | None, Readings]:
        response = _get(client, self.url)
        try:
            feed = json.loads(response.content)
            readings = feed_readings(feed)
        except (json.JSONDecodeError, UnicodeDecodeError, FeedError) as exc:
            raise SourceError(f"{self.url}: {exc}") from exc
        return str(feed["engine"]["instance_id"]), readings


class PrometheusPageSource:
    """vLLM or SGLang: their /metrics page, mapped through the adapter's table."""

    def __init__(self, engine_url: str, adapter: Adapter) -> None:
        self.url = with_default_path(engine_url, "/metrics")
        self.adapter = adapter

    def read(self, client: httpx.Client) -> tuple[str | None, Readings]:
        response = _get(client, self.url)
        try:
            return read_page(self.adapter, response.text)
        except AdapterError as exc:
            raise SourceError(f"{self.url}: {exc}") from exc


def make_source(engine_url: str, engine_kind: str) -> EngineSource:
    if engine_kind == "kvpilot":
        return KvpilotFeedSource(engine_url)
    if engine_kind in ADAPTERS:
        return PrometheusPageSource(engine_url, ADAPTERS[engine_kind])
    raise ValueError(f"unknown engine kind {engine_kind!r}; choose one of {', '.join(ENGINE_KINDS)}")
