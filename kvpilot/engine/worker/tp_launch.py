"""Start a tensor-parallel engine's ranks 1..N-1 (torch.multiprocessing, spawn), join the group as rank 0,
and watch the ranks: one that exits while the engine runs makes it fail closed, with one log line."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import wait

import torch
import torch.multiprocessing as mp

from kvpilot.engine.config import EngineConfig
from kvpilot.engine.parallel.driver import TPDriver
from kvpilot.engine.parallel.state import close_tp, init_tp
from kvpilot.engine.worker.tp_worker import worker_main

log = logging.getLogger("kvpilot.engine.tensor_parallel")
STOP_JOIN_SECONDS = 10.0
WATCH_SECONDS = 0.5  # how often the watchdog looks at a pending call


def backend_for(device: str) -> str:
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    return "nccl" if cuda else "gloo"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TensorParallelLaunch:
    """The spawned ranks, rank 0's driver and the watchdog thread of one engine."""

    def __init__(self, config: EngineConfig, on_fatal: Callable[[str], None] | None = None) -> None:
        world = config.tensor_parallel_size
        backend = backend_for(config.device)
        if backend == "nccl":
            os.environ["NCCL_NVLS_ENABLE"] = "0"  # inherited by the spawned ranks too
            if torch.cuda.device_count() < world:
                raise ValueError(
                    f"tensor_parallel_size={world} needs {world} GPUs, {torch.cuda.device_count()} are visible"
                )
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        threads = max(1, torch.get_num_threads() // world)
        if backend == "gloo":  # CPU ranks share the cores: each gets its share, rank 0 too
            torch.set_num_threads(threads)
        ctx = mp.get_context("spawn")
        self.procs = [
            ctx.Process(
                target=worker_main,
                args=(rank, world, init_method, backend, config, threads),
                name=f"kvpilot-tp-rank{rank}",
                daemon=True,
            )
            for rank in range(1, world)
        ]
        for proc in self.procs:
            proc.start()
        self.driver = TPDriver(on_fatal, stop_ranks=self._kill)
        self.timeout_s = config.tensor_parallel_timeout
        self._stopping = False
        try:
            self._join(world, init_method, backend)
        except BaseException:
            self._kill()
            raise
        self._watchdog = threading.Thread(target=self._watch, name="kvpilot-tp-watchdog", daemon=True)
        self._watchdog.start()
        log.info("tensor parallel: %d ranks (%s), pids %s", world, backend, [p.pid for p in self.procs])

    def _join(self, world: int, init_method: str, backend: str) -> None:
        """Join the group as rank 0; a rank that exits meanwhile (its traceback is in the log above) ends
        the wait at once instead of after the rendezvous timeout."""
        errors: list[BaseException] = []

        def join() -> None:
            try:
                init_tp(0, world, init_method, backend, self.timeout_s)
            except BaseException as exc:
                errors.append(exc)

        joiner = threading.Thread(target=join, name="kvpilot-tp-join", daemon=True)
        joiner.start()
        while joiner.is_alive():
            joiner.join(WATCH_SECONDS)
            dead = [(rank, p) for rank, p in enumerate(self.procs, start=1) if p.exitcode is not None]
            if dead:
                rank, proc = dead[0]
                raise RuntimeError(
                    f"tensor-parallel rank {rank} (pid {proc.pid}) exited with code {proc.exitcode} while the engine "
                    "started; its log above says why"
                )
        if errors:
            raise errors[0]

    def _watch(self) -> None:
        """Fail closed when a rank exits, or when the ranks do not take rank 0's call within the timeout
        (a hung rank: a gloo send waits for its receiver, so rank 0 would wait with it); a hung rank is
        killed so that rank 0's pending call returns with an error instead of waiting."""
        sentinels = {p.sentinel: (rank, p) for rank, p in enumerate(self.procs, start=1)}
        while not self._stopping:
            ready = wait(list(sentinels), timeout=WATCH_SECONDS)
            if self._stopping:
                return
            if ready:
                rank, proc = sentinels[ready[0]]
                proc.join(1.0)
                self.driver.fail(
                    f"tensor-parallel rank {rank} (pid {proc.pid}) exited with code {proc.exitcode}; the engine "
                    "cannot run without it and fails closed"
                )
                return
            since = self.driver.sending_since
            if since is not None and time.monotonic() - since > self.timeout_s:
                self.driver.fail(
                    f"tensor parallel: the other ranks did not take rank 0's call within {self.timeout_s:g} s "
                    f"(--tensor-parallel-timeout; a rank hung); stopping ranks {[p.pid for p in self.procs]}, "
                    "failing closed"
                )  # and kills the ranks: rank 0's pending call then returns with an error
                return

    def shutdown(self) -> None:
        """Tell the ranks to stop, wait for them, leave the group (idempotent)."""
        if self._stopping:
            return
        self._stopping = True
        if self.driver.failure is None:
            try:
                self.driver.stop()
            except Exception as exc:  # a rank already gone: nothing to tell it
                log.warning("tensor parallel: stopping the ranks: %s", exc)
        for proc in self.procs:
            proc.join(STOP_JOIN_SECONDS)
        self._kill()
        close_tp()

    def abort(self) -> None:
        """Kill the ranks without a word (the engine failed to start) and leave the group."""
        self._stopping = True
        self._kill()
        close_tp()

    def _kill(self) -> None:
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
                proc.join(STOP_JOIN_SECONDS)
