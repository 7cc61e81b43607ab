"""Runtime validation and fallback around whatever approximation serves a sequence.

Every `validate_every` decode tokens of a sampled sequence, the decode step captures one layer's
served attention output and each `ApproximationCheck` that applies computes the exact one
(`DenseRecompute`: a dense, cache-free pass); a cosine below `validation_threshold` moves the
sequence to its exact path. What is compared and why: docs/long_context.md, "Runtime validation".

A check's values are computed on the device after its step and read on the host either then (`same_step`,
a host/device synchronisation) or after the next step has been launched (`next_step`, the default under
async scheduling): the host never waits for the device, and a failing sequence moves one step later.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import torch

from kvpilot.engine.config import EngineConfig, ModelConfig
from kvpilot.engine.context import StopForward, dense_context, get_context
from kvpilot.engine.core.scheduler import SchedulerOutput
from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.layers.attention import Attention
from kvpilot.engine.metrics.stats_contract import FALLBACK_REASONS
from kvpilot.engine.sampling_params import SamplingParams
from kvpilot.engine.validation.cosine import measure_attention, should_validate, verdict

log = logging.getLogger("kvpilot.engine.validation")


class ValidatedRunner(Protocol):
    """What validation reads of the model runner (worker/model_runner.ModelRunner)."""

    model: torch.nn.Module
    model_config: ModelConfig
    device: torch.device
    dtype: torch.dtype
    last_sample_rows: list[tuple[int, int]]  # (scheduled index, packed row) of the last step's sampled tokens
    decode_graphs: Any  # worker/cuda_graphs.DecodeGraphs | None (its output tap), read if present


class ApproximationCheck(Protocol):
    """One approximation's side of runtime validation. Strategy paths plug in by implementing it."""

    name: str  # strategy name used in the fallback reason and warning ("eviction", "kv_int8", ...)

    def applies(self, seq: Sequence) -> bool:
        """Whether this sequence is currently served by the approximation."""

    def exact_attention(self, seq: Sequence, layer: int, num_tokens: int) -> torch.Tensor:
        """The exact attention output [Hq, head_dim] at `layer` for token num_tokens - 1 of seq."""

    def can_fall_back(self, seq: Sequence) -> bool:
        """Whether an exact path exists for this sequence now."""

    def fall_back(self, seq: Sequence) -> None:
        """Move seq to the exact path: it must set seq.exact_path and leave the engine consistent."""


@contextmanager
def forcing_exact(model: torch.nn.Module, layer_type: type) -> Iterator[None]:
    """Within the block, every `layer_type` module of `model` runs its exact path (`force_exact`)."""
    layers = [m for m in model.modules() if isinstance(m, layer_type)]
    for layer in layers:
        layer.force_exact = True
    try:
        yield
    finally:
        for layer in layers:
            layer.force_exact = False


class _Captured(StopForward):
    """Raised by a capture hook to stop a recompute once the wanted layer has run."""


class StepCapture:
    """The validated layer's served attention output for a whole step, rows in the step's packed order.

    A layer's attention module is usually called once per step, over every packed token. Beside a fallback
    reserve (layers/reserve_attention.py: MLA and GQA conversions) it is called once per converted pool part
    instead (prefill chunks, then decodes, each under a context of its own), and the reserve's rows are attended
    without it. So every call is kept, and the parts are put back at their rows from the step's split
    (`Context.kv_split`, read from the step's context, which a pre-hook on the model records).
    """

    def __init__(self, model: torch.nn.Module, module: torch.nn.Module, num_tokens: int) -> None:
        self.num_tokens = num_tokens  # the step's packed tokens
        self.outputs: list[torch.Tensor] = []
        self.step_ctx: Any = None
        self._handles = [
            model.register_forward_pre_hook(self._enter),
            module.register_forward_hook(self._keep),
        ]

    def _enter(self, _module, _args) -> None:
        if self.step_ctx is None:  # the step's outermost model call (not a nested one)
            self.step_ctx = get_context()

    def _keep(self, _module, _args, output) -> None:
        self.outputs.append(output.detach())

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def served(self) -> tuple[torch.Tensor, list[bool]] | str:
        """(output [num_tokens, ...], which rows the layer served) or, where it cannot be assembled, why."""
        outs, n = self.outputs, self.num_tokens
        if len(outs) == 1 and outs[0].shape[0] == n:
            return outs[0], [True] * n
        split = getattr(self.step_ctx, "kv_split", None)
        parts = [] if split is None else [p for p in split.parts if p.quant]  # the parts the module served
        if not outs or len(parts) != len(outs):
            return f"{len(outs)} call(s) of the validated layer for {len(parts)} converted part(s) of a {n}-token step"
        full = outs[0].new_zeros((n, *outs[0].shape[1:]))
        mask = torch.zeros(n, dtype=torch.bool)
        for part, out in zip(parts, outs, strict=True):
            full[part.rows] = out
            mask[part.rows.cpu() if isinstance(part.rows, torch.Tensor) else part.rows] = True
        return full, mask.tolist()


