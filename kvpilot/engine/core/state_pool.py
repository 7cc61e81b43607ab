"""Slots of the per-sequence recurrent state ("summary") of linear-attention layers. Torch-free.

Every linear layer owns a tensor `[num_slots, ...]` (see worker/state_cache.py); a sequence holds one
slot index, the same in every layer, from its first scheduled step until it finishes, is aborted
or is preempted. The pool also records how many of the sequence's tokens the state has absorbed,
so a step knows whether the state it continues from is resident (a hit) or must be rebuilt from
token 0 (a miss: cold start, preemption, restart).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SlotRef:
    """A sequence's slot and the number of its tokens folded into the state there."""

    slot: int
    num_tokens: int = 0


class StatePool:
    """Owns slot ids 0..num_slots-1 and counts summary hits and misses."""

    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"a state pool needs at least one slot, got num_slots={num_slots}")
        self.num_slots = num_slots
        self.free_slots: list[int] = list(range(num_slots - 1, -1, -1))  # pop() hands out slot 0 first
        self.owners: dict[str, SlotRef] = {}
        self.hits_total = 0
        self.misses_total = 0

    @property
    def num_free(self) -> int:
        return len(self.free_slots)

    @property
    def num_used(self) -> int:
        return len(self.owners)

    def slot_of(self, request_id: str) -> int | None:
        ref = self.owners.get(request_id)
        return None if ref is None else ref.slot

    def resolve(self, request_id: str, num_computed_tokens: int) -> tuple[int, bool]:
        """(slot, fresh) for a sequence about to run from num_computed_tokens.

        Resident (its state has absorbed exactly num_computed_tokens tokens): a hit, fresh False.
        Otherwise a miss: the slot is (re)claimed with no tokens and fresh is True; the caller
        zeroes it and must compute the sequence from token 0 (num_computed_tokens must be 0).
        """
        ref = self.owners.get(request_id)
        if ref is not None and ref.num_tokens == num_computed_tokens and num_computed_tokens > 0:
            self.hits_total += 1
            return ref.slot, False
        if num_computed_tokens != 0:
            raise RuntimeError(
                f"request {request_id!r} resumes at token {num_computed_tokens} but its linear-attention "
                f"state holds {0 if ref is None else ref.num_tokens} tokens; a state can only be rebuilt "
                "from token 0 (prefix caching must be off for models with linear layers)"
            )
        self.misses_total += 1
        if ref is None:
            if not self.free_slots:
                raise RuntimeError(
                    f"state pool exhausted: all {self.num_slots} slots are held (max_num_seqs bounds "
                    "the running sequences, so the pool must have at least that many slots)"
                )
            ref = SlotRef(self.free_slots.pop())
            self.owners[request_id] = ref
        ref.num_tokens = 0
        return ref.slot, True

    def advance(self, request_id: str, num_new_tokens: int) -> None:
        """Record that the state at the sequence's slot absorbed num_new_tokens more tokens."""
        self.owners[request_id].num_tokens += num_new_tokens

    def free(self, request_id: str) -> bool:
        """Give the sequence's slot back (finish, abort, preemption); False if it held none."""
        ref = self.owners.pop(request_id, None)
        if ref is None:
            return False
        assert ref.slot not in self.free_slots, f"double free of state slot {ref.slot}"
        self.free_slots.append(ref.slot)
        return True

    def check(self) -> None:
        """Assert the invariant: every slot is either free or held by exactly one sequence."""
        held = [ref.slot for ref in self.owners.values()]
        assert len(set(held)) == len(held), f"a state slot is held twice: {sorted(held)}"
        assert len(set(self.free_slots)) == len(self.free_slots), "a state slot is free twice"
        assert set(held).isdisjoint(self.free_slots), "a held state slot is also free"
        assert len(held) + len(self.free_slots) == self.num_slots, "a state slot leaked"
