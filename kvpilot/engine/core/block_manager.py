"""Paged KV block accounting with hash-chained prefix caching of full blocks. Torch-free.

A block is registered in the prefix cache only once its K/V are computed (`commit`), so a
sequence never reads a cached block that an in-flight chunked prefill has not written yet.
Freed blocks keep their registration and sit in an LRU free list: a later prompt with the
same prefix takes them back; a fresh allocation evicts the least recently freed one.
"""

from __future__ import annotations

from collections import OrderedDict

from kvpilot.engine.core.sequence import Sequence

NO_HASH = -1


def chain_hash(prev_hash: int, token_ids: list[int] | tuple[int, ...]) -> int:
    """Hash of one full block, chained to the hash of the block before it."""
    return hash((prev_hash, tuple(token_ids))) & 0x7FFF_FFFF_FFFF_FFFF


class Block:
    """One KV block: its reference count and, when registered, the prefix it holds."""

    __slots__ = ("block_id", "hash", "prev_hash", "ref_count", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash = NO_HASH
        self.prev_hash = NO_HASH
        self.token_ids: tuple[int, ...] = ()

    def forget(self) -> None:
        self.hash = NO_HASH
        self.prev_hash = NO_HASH
        self.token_ids = ()


class BlockManager:
    """Owns block ids 0..num_blocks-1; sequences hold them through their block tables."""

    def __init__(
        self, num_blocks: int, block_size: int = 16, enable_prefix_caching: bool = True, first_block_id: int = 0
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.first_block_id = first_block_id  # ids first..first+num-1 (a second pool shares the id space)
        self.blocks = [Block(first_block_id + i) for i in range(num_blocks)]
        self.hash_to_block_id: dict[int, int] = {}
        self.free_block_ids: OrderedDict[int, None] = OrderedDict.fromkeys(
            range(first_block_id, first_block_id + num_blocks)
        )
        self.used_block_ids: set[int] = set()
        self._cached_free = 0  # free blocks that still hold a registered prefix
        self.prefix_queried_tokens = 0
        self.prefix_hit_tokens = 0

    # -- views ---------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def num_used_blocks(self) -> int:
        return len(self.used_block_ids)

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold a registered prefix (reusable until evicted)."""
        return self._cached_free

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- prefix matching -----------------------------------------------------------------
    def match_prefix(self, seq: Sequence) -> list[tuple[int, int]]:
        """(block_id, hash) of cached blocks equal to seq's leading full blocks.

        At most len(seq) - 1 tokens match: the last token is always computed to get logits.
        """
        if not self.enable_prefix_caching:
            return []
        hits: list[tuple[int, int]] = []
        prev = NO_HASH
        for i in range((len(seq) - 1) // self.block_size):
            tokens = tuple(seq.block_tokens(i, self.block_size))
            h = chain_hash(prev, tokens)
            block_id = self.hash_to_block_id.get(h)
            if block_id is None:
                break
            block = self.blocks[block_id - self.first_block_id]
            if block.token_ids != tokens or block.prev_hash != prev:
                break
            hits.append((block_id, h))
            prev = h
        return hits

    # -- allocation ----------------------------------------------------------------------
    def can_allocate(
        self,
        seq: Sequence,
        num_new_tokens: int,
        hits: list[tuple[int, int]] | None = None,
        reserve_blocks: int = 0,
    ) -> bool:
        """Whether seq (holding no blocks) can take its prefix hits plus num_new_tokens slots,
        leaving reserve_blocks free."""
        assert not seq.block_table, f"{seq.request_id} already holds blocks"
        hits = self.match_prefix(seq) if hits is None else hits
        revived = sum(1 for block_id, _ in hits if self.blocks[block_id - self.first_block_id].ref_count == 0)
        fresh = self.blocks_for(len(hits) * self.block_size + num_new_tokens) - len(hits)
        return fresh + revived + reserve_blocks <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_new_tokens: int, hits: list[tuple[int, int]] | None = None) -> None:
        """Give seq its cached prefix blocks and enough fresh blocks for num_new_tokens more."""
        assert self.can_allocate(seq, num_new_tokens, hits), f"cannot allocate for {seq.request_id}"
        hits = self.match_prefix(seq) if hits is None else hits
        for block_id, h in hits:
            block = self.blocks[block_id - self.first_block_id]
            if block.ref_count == 0:
                del self.free_block_ids[block_id]
                self._cached_free -= 1
                self.used_block_ids.add(block_id)
            block.ref_count += 1
            seq.block_table.append(block_id)
            seq.block_hashes.append(h)
        seq.num_cached_tokens = len(hits) * self.block_size
        seq.num_computed_tokens = seq.num_cached_tokens
        if self.enable_prefix_caching:
            self.prefix_queried_tokens += len(seq)
            self.prefix_hit_tokens += seq.num_cached_tokens
        self.may_append(seq, num_new_tokens)

    def _blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        resident = seq.num_computed_tokens - seq.num_evicted_tokens  # called per sequence per step: inlined
        return -(-(resident + num_new_tokens) // self.block_size) - len(seq.block_table)

    def can_append(self, seq: Sequence, num_new_tokens: int = 1) -> bool:
        """Whether seq can get slots for num_new_tokens beyond its computed tokens."""
        return self._blocks_needed(seq, num_new_tokens) <= len(self.free_block_ids)

    def may_append(self, seq: Sequence, num_new_tokens: int = 1) -> None:
        """Add fresh blocks to seq until num_new_tokens more slots fit."""
        needed = self._blocks_needed(seq, num_new_tokens)
        if needed <= 0:
            return
        assert needed <= len(self.free_block_ids), f"out of KV blocks for {seq.request_id}"
        for _ in range(needed):
            seq.block_table.append(self._take_free_block())

    def commit(self, seq: Sequence) -> None:
        """Register seq's newly computed full blocks in the prefix cache."""
        if not self.enable_prefix_caching or seq.num_evicted_tokens:
            return  # after eviction table index != logical block index; earlier blocks stay registered
        full = seq.num_computed_tokens // self.block_size
        if full <= len(seq.block_hashes):
            return
        for i in range(len(seq.block_hashes), full):
            tokens = tuple(seq.block_tokens(i, self.block_size))
            prev = seq.block_hashes[-1] if seq.block_hashes else NO_HASH
            h = chain_hash(prev, tokens)
            seq.block_hashes.append(h)
            if h in self.hash_to_block_id:
                continue  # another sequence computed the same prefix first; keep theirs
            block = self.blocks[seq.block_table[i] - self.first_block_id]
            if block.hash != NO_HASH:
                continue
            block.hash, block.prev_hash, block.token_ids = h, prev, tokens
            self.hash_to_block_id[h] = block.block_id

    def deallocate(self, seq: Sequence) -> None:
        """Drop seq's references; blocks nobody holds go to the free list, tail first."""
        for block_id in reversed(seq.block_table):
            self._unref(block_id)
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0
        seq.num_evicted_tokens = 0

    def release_blocks(self, seq: Sequence, table_indices: list[int]) -> None:
        """Drop seq's references to the blocks at these block-table indices (eviction)."""
        drop = set(table_indices)
        for i in sorted(drop, reverse=True):
            self._unref(seq.block_table[i])
        seq.block_table = [b for i, b in enumerate(seq.block_table) if i not in drop]

    def _unref(self, block_id: int) -> None:
        """Drop one reference; a block nobody holds goes to the free list (its prefix hash kept)."""
        block = self.blocks[block_id - self.first_block_id]
        assert block.ref_count > 0, f"double free of block {block_id}"
        block.ref_count -= 1
        if block.ref_count == 0:
            self.used_block_ids.remove(block_id)
            self.free_block_ids[block_id] = None
            self._cached_free += block.hash != NO_HASH

    def _take_free_block(self) -> int:
        block_id, _ = self.free_block_ids.popitem(last=False)
        block = self.blocks[block_id - self.first_block_id]
        if block.hash != NO_HASH:
            self._cached_free -= 1
            if self.hash_to_block_id.get(block.hash) == block_id:
                del self.hash_to_block_id[block.hash]
        block.forget()
        block.ref_count = 1
        self.used_block_ids.add(block_id)
        return block_id