def last_row_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention output [Hq, D] of the last query row alone, in fp32: q [T, Hq, D], k/v [T, Hkv, D].

    The last row attends to every key, so no mask is needed, and no [T, T] product is formed.
    """
    num_heads, num_kv, dim = q.shape[1], k.shape[1], q.shape[2]
    query = q[-1].float().view(num_kv, num_heads // num_kv, dim)  # [Hkv, G, D]
    scores = torch.einsum("kgd,tkd->kgt", query, k.float()) * scale
    return torch.einsum("kgt,tkd->kgd", torch.softmax(scores, dim=-1), v.float()).reshape(num_heads, dim)


class TapCapture:
    """`StepCapture` through the decode graphs' `OutputTap` on the validated layer (8-bit caches): no hook
    is registered, so the step replays its graph; an eager step's output is kept by the tap's own hook."""

    def __init__(self, tap: Any, num_tokens: int) -> None:
        self.tap = tap
        self.num_tokens = num_tokens
        tap.outputs = []
        tap.armed = True

    def remove(self) -> None:
        self.tap.armed = False

    def served(self) -> tuple[torch.Tensor, list[bool]] | str:
        outs, self.tap.outputs = self.tap.outputs, []
        n = self.num_tokens
        if len(outs) == 1 and outs[0].shape[0] == n:
            return outs[0], [True] * n
        return f"{len(outs)} output(s) of the validated layer tapped for a {n}-token step"


class DenseRecompute:
    """Exact reference by recomputation: a dense, cache-free forward pass over the sequence's tokens.

    `runner` is the engine's ModelRunner (model, device); checks take what they use, not the engine.
    The pass stops at the validated layer. Where that layer is the plain paged `Attention` (whose dense
    forward is causal attention over its q, k, v), only the last token's row is computed, in fp32, from
    the layer's inputs: a full causal SDPA over every row cost ~60 ms a check on the H200 (its kernel set
    up anew for each sequence length; docs/benchmarks.md, issue 30), and only that row is compared.
    """

    def __init__(self, runner: ValidatedRunner) -> None:
        self.runner = runner

    @torch.inference_mode()
    def exact_attention(self, seq: Sequence, layer: int, num_tokens: int) -> torch.Tensor:
        runner = self.runner
        module = runner.model.attention_layers()[layer]
        store: dict[str, torch.Tensor] = {}

        def stop(_module, _args, output):
            store["out"] = output[-1].detach()
            raise _Captured

        def last_row(mod, args):  # before the layer runs: (q, k, v) as its dense forward would get them
            q, k, v = args[:3]
            store["out"] = last_row_attention(q, k, v, mod.scale)
            raise _Captured

        if type(module) is Attention:
            handle = module.register_forward_pre_hook(last_row)
        else:
            handle = module.register_forward_hook(stop)
        ids = token_ids_on(runner.device, seq.token_ids[:num_tokens])
        try:
            with dense_context(capture_layer=layer):  # tensor-parallel ranks stop at this layer too
                runner.model(ids, torch.arange(num_tokens, device=runner.device))
        except _Captured:
            pass
        finally:
            handle.remove()
        return store["out"]


def token_ids_on(device: torch.device, ids: list[int]) -> torch.Tensor:
    """ids as a long tensor on `device`, copied from pinned memory on CUDA: a copy from pageable memory
    blocks the host until the device has run everything queued before it (the whole step in flight), which
    made every check a host/device sync (0.92 s of host time for 118 checks, docs/benchmarks.md, issue 30)."""
    host = torch.tensor(ids, dtype=torch.long)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def is_sampled(request_id: str, rate: float) -> bool:
    """Deterministic per-request sampling: the same request id is always in or out."""
    return rate >= 1.0 or zlib.crc32(request_id.encode()) / 2**32 < rate


class PendingChecks:
    """One step's checks, their values [n, 2] (finite, cosine) on their way to the host."""

    def __init__(self, entries: list[tuple[ApproximationCheck, Sequence, int]], values: torch.Tensor) -> None:
        self.entries = entries
        if values.is_cuda:
            self.host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            self.host.copy_(values, non_blocking=True)
            self.event: torch.cuda.Event | None = torch.cuda.Event()
            self.event.record()
        else:
            self.host, self.event = values, None

    def read(self) -> list[tuple[ApproximationCheck, Sequence, int, bool, float]]:
        if self.event is not None:
            self.event.synchronize()  # queued before the step launched since: that step keeps the device busy
        values = self.host.tolist()
        return [(check, seq, n, finite > 0, cosine) for (check, seq, n), (finite, cosine) in zip(self.entries, values, strict=True)]


