"""Issue 33 item 10: the sidecar does not trust its feed. A feed that trickles in, nests 200k deep,
is huge or is shaped wrongly is 'engine not readable' (engine_up 0, no engine families) within the
scrape timeout, never a hung scrape or a 500."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from kvpilot.sidecar.engine_collector import EngineCollector
from kvpilot.sidecar.sources import MAX_PAGE_BYTES, KvpilotFeedSource
from tests.harness.stats_feed import make_feed

pytestmark = pytest.mark.unit

SCRAPE_TIMEOUT = 1.0


def _bodies() -> dict[str, bytes]:
    good = make_feed()
    deep = json.dumps(good)[:-1] + ', "x": ' + "[" * 200_000 + "]" * 200_000 + "}"
    wrong = {**good, "gqa_head_utilization": [1, 2]}  # items that are not objects
    return {
        "/good": json.dumps(good).encode(),
        "/deep": deep.encode(),
        "/huge": json.dumps({**good, "padding": "x" * (MAX_PAGE_BYTES + 1)}).encode(),
        "/wrong": json.dumps(wrong).encode(),
    }


class _Feed(BaseHTTPRequestHandler):
    bodies: ClassVar[dict[str, bytes]] = {}

    def do_GET(self) -> None:
        if self.path == "/slow":  # 40 bytes, one every 0.5 s: 20 s in all
            self.send_response(200)
            self.send_header("Content-Length", "40")
            self.end_headers()
            for _ in range(40):
                try:
                    self.wfile.write(b" ")
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(0.5)
            return
        body = self.bodies[self.path]
        self.send_response(200)
        if self.path != "/huge":  # the huge one states no length: it is counted as it arrives
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def feed_url() -> Iterator[str]:
    _Feed.bodies = _bodies()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Feed)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _scrape(url: str) -> tuple[dict[str, float], set[str], float]:
    collector = EngineCollector(KvpilotFeedSource(url), timeout_s=SCRAPE_TIMEOUT)
    started = time.monotonic()
    families = list(collector.collect())
    elapsed = time.monotonic() - started
    health = {f.name: f.samples[0].value for f in families if f.samples and not f.samples[0].labels}
    return health, {f.name for f in families}, elapsed


def test_a_good_feed_is_up(feed_url: str) -> None:
    health, names, _ = _scrape(feed_url + "/good")
    assert health["kvpilot_engine_up"] == 1.0 and "kvpilot_kv_cache_efficiency" in names


@pytest.mark.parametrize("path", ["/slow", "/deep", "/huge", "/wrong"])
def test_an_untrustworthy_feed_is_engine_down_within_the_scrape_timeout(feed_url: str, path: str) -> None:
    health, names, elapsed = _scrape(feed_url + path)
    assert health["kvpilot_engine_up"] == 0.0
    assert "kvpilot_kv_cache_efficiency" not in names  # no engine family served from it
    assert elapsed < 3 * SCRAPE_TIMEOUT, elapsed  # the slow one held a scrape 20 s (40 s in the probe)
