"""A real Prometheus (Debian's `prometheus` package) on loopback, scraping the targets a test names.

    def test_x(prometheus):                                   # pytest fixture: a factory
        prom = prometheus({"sidecar": ["127.0.0.1:9400"]})    # job -> targets; scrape_interval 1s
        prom.wait_for("kvpilot_engine_up", lambda r: r and r[0].value == 1, timeout=20)
        prom.value("sum(kvpilot_requests_running)")           # float, or None when no series

    with PrometheusServer({"job": ["127.0.0.1:8000"]}, workdir) as prom: ...   # without pytest

Each server gets a free loopback port, a generated config, its own storage directory, and is
stopped by PID when the test ends. Tests are skipped with a message when the binary is missing
(`apt-get install prometheus`; `.ci/run` installs it).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

PROMETHEUS_BINARY = os.environ.get("KVPILOT_PROMETHEUS", "/usr/bin/prometheus")
PROMTOOL_BINARY = os.environ.get("KVPILOT_PROMTOOL", "/usr/bin/promtool")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def prometheus_missing() -> str | None:
    """Why a real Prometheus cannot run here, or None."""
    for binary in (PROMETHEUS_BINARY, PROMTOOL_BINARY):
        if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
            return f"{binary} not found: install Debian's package (`apt-get install -y prometheus`)"
    return None


@dataclass(frozen=True)
class Series:
    """One element of an instant-vector result."""

    labels: dict[str, str]
    timestamp: float
    value: float


@dataclass(frozen=True)
class LabelledTarget:
    """A scrape target with target labels (as a PodMonitor's relabelling would attach them)."""

    address: str
    labels: Mapping[str, str]


Targets = Sequence[str | LabelledTarget]


def static_configs(targets: Targets) -> list[dict[str, Any]]:
    """One static_config per distinct label set, in first-seen order; plain strings carry no labels."""
    groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for target in targets:
        if isinstance(target, LabelledTarget):
            groups.setdefault(tuple(sorted(target.labels.items())), []).append(target.address)
        else:
            groups.setdefault((), []).append(target)
    return [{"targets": addresses, **({"labels": dict(labels)} if labels else {})}
            for labels, addresses in groups.items()]


def scrape_config(jobs: Mapping[str, Targets], scrape_interval: str, metrics_path: str) -> str:
    """prometheus.yml for these jobs (YAML written by hand: it is flat and JSON is valid YAML)."""
    import json

    config = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval,
                   "scrape_timeout": scrape_interval},
        "scrape_configs": [
            {"job_name": job, "metrics_path": metrics_path, "static_configs": static_configs(targets)}
            for job, targets in jobs.items()
        ],
    }
    return json.dumps(config, indent=2) + "\n"


class PrometheusServer:
    """One Prometheus process: start(), query(), wait_for(), stop(); also a context manager."""

    def __init__(self, jobs: Mapping[str, Targets], workdir: Path | None = None,
                 scrape_interval: str = "1s", metrics_path: str = "/metrics") -> None:
        self.jobs = dict(jobs)
        self.scrape_interval = scrape_interval
        self.metrics_path = metrics_path
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="kvpilot-prom-"))
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._client = httpx.Client(timeout=10.0, trust_env=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "prometheus.log"

    def start(self, timeout: float = 60.0) -> PrometheusServer:
        missing = prometheus_missing()
        if missing:
            raise RuntimeError(missing)
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(scrape_config(self.jobs, self.scrape_interval, self.metrics_path))
        check = subprocess.run([PROMTOOL_BINARY, "check", "config", str(config)], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"generated Prometheus config is invalid:\n{check.stdout}{check.stderr}")
        self.port = free_port()
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [PROMETHEUS_BINARY, f"--config.file={config}", f"--storage.tsdb.path={self.workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if self._client.get(f"{self.url}/-/ready").status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"prometheus not ready on {self.url} within {timeout} s:\n{self.log_tail()}")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout=5)
        self._client.close()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def api(self, path: str, **params: Any) -> Any:
        response = self._client.get(f"{self.url}/api/v1/{path}", params=params)
        body = response.json()
        if response.status_code != 200 or body.get("status") != "success":
            raise RuntimeError(f"Prometheus API {path} {params} failed: HTTP {response.status_code} {body}")
        return body["data"]

    def query(self, promql: str, at: float | None = None) -> list[Series]:
        """An instant query; a scalar result comes back as one unlabelled series."""
        params: dict[str, Any] = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("query", **params)
        if data["resultType"] == "scalar":
            ts, value = data["result"]
            return [Series({}, float(ts), float(value))]
        if data["resultType"] != "vector":
            raise ValueError(f"{promql!r} is a {data['resultType']}; use query_range or samples()")
        return [Series(item["metric"], float(item["value"][0]), float(item["value"][1]))
                for item in data["result"]]

    def value(self, promql: str, at: float | None = None) -> float | None:
        """The single value of a query, or None when it has no series (more than one is an error)."""
        result = self.query(promql, at)
        if len(result) > 1:
            raise ValueError(f"{promql!r} returned {len(result)} series; aggregate it to one")
        return result[0].value if result else None

    def samples(self, selector: str, window: str, at: float | None = None) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        """Raw stored samples (timestamp, value) of `selector[window]` per series."""
        params: dict[str, Any] = {"query": f"{selector}[{window}]"}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("query", **params)
        return [(item["metric"], [(float(t), float(v)) for t, v in item["values"]]) for item in data["result"]]

    def wait_for(self, promql: str, predicate: Callable[[list[Series]], bool], timeout: float = 30.0,
                 interval: float = 0.25) -> list[Series]:
        """Poll `promql` until predicate(result) is true; TimeoutError shows the last result."""
        deadline = time.monotonic() + timeout
        result: list[Series] = []
        while True:
            result = self.query(promql)
            if predicate(result):
                return result
            if time.monotonic() > deadline:
                raise TimeoutError(f"{promql!r} did not satisfy the condition in {timeout} s; last result "
                                   f"{result}; targets: {self.target_health()}")
            time.sleep(interval)

    def target_health(self) -> list[tuple[str, str, str]]:
        """(scrape URL, health, last error) for each active target."""
        data = self.api("targets")
        return [(t["scrapeUrl"], t["health"], t.get("lastError", "")) for t in data["activeTargets"]]


def promtool_check_metrics(exposition: str) -> subprocess.CompletedProcess[str]:
    """`promtool check metrics` on an exposition text (exit 0: clean; 3: lint problems; 1: invalid)."""
    return subprocess.run([PROMTOOL_BINARY, "check", "metrics"], input=exposition, capture_output=True, text=True)


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[..., PrometheusServer]]:
    """Factory fixture: prometheus(jobs, scrape_interval="1s") -> a started server, stopped after the test."""
    missing = prometheus_missing()
    if missing:
        pytest.skip(missing)
    started: list[PrometheusServer] = []

    def start(jobs: Mapping[str, Targets], **kwargs: Any) -> PrometheusServer:
        server = PrometheusServer(jobs, tmp_path / f"prometheus-{len(started)}", **kwargs)
        started.append(server)
        return server.start()

    try:
        yield start
    finally:
        for server in started:
            server.stop()
