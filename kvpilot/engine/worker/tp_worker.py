"""Ranks 1..N-1 of a tensor-parallel engine: join the group, build their shard of the model and KV
cache, then run whatever model call rank 0 broadcasts until it says stop (or disappears)."""

from __future__ import annotations

import logging
import os
import signal
import sys

import torch

from kvpilot.engine.config import EngineConfig, ModelConfig
from kvpilot.engine.context import StopForward, reset_context, set_context
from kvpilot.engine.parallel.driver import context_to
from kvpilot.engine.parallel.state import broadcast_command, close_tp, init_tp
from kvpilot.engine.worker.model_runner import ModelRunner

log = logging.getLogger("kvpilot.engine.worker.tp_worker")


def worker_main(
    rank: int, world: int, init_method: str, backend: str, config: EngineConfig, threads: int
) -> None:
    """The entry point of a spawned rank (torch.multiprocessing)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: rank 0 stops us
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s %(levelname)s [tp rank {rank}] %(name)s: %(message)s"
    )
    torch.set_num_threads(threads)
    if backend == "nccl":
        os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast stays off (docs/dev/tensor-parallel.md)
    try:
        init_tp(rank, world, init_method, backend, config.tensor_parallel_timeout)
        runner = ModelRunner(config, ModelConfig.from_dir(config.model))
        serve(runner)
    except Exception:
        log.exception("tensor-parallel rank %d failed; exiting", rank)
        sys.exit(1)
    finally:
        close_tp()


@torch.inference_mode()
def serve(runner: ModelRunner) -> None:
    """Run rank 0's calls in order: the same forward passes and logits, so the collectives match."""
    model, device = runner.model, runner.device
    while True:
        command = broadcast_command(None)
        kind = command[0]
        if kind == "stop":
            return
        if kind == "logits":
            model.compute_logits(command[1].to(device))
            continue
        _, ids, positions, ctx = command
        ctx = context_to(ctx, device)
        handle = None
        if ctx.capture_layer is not None:
            handle = model.attention_layers()[ctx.capture_layer].register_forward_hook(_stop)
        set_context(ctx)
        try:
            model(ids.to(device), positions.to(device))
        except StopForward:  # rank 0 stopped at the same layer (runtime validation's exact side)
            pass
        finally:
            reset_context()
            if handle is not None:
                handle.remove()


def _stop(_module, _args, _output) -> None:
    raise StopForward
