"""LLMEngine: add requests, then step() = schedule -> run -> postprocess (see docs/dev/interfaces.md)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kvpilot.engine.config import EngineConfig, ModelConfig
from kvpilot.engine.config.sliding_window import window_limit
from kvpilot.engine.config.strategy import check_model_strategy
from kvpilot.engine.core.reserve import build_block_manager, sequence_blocks
from kvpilot.engine.core.scheduler import Scheduler, SchedulerOutput
from kvpilot.engine.core.sequence import Sequence
from kvpilot.engine.metrics.stats import EngineStats, build_feed, kv_occupancy
from kvpilot.engine.sampling_params import SamplingParams
from kvpilot.engine.step_hooks import StepHooks
from kvpilot.engine.stop_matcher import StopAutomaton, automaton
from kvpilot.engine.strategies.kv_quant.pools import kv_feed
from kvpilot.engine.structured.matchers import StructuredOutput
from kvpilot.engine.tokenizer import Tokenizer
from kvpilot.engine.worker.model_runner import ModelRunner
from kvpilot.engine.worker.pending import PLACEHOLDER, PendingStep
from kvpilot.engine.worker.sampler import TopLogprobs
from kvpilot.engine.worker.scoring import score_paged, scores_through_cache
from kvpilot.engine.worker.tp_launch import TensorParallelLaunch


@dataclass
class RequestOutput:
    """What one step produced for one request.

    `new_token_ids` are only this step's tokens. `text` is the whole completion detokenised (cut
    before the stop string when one ended it); it is filled on the final output, and on every
    output of requests that have stop strings (they are searched in it), else left empty.
    """

    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_cached_tokens: int
    text: str = ""
    # with SamplingParams.logprobs: per new token, (log p, [(id, log p) of the most likely])
    logprobs: list[tuple[float, TopLogprobs]] | None = None


class LLMEngine:
    """Continuous-batching engine over a paged KV cache. step() is synchronous, not thread-safe."""

    def __init__(self, config: EngineConfig, on_fatal: Callable[[str], None] | None = None) -> None:
        """`on_fatal(message)`: called (from a watchdog thread) when a tensor-parallel rank dies."""
        self.config = config
        self.model_config = ModelConfig.from_dir(config.model)
        self.tokenizer = Tokenizer(config.model, self.model_config.eos_token_ids)
        self.tp: TensorParallelLaunch | None = None
        if config.tensor_parallel_size > 1:  # ranks 1..N-1 in their own processes; this one is rank 0
            check_model_strategy(config, self.model_config)  # refusals before any process starts
            self.tp = TensorParallelLaunch(config, on_fatal)
        try:
            self.runner = ModelRunner(config, self.model_config, self.tp.driver if self.tp else None)
        except BaseException:
            if self.tp is not None:  # the ranks may be anywhere in their start: stop them, say nothing
                self.tp.abort()
            raise
        self.runner.eos_token_ids = self.tokenizer.eos_token_ids  # the tokenizer's EOS too (min_tokens)
        # grammar matchers of structured requests; the runner masks their rows' logits with them
        self.structured = StructuredOutput(self.tokenizer, self.model_config.vocab_size, self.tokenizer.eos_token_ids)
        self.runner.structured = self.structured
        # a recurrent state cannot start from a cached prefix: it is built from token 0
        self.prefix_caching = config.enable_prefix_caching and self.runner.linear_state is None
        self.block_manager = build_block_manager(  # two pools: auto switching, or a fallback reserve
            config, self.runner.kv_pool_sizes, self.runner.kv_layout.kind == "auto-switch",
            self.runner.strategies.shares_blocks(self.runner), self.prefix_caching,
        )  # fmt: skip
        self.max_model_len = self._max_model_len()
        self.scheduler = Scheduler(
            self.block_manager,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            enable_chunked_prefill=config.enable_chunked_prefill,
            eos_token_ids=self.tokenizer.eos_token_ids,
        )
        self.checks = StepHooks(  # eviction, runtime validation, head utilisation
            config, self.runner, self.block_manager, self.scheduler, self.max_model_len, self._requeue
        )
        self.evictor = self.checks.evictor
        self.scores_through_cache = scores_through_cache(self.runner, self.evictor)
        self.stats_state = EngineStats()
        self._seqs: dict[str, Sequence] = {}
        self._texts: dict[str, str] = {}
        self._stop_matchers: dict[str, StopAutomaton] = {}  # request id -> its stop strings' automaton
        self._pending: list[RequestOutput] = []
        self.async_scheduling = self._use_async_scheduling()
        verdict = self.config.validation_verdict  # a check read after the next launch: no host/device sync
        self.checks.validation.deferred = verdict == "next_step" or (verdict == "auto" and self.async_scheduling)
        if self.runner.device.type == "cuda" and self.tp is None:
            self.checks.validation.warm_up()
        self._inflight: PendingStep | None = None  # the launched step whose tokens are not read yet
        self._final_by_length: set[str] = set()  # finished by length in _advance, awaiting their last token
        self._configured_max_seqs: int | None = None  # set while shed_load() caps the batch
        self.ready = True

    def shutdown(self) -> None:
        """Stop the tensor-parallel ranks (nothing to do at one rank); the engine cannot step after it."""
        if self.tp is not None:
            self.tp.shutdown()

    def _requeue(self, seq: Sequence) -> None:
        """Recompute a running sequence from token 0 (runtime validation's fallback); its state goes too."""
        if self.scheduler.requeue(seq):
            self.runner.release_state(seq.request_id)

    def shed_load(self) -> str | None:
        """Give up memory after an out-of-memory step: preempt the newest running sequence (recomputed
        later, its recurrent state too) and cap the batch at the sequences left. Returns the preempted
        request id, None when fewer than two run. restore_batch_limit() lifts the cap."""
        victim = self.scheduler.shed_newest()
        if victim is None:
            return None
        self.runner.release_state(victim.request_id)
        if self._configured_max_seqs is None:
            self._configured_max_seqs = self.scheduler.max_num_seqs
        self.scheduler.max_num_seqs = max(1, len(self.scheduler.running))
        return str(victim.request_id)

    @property
    def batch_limit(self) -> int:
        """The scheduler's current max_num_seqs (lowered by shed_load)."""
        return self.scheduler.max_num_seqs

    def restore_batch_limit(self) -> bool:
        """Put back the configured max_num_seqs after shed_load; False when it was not lowered."""
        if self._configured_max_seqs is None:
            return False
        self.scheduler.max_num_seqs, self._configured_max_seqs = self._configured_max_seqs, None
        return True

    def _max_model_len(self) -> int:
        mc = self.model_config
        limits = [mc.max_position_embeddings, sequence_blocks(self.block_manager) * self.config.block_size]
        if self.config.eviction != "none":  # the eviction policy bounds each sequence's resident blocks instead
            limits.pop()
        if self.config.max_model_len is not None:
            limits.append(self.config.max_model_len)
        window = window_limit(self.config, mc)  # config/sliding_window.py: where the window is not applied
        if window is not None:
            limits.append(window)
        return min(limits)

    # -- requests ------------------------------------------------------------------------
    def add_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, arrival_time: float | None = None
    ) -> None:
        """`arrival_time` (time.monotonic(), system-wide on Linux): when the request reached the server, if
        that was before this call (the engine core's API process stamps it, as vLLM's frontend does), so
        TTFT and end-to-end latency count the wait for the core to take it."""
        if request_id in self._seqs:
            raise ValueError(f"request id {request_id!r} is already in use by an unfinished request")
        vocab = self.model_config.vocab_size
        bad = [t for t in prompt_token_ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids must be integers in [0, {vocab}), got {bad[:5]}")
        if params.logit_bias and max(params.logit_bias) >= vocab:
            raise ValueError(f"logit_bias token id {max(params.logit_bias)} is out of range [0, {vocab})")
        seq = Sequence(request_id, prompt_token_ids, params)
        if arrival_time is not None:
            seq.arrival_time = min(seq.arrival_time, arrival_time)
        if params.structured is not None:  # compiled (or cached) before anything else holds state
            self.structured.add(request_id, params.structured)
        try:
            self.scheduler.add(seq)
        except BaseException:
            self.structured.release(request_id)
            raise
        self._seqs[request_id] = seq
        self._texts[request_id] = ""
        self.stats_state.prompt_tokens_total += len(seq)

    def abort_request(self, request_id: str) -> None:
        """Free the request's KV blocks now; its final output (reason 'abort') comes with the next step."""
        seq = self.scheduler.abort(request_id)
        if seq is None:
            return
        self.stats_state.on_finish(seq, time.monotonic())
        self._pending.append(self._output(seq, []))
        self._forget(seq)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._pending) or self._inflight is not None

    # -- the step ------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One step. Under async scheduling the outputs are those of the step launched by the call
        before (their tokens were read while this one was queued on the device)."""
        if self.async_scheduling:
            return self._step_async()
        outputs, self._pending = self._pending, []
        scheduled = self._schedule()
        if scheduled.is_empty:
            self.checks.validation.resolve()  # a deferred check of the last step, with no step to follow it
            return outputs
        self.checks.before_run(scheduled)
        return outputs + self._run_sync(scheduled)

    def _schedule(self) -> SchedulerOutput:
        scheduled = self.scheduler.schedule()
        for seq in scheduled.preempted:  # a preempted sequence's recurrent state is lost (a summary miss later)
            self.runner.release_state(seq.request_id)
        if scheduled.is_empty and not self.scheduler.running:
            self.stats_state.kv_time.idle(time.monotonic())
        return scheduled

    def _run_sync(self, scheduled: SchedulerOutput) -> list[RequestOutput]:
        try:
            sampled = self.runner.run(scheduled)
        except torch.OutOfMemoryError:
            self.stats_state.oom_events_total += 1
            raise
        self.scheduler.postprocess(scheduled, sampled)
        outputs = self._emit(scheduled, sampled, self.runner.last_logprobs)
        self._after_step(scheduled)
        return outputs

    def _emit(
        self, scheduled: SchedulerOutput, sampled: list[int | None], step_logprobs: dict[int, Any]
    ) -> list[RequestOutput]:
        """Outputs of the tokens the scheduler has appended: stop strings checked, finished requests forgotten."""
        outputs = []
        stats, now = self.stats_state, time.monotonic()
        for index, (item, token) in enumerate(zip(scheduled.scheduled, sampled, strict=True)):
            if token is None:
                continue
            seq = item.seq
            stats.on_token(seq, now)
            finished = seq.is_finished
            if seq.params.stop or finished:  # else nothing to detokenise (see _check_stop_strings)
                self._check_stop_strings(seq)
                finished = seq.is_finished
            if finished:
                stats.on_finish(seq, now)
            output = self._output(seq, [token], finished)
            if index in step_logprobs:
                output.logprobs = [step_logprobs[index]]
            outputs.append(output)
            if finished:
                self._forget(seq)
        return outputs

    def _after_step(self, scheduled: SchedulerOutput) -> None:
        self.checks.after_step(scheduled)
        # KV occupancy after the step holds until the next one: measured here, a new sequence's
        # blocks count once its prompt is computed (before, they were allocated but empty).
        stats = self.stats_state
        if self.scheduler.running:
            block_size = self.block_manager.block_size
            stats.kv_time.busy(time.monotonic(), lambda: kv_occupancy(self.scheduler.running, block_size))
        else:
            stats.kv_time.idle(time.monotonic())

    # -- async scheduling (host/GPU overlap) ------------------------------------------------
    def _use_async_scheduling(self) -> bool:
        """On where no engine-wide host decision needs each step's tokens before the next step starts."""
        mode = self.config.async_scheduling
        if mode == "off" or (mode == "auto" and (self.runner.device.type != "cuda"
                                                 or self.model_config.family not in ("llama", "mistral", "qwen2"))):
            return False  # fmt: skip
        # a recurrent state's slots and the tensor-parallel ranks follow each step: those engines step
        # synchronously. Runtime validation and eviction run after a launch, on the step's own data.
        return self.runner.linear_state is None and self.tp is None

    @staticmethod
    def _needs_tokens(scheduled: SchedulerOutput) -> bool:
        """Whether this step's sampling reads the tokens before it (penalties count them, a grammar mask
        follows them) or returns log-probabilities: then the step before must be read first."""
        for item in scheduled.scheduled:
            p = item.seq.params
            if (p.structured is not None or p.logprobs is not None or p.presence_penalty or p.frequency_penalty
                    or p.repetition_penalty != 1.0):  # fmt: skip
                return True
        return False

    def _step_async(self) -> list[RequestOutput]:
        outputs, self._pending = self._pending, []
        scheduled = self._schedule()  # a sequence of the step in flight holds PLACEHOLDER as its last token
        prev, self._inflight = self._inflight, None
        if scheduled.is_empty:
            outputs += self._collect(prev) if prev is not None else []
            self.checks.validation.resolve()  # a deferred check of the last step, with no step to follow it
            return outputs
        if self._needs_tokens(scheduled):  # read the step in flight, then run this one as the sync engine does
            if prev is not None:
                outputs += self._collect(prev)
                scheduled.scheduled = [s for s in scheduled.scheduled if not s.seq.is_finished]
                if scheduled.is_empty:
                    return outputs
            self.checks.before_run(scheduled)
            return outputs + self._run_sync(scheduled)
        self.checks.before_run(scheduled)
        try:
            pending = self.runner.launch(scheduled, prev)
        except BaseException as exc:
            self._inflight = prev  # still to be read: a retried step (server/oom.py) launches after it
            if isinstance(exc, torch.OutOfMemoryError):
                self.stats_state.oom_events_total += 1
            raise
        if prev is not None:  # the device runs `pending` while the host reads and handles prev
            outputs += self._collect(prev)
        self._advance(pending)
        self._inflight = pending
        self._after_step(scheduled)
        return outputs

    def _advance(self, pending: PendingStep) -> None:
        """What Scheduler.postprocess does before a token is known: computed counts, prefix-cache commits,
        a PLACEHOLDER token per sampling chunk; a sequence that ends by length with it leaves the running set
        now (its output comes with the token)."""
        bm, sched = self.block_manager, self.scheduler
        for item in pending.scheduled.scheduled:
            seq = item.seq
            if seq.is_finished:  # stopped by the token read just before (EOS, a stop string), or aborted
                continue
            samples = item.samples  # asked before the count moves on
            seq.num_computed_tokens += item.num_new_tokens
            bm.commit(seq)  # the blocks' tokens are all known: the last read one was patched in by _collect
            if not samples:
                continue
            seq.append_token(PLACEHOLDER)
            if seq.num_completion_tokens >= seq.params.max_tokens or len(seq) >= sched.max_model_len:
                sched.finish(seq, "length")
                self._final_by_length.add(seq.request_id)

    def _collect(self, pending: PendingStep) -> list[RequestOutput]:
        """Read a launched step's tokens into its sequences, finish those they end, and emit them."""
        tokens = pending.tokens()
        sched = self.scheduler
        for index, item in enumerate(pending.scheduled.scheduled):
            token, seq = tokens[index], item.seq
            if token is None:
                continue
            final = seq.request_id in self._final_by_length and self._seqs.get(seq.request_id) is seq
            if (seq.is_finished and not final) or seq.token_ids[-1] != PLACEHOLDER:
                tokens[index] = None  # its sequence ended (or was aborted) before this token: dropped
                continue
            self._final_by_length.discard(seq.request_id)
            seq.token_ids[-1] = token
            reason = sched._stop_reason(seq, token)  # what Scheduler.postprocess asks
            if final:
                seq.finish_reason = reason
            elif reason is not None:
                if seq in sched.waiting:  # preempted by the schedule that followed this step
                    sched.waiting.remove(seq)
                sched.finish(seq, reason)
        return self._emit(pending.scheduled, tokens, {})

    def _check_stop_strings(self, seq: Sequence) -> None:
        stops = seq.params.stop
        if not stops and not seq.is_finished:
            return  # detokenise once at the end: decoding every step would cost O(n^2)
        text = self.tokenizer.decode(seq.completion_token_ids)
        if stops and (seq.finish_reason is None or seq.finish_reason == "length"):
            # margin: a multi-byte character completed by this token may change the earlier text
            matcher = self._stop_matchers.get(seq.request_id)
            if matcher is None:  # one per sequence: the work per character does not grow with the stops
                matcher = self._stop_matchers[seq.request_id] = automaton(tuple(stops))
            tail = max(0, len(self._texts[seq.request_id]) - matcher.longest - 8)
            hit = matcher.earliest(text, tail)
            if hit is not None:
                text = text[:hit]
                if not seq.is_finished:
                    self.scheduler.finish(seq, "stop")
                seq.finish_reason = "stop"
        self._texts[seq.request_id] = text

    def _output(self, seq: Sequence, new_token_ids: list[int], finished: bool | None = None) -> RequestOutput:
        return RequestOutput(
            seq.request_id,
            new_token_ids,
            seq.is_finished if finished is None else finished,
            seq.finish_reason,
            seq.num_prompt_tokens,
            seq.num_cached_tokens,
            self._texts.get(seq.request_id, ""),
        )

    def _forget(self, seq: Sequence) -> None:
        self._seqs.pop(seq.request_id, None)
        self._texts.pop(seq.request_id, None)
        self._stop_matchers.pop(seq.request_id, None)
        self.structured.release(seq.request_id)
        self.runner.release(seq.request_id)

    # -- scoring and stats ---------------------------------------------------------------
    def score(self, prompt_token_ids: list[int], continuation_token_ids: list[int]) -> list[float]:
        """log p of each continuation token given the prompt and the continuation before it."""
        return self.score_tokens(prompt_token_ids, continuation_token_ids)[0]

    def score_tokens(
        self, prompt_token_ids: list[int], continuation_token_ids: list[int], top: int = 0
    ) -> tuple[list[float], list[TopLogprobs]]:
        """score(), plus each position's `top` most likely tokens (id, log p): the path of /v1/score,
        of echo=true's prompt log-probabilities and of lm-eval's loglikelihood requests."""
        if not prompt_token_ids or not continuation_token_ids:
            raise ValueError("score needs at least one prompt token and one continuation token")
        total = len(prompt_token_ids) + len(continuation_token_ids)
        if total > self.max_model_len:
            raise ValueError(f"prompt + continuation is {total} tokens; the limit is {self.max_model_len}")
        vocab = self.model_config.vocab_size
        if any(not 0 <= t < vocab for t in [*prompt_token_ids, *continuation_token_ids]):
            raise ValueError(f"token ids must be in [0, {vocab})")
        if self.scores_through_cache:  # score what serving computes: 8-bit K/V, the evicted view, a state
            chunk = None if self.evictor is not None else self.config.max_num_batched_tokens
            return score_paged(
                self.runner, self.block_manager, self.evictor, prompt_token_ids, continuation_token_ids, chunk, top
            )
        return self.runner.score_tokens(prompt_token_ids, continuation_token_ids, top)

    def reset_stats(self) -> None:
        """Start the feed's counters again (new instance_id), e.g. after a warm-up that is not traffic."""
        self.stats_state = EngineStats()
        self.block_manager.prefix_queried_tokens = 0
        self.block_manager.prefix_hit_tokens = 0
        self.scheduler.num_preemptions = 0
        if self.runner.linear_state is not None:
            self.runner.linear_state.reset_stats()

    def record_rejection(self, reason: str) -> None:
        self.stats_state.record_rejection(reason)

    def stats(self) -> dict[str, Any]:
        runner = self.runner
        kv = kv_feed(runner, self.block_manager, len(self.scheduler.running))
        memory = {
            "weights": runner.weights_bytes,
            "kv_pool": kv.pool_bytes,
            "activation_peak": runner.activation_peak_bytes,
            **runner.memory_stats(),
        }
        info = {
            "model": self.config.model,
            "strategy": self.config.attention,
            "device": runner.device.type,
            "ready": self.ready,
            "kv_cache_dtype": kv.kv_cache_dtype,  # the dtype new sequences get now
        }
        sections = runner.strategies.feed(runner)  # each strategy's typed sections: mla, linear
        return build_feed(
            self.stats_state, info, self.block_manager, self.scheduler, runner.bytes_per_block, memory,
            sequences_by_dtype=kv.sequences_by_dtype, kv_used=kv.used_bytes, **sections,
            **self.checks.feed_sections(),
        )  # fmt: skip
