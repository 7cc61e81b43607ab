"""Real `kvpilot serve` + `kvpilot sidecar` pairs on loopback, labelled namespace/service/track.

    with Fleet(model_dir, workdir) as fleet:
        fleet.start([EngineSpec("demo", "chat", "stable"), EngineSpec("demo", "chat", "canary", ("--attention", "linear"))])
        prom = prometheus({"kvpilot-engines": fleet.targets()})     # tests/harness/prometheus.py
        send_load(fleet.engines[0].api_url, requests=8)

Each engine gets its own API, stats-feed and sidecar ports; all of them start at once (the model
loads in parallel) and are stopped by PID when the fleet closes, also when a test fails. The
sidecar's target carries the labels a PodMonitor would attach in a cluster (ROLLOUT-CONTRACT.md).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from kvpilot.cluster.processes import free_ports
from tests.harness.prometheus import LabelledTarget

KVPILOT = (sys.executable, "-m", "kvpilot.cli")
READY_TIMEOUT_S = 180.0
BIND_RETRIES = 2
SMALL_ENGINE = ("--max-model-len", "256", "--max-num-seqs", "8", "--num-kv-blocks", "128")


@dataclass(frozen=True)
class EngineSpec:
    """One pod's worth: where it belongs and the extra `kvpilot serve` flags of its strategy."""

    namespace: str
    service: str
    track: str
    flags: tuple[str, ...] = ()

    @property
    def labels(self) -> dict[str, str]:
        return {"namespace": self.namespace, "service": self.service, "track": self.track}


@dataclass
class Process:
    """A child process this harness started, with its log."""

    popen: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-chars:]
        return "(no log)"

    def stop(self, timeout: float = 30.0) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)


@dataclass
class Engine:
    """A running engine and its sidecar."""

    spec: EngineSpec
    api_port: int
    stats_port: int
    sidecar_port: int
    processes: list[Process] = field(default_factory=list)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def target(self) -> LabelledTarget:
        return LabelledTarget(f"127.0.0.1:{self.sidecar_port}", self.spec.labels)


def _spawn(args: Sequence[str], log: Path) -> Process:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    with open(log, "ab") as out:
        popen = subprocess.Popen([*KVPILOT, *args], stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, env=env)
    return Process(popen, log)


def _wait_http(url: str, process: Process, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            if process.popen.poll() is not None:
                raise RuntimeError(f"{process.log.name} exited with {process.popen.returncode}:\n{process.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if client.get(url).status_code == 200:
                    return
            time.sleep(0.2)
    raise TimeoutError(f"{url} not ready within {timeout} s:\n{process.log_tail()}")


class Fleet:
    """Engines with sidecars; `start()` them, `targets()` for Prometheus, `stop()` (or leave the `with`)."""

    def __init__(self, model_dir: Path, workdir: Path, served_model_name: str = "tiny-llama") -> None:
        self.model_dir = model_dir
        self.workdir = workdir
        self.served_model_name = served_model_name
        self.engines: list[Engine] = []

    def start(self, specs: Sequence[EngineSpec], engine_flags: Sequence[str] = SMALL_ENGINE) -> list[Engine]:
        """Start every engine at once, then every sidecar; returns when all are ready.

        The ports are picked together (distinct), but a port found free can still be taken before the
        engine binds it (an outgoing connection's ephemeral port): an engine that exits with "address
        already in use" is started again on new ports, up to BIND_RETRIES times."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        started = []
        ports = iter(free_ports(3 * len(specs)))
        for spec in specs:
            engine = Engine(spec, next(ports), next(ports), next(ports))
            self.engines.append(engine)
            started.append(engine)
            self._spawn_engine(engine, engine_flags)
        for engine in started:
            for attempt in range(BIND_RETRIES + 1):
                try:
                    _wait_http(f"{engine.api_url}/ready", engine.processes[0], READY_TIMEOUT_S)
                    break
                except RuntimeError:
                    if attempt == BIND_RETRIES or "address already in use" not in engine.processes[0].log_tail():
                        raise
                engine.api_port, engine.stats_port, engine.sidecar_port = free_ports(3)
                engine.processes.clear()
                self._spawn_engine(engine, engine_flags)
        for index, engine in enumerate(started):
            sidecar = _spawn(["sidecar", "--engine-url", f"http://127.0.0.1:{engine.stats_port}", "--host",
                              "127.0.0.1", "--port", str(engine.sidecar_port), "--no-gpu", "--log-level", "WARNING"],
                             self.workdir / f"sidecar-{index}.log")
            engine.processes.append(sidecar)
        for engine in started:
            _wait_http(f"http://{engine.target.address}/healthz", engine.processes[1], 30.0)
        return started

    def _spawn_engine(self, engine: Engine, engine_flags: Sequence[str]) -> None:
        spec = engine.spec
        name = f"{spec.namespace}-{spec.service}-{spec.track}-{self.engines.index(engine) + 1}"
        engine.processes.append(_spawn(
            ["serve", "--model", str(self.model_dir), "--served-model-name", self.served_model_name,
             "--port", str(engine.api_port), "--stats-port", str(engine.stats_port), "--log-level", "warning",
             *engine_flags, *spec.flags], self.workdir / f"{name}-engine.log"))

    def targets(self) -> list[LabelledTarget]:
        return [engine.target for engine in self.engines]

    def stop(self) -> None:
        for engine in reversed(self.engines):
            for process in reversed(engine.processes):
                process.stop()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def send_load(api_url: str, requests: int, concurrency: int = 4, model: str = "tiny-llama",
              max_tokens: int = 12) -> list[int]:
    """Concurrent completions sharing a prompt prefix (so the prefix cache hits); the status codes."""
    prefix = "You are a careful assistant. Answer briefly and precisely. " * 2

    def one(i: int) -> int:
        body = {"model": model, "prompt": f"{prefix}Question {i}: what is {i} + {i}?",
                "max_tokens": max_tokens, "temperature": 0}
        with httpx.Client(timeout=120.0, trust_env=False) as client:
            return client.post(f"{api_url}/v1/completions", json=body).status_code

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, range(requests)))
