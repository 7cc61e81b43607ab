"""Continuous batching with chunked prefill under a token budget, and preemption by recompute.

Torch-free. Each step the scheduler walks running sequences oldest first (decodes and the
next chunk of unfinished prefills), then admits waiting ones while the token budget,
`max_num_seqs` and free blocks allow. When a running sequence needs a block and none is
free, the newest unscheduled running sequence is preempted: its blocks are freed and it goes
back to the front of the queue to be recomputed (its prefix blocks often still cached).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kvpilot.engine.core.block_manager import BlockManager
from kvpilot.engine.core.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledSeq:
    """One sequence's share of a step: compute `num_new_tokens` tokens from num_computed_tokens."""

    seq: Sequence
    num_new_tokens: int

    @property
    def samples(self) -> bool:
        """Whether this chunk reaches the end of the sequence, so a token is sampled."""
        return self.seq.num_computed_tokens + self.num_new_tokens == len(self.seq)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    """Decides which sequences run each step and with how many tokens."""

    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 2048,
        max_model_len: int = 4096,
        enable_chunked_prefill: bool = True,
        eos_token_ids: tuple[int, ...] = (),
        watermark: float = 0.01,
    ) -> None:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {max_num_batched_tokens}")
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.enable_chunked_prefill = enable_chunked_prefill
        self.eos_token_ids = tuple(eos_token_ids)
        # Blocks kept free when admitting beside running sequences, so their next decode steps
        # do not immediately preempt the newcomer (recompute thrash).
        self.watermark_blocks = int(watermark * block_manager.num_blocks)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.max_chunk_tokens: int | None = None  # set under eviction: a chunk's K/V must fit beside the view

    # -- queue ---------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        self.check_admissible(len(seq))
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def check_admissible(self, prompt_len: int) -> None:
        """Raise ValueError if a prompt of this length could never be scheduled."""
        if prompt_len >= self.max_model_len:
            raise ValueError(
                f"prompt has {prompt_len} tokens; this engine allows at most {self.max_model_len - 1} "
                "(max_model_len - 1, leaving room for one generated token)"
            )
        if not self.enable_chunked_prefill and prompt_len > self.max_num_batched_tokens:
            raise ValueError(
                f"prompt has {prompt_len} tokens but max_num_batched_tokens is {self.max_num_batched_tokens} "
                "and chunked prefill is off; shorten the prompt or enable chunked prefill"
            )

    def abort(self, request_id: str) -> Sequence | None:
        """Remove a request wherever it is and free its blocks at once."""
        for seq in self.running:
            if seq.request_id == request_id:
                self.running.remove(seq)
                self._finish(seq, "abort")
                return seq
        for seq in self.waiting:
            if seq.request_id == request_id:
                self.waiting.remove(seq)
                self._finish(seq, "abort")
                return seq
        return None

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- scheduling ----------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        bm = self.block_manager
        queue = deque(self.running)
        kept: list[Sequence] = []
        while queue and budget > 0:
            seq = queue.popleft()
            uncomputed = seq.num_uncomputed_tokens
            n = min(uncomputed, budget, self.max_chunk_tokens or budget)
            if n < uncomputed and not self._may_chunk(seq):
                kept.append(seq)
                continue
            while not bm.can_append(seq, n):
                victim = queue.pop() if queue else seq
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            else:
                bm.may_append(seq, n)
                out.scheduled.append(ScheduledSeq(seq, n))
                kept.append(seq)
                budget -= n
        kept.extend(s for s in queue if s.status == SequenceStatus.RUNNING)
        self.running = kept

        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not out.preempted:
            seq = self.waiting[0]
            hits = bm.match_prefix(seq)
            remaining = len(seq) - len(hits) * bm.block_size
            n = min(remaining, budget, self.max_chunk_tokens or budget)
            if n < remaining and not self._may_chunk(seq):
                break
            reserve = self.watermark_blocks if self.running else 0
            if not bm.can_allocate(seq, n, hits, reserve):
                break
            self.waiting.popleft()
            bm.allocate(seq, n, hits)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq(seq, n))
            budget -= n
        return out

    def _may_chunk(self, seq: Sequence) -> bool:
        # A preempted sequence recomputes prompt + output, which may exceed the token budget:
        # it is always recomputed in chunks, or it could never run again.
        return self.enable_chunked_prefill or seq.num_preemptions > 0

    def _preempt(self, seq: Sequence) -> None:
        self._to_front_of_queue(seq)
        self.num_preemptions += 1

    def requeue(self, seq: Sequence) -> bool:
        """Free a running seq's blocks and put it first in the queue to be recomputed (as after a
        preemption, which it is not counted as); False when seq is finished or not running."""
        if seq.is_finished or seq not in self.running:
            return False
        self.running.remove(seq)
        self._to_front_of_queue(seq)
        return True

    def shed_newest(self) -> Sequence | None:
        """Preempt the most recently admitted running sequence while another keeps running (its
        blocks freed, recomputed later; counted as a preemption); None when fewer than 2 run."""
        if len(self.running) < 2:
            return None
        victim = max(self.running, key=lambda seq: seq.arrival_time)
        self.running.remove(victim)
        self._preempt(victim)
        return victim

    def _to_front_of_queue(self, seq: Sequence) -> None:
        self.block_manager.deallocate(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1  # lets the scheduler recompute it in chunks
        self.waiting.appendleft(seq)

    # -- after the model ran -------------------------------------------------------------
    def postprocess(self, out: SchedulerOutput, sampled: list[int | None]) -> list[Sequence]:
        """Advance computed counts, append sampled tokens, finish sequences; return the finished."""
        finished: list[Sequence] = []
        for item, token_id in zip(out.scheduled, sampled, strict=True):
            seq = item.seq
            seq.num_computed_tokens += item.num_new_tokens
            self.block_manager.commit(seq)
            if token_id is None:
                continue
            seq.append_token(token_id)
            reason = self._stop_reason(seq, token_id)
            if reason is not None:
                self.finish(seq, reason)
                finished.append(seq)
        return finished

    def _stop_reason(self, seq: Sequence, token_id: int) -> str | None:
        params = seq.params
        if not params.ignore_eos and token_id in self.eos_token_ids:
            return "stop"
        if token_id in params.stop_token_ids:
            return "stop"
        if seq.num_completion_tokens >= params.max_tokens or len(seq) >= self.max_model_len:
            return "length"
        return None

    def finish(self, seq: Sequence, reason: str) -> None:
        """Finish a running sequence (e.g. on a stop string found by the engine)."""
        if seq in self.running:
            self.running.remove(seq)
        self._finish(seq, reason)

    def _finish(self, seq: Sequence, reason: str) -> None:
        self.block_manager.deallocate(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