class ValidationRunner:
    """Captures the served attention at one layer on due decode steps and runs the checks after."""

    def __init__(self, config: EngineConfig, runner: ValidatedRunner, checks: list[ApproximationCheck]) -> None:
        self.runner = runner
        self.deferred = False  # read each step's checks after the next step's launch (LLMEngine sets it)
        self._pending: PendingChecks | None = None
        self.checks = list(checks)
        self.every = config.validate_every
        self.rate = config.validation_sample_rate
        self.threshold = config.validation_threshold
        num_layers = len(runner.model.attention_layers())
        layer = config.validation_layer
        if not -num_layers <= layer < num_layers:
            raise ValueError(f"validation_layer must be in [-{num_layers}, {num_layers}), got {layer}")
        self.layer = layer % num_layers
        self.checks_total = 0
        # by strategy (the check's name) and reason; every active check's reasons start at 0
        self.fallbacks_total: dict[str, dict[str, int]] = {}
        for check in self.checks:
            self.fallbacks_total.setdefault(check.name, dict.fromkeys(FALLBACK_REASONS, 0))
        self.unrecovered_total: dict[str, int] = {}  # failed with no exact path to move to: served on, warned
        self.last_cosine: float | None = None
        self.checks_skipped_total = 0  # the exact side ran out of device memory (or no served row): logged, served on
        self._due: list[tuple[int, Sequence, int, list[ApproximationCheck]]] = []
        self._capture: StepCapture | None = None

    def warm_up(self, lengths: tuple[int, ...] = (37, 700)) -> None:
        """Run the recomputing checks' exact side and the measurement once per length, on a throwaway sequence,
        so the first real check does not pay for the device's first use of those kernels (a 320 ms check step
        on the H200: docs/benchmarks.md, issue 30). Nothing is counted or decided."""
        vocab = self.runner.model_config.vocab_size
        for check in self.checks:
            if not isinstance(check, DenseRecompute):
                continue
            for n in lengths:
                seq = Sequence("validation-warm-up", [(7 * i + 3) % vocab for i in range(n)], SamplingParams(max_tokens=1))
                exact = check.exact_attention(seq, self.layer, n)
                measure_attention(exact.float(), exact.float()).tolist()

    def before_run(self, out: SchedulerOutput) -> None:
        """Pick this step's due decodes and capture their outputs at the validated layer: through the decode
        graphs' tap where there is one (the step may replay), else by hooks (the step runs eagerly)."""
        if self._capture is not None:  # the previous step raised before after_step
            self._capture.remove()
            self._capture = None
        self._due = []
        if not self.checks:
            return
        for index, item in enumerate(out.scheduled):
            seq = item.seq
            if item.num_new_tokens != 1 or not item.samples or seq.exact_path:
                continue
            if not should_validate(seq.num_completion_tokens, self.every) or not is_sampled(seq.request_id, self.rate):
                continue
            checks = [c for c in self.checks if c.applies(seq)]
            if checks:
                self._due.append((index, seq, seq.num_computed_tokens + 1, checks))
        if self._due:
            model, num_tokens = self.runner.model, sum(item.num_new_tokens for item in out.scheduled)
            tap = self._tap()
            if tap is not None:
                self._capture = TapCapture(tap, num_tokens)
            else:
                self._capture = StepCapture(model, model.attention_layers()[self.layer], num_tokens)

    def _tap(self) -> Any:
        """The decode graphs' tap on the validated layer, if the runner has one (worker/cuda_graphs.py)."""
        graphs = getattr(self.runner, "decode_graphs", None)
        tap = getattr(graphs, "tap", None)
        return tap if tap is not None and tap.layer == self.layer else None

    def after_step(self) -> None:
        """Compute each due sequence's checks (served output against their exact ones) on the device, then
        decide them: now, or (deferred) after the next step, deciding the previous step's checks first."""
        capture, self._capture = self._capture, None
        if capture is not None:
            capture.remove()
        if self.deferred:
            self.resolve()
        if not self._due:
            return
        due, self._due = self._due, []
        captured = capture.served() if capture is not None else "nothing was captured"
        if isinstance(captured, str):  # never expected: skip the checks rather than fail the step for every request
            self.checks_skipped_total += len(due)
            log.error("validation skipped for %d sequence(s): the served output could not be assembled (%s)",
                      len(due), captured)  # fmt: skip
            return
        served, served_rows = captured
        rows = dict(self.runner.last_sample_rows)  # scheduled index -> packed row of its sampled token
        entries: list[tuple[ApproximationCheck, Sequence, int]] = []
        values: list[torch.Tensor] = []
        for index, seq, num_tokens, checks in due:
            if not served_rows[rows[index]]:  # attended on the reserve, without the validated module
                self.checks_skipped_total += 1
                log.error("validation of %s skipped: its row was not served by the validated layer", seq.request_id)
                continue
            approx = served[rows[index]]
            for check in checks:  # every applicable check is measured; the first that fails moves the sequence
                measured = self._measure(check, seq, num_tokens, approx)
                if measured is not None:
                    entries.append((check, seq, num_tokens))
                    values.append(measured)
        if entries:
            self._pending = PendingChecks(entries, torch.stack(values))
            if not self.deferred:
                self.resolve()

    def resolve(self) -> None:
        """Decide the checks still on their way to the host (a deferred step's), falling back where low."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        for check, seq, num_tokens, finite, cosine in pending.read():
            if not seq.exact_path:  # an earlier check of the step moved it already
                self._decide(check, seq, num_tokens, finite, cosine)

    def _measure(self, check: ApproximationCheck, seq: Sequence, num_tokens: int, approx: torch.Tensor) -> torch.Tensor | None:
        try:
            exact = check.exact_attention(seq, self.layer, num_tokens)
        except torch.OutOfMemoryError as exc:  # a check must never take the engine down: skip it, serve on
            self.checks_skipped_total += 1
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            log.warning("validation of %s at token %d skipped: the exact %s side ran out of device memory (%s)",
                        seq.request_id, num_tokens, check.name, str(exc).split(".")[0])
            return None
        return measure_attention(exact.float(), approx.float())

    def _decide(self, check: ApproximationCheck, seq: Sequence, num_tokens: int, finite: bool, cosine: float) -> None:
        can = check.can_fall_back(seq)
        result = verdict(finite, cosine, check.name, self.threshold, has_exact_path=can)
        self.checks_total += 1
        self.last_cosine = None if result.cosine != result.cosine else result.cosine  # the feed is JSON: no NaN
        if result.reason is None:
            return
        if not result.fallback:
            self.unrecovered_total[check.name] = self.unrecovered_total.get(check.name, 0) + 1
            log.warning("validation of %s at token %d: %s", seq.request_id, num_tokens, result.reason)
            return
        reason = "nan" if result.cosine != result.cosine else "low_cosine"
        by_reason = self.fallbacks_total.setdefault(check.name, dict.fromkeys(FALLBACK_REASONS, 0))
        by_reason[reason] = by_reason.get(reason, 0) + 1
        log.warning(
            "validation of %s at token %d (layer %d): %s; moving it to the exact path",
            seq.request_id, num_tokens, self.layer, result.reason,
        )  # fmt: skip
        if not seq.is_finished:
            check.fall_back(seq)

    def feed(self) -> dict:
        self.resolve()  # a deferred step's checks count once the feed is read, even if no step follows
        return {
            "checks_total": self.checks_total,
            "fallbacks_total": {name: dict(reasons) for name, reasons in self.fallbacks_total.items()},
            "unrecovered_total": dict(self.unrecovered_total),
            "last_cosine": self.last_cosine,
            "checks_skipped_total": self.checks_skipped_total,
        }
