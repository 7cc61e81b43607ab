"""Which slice of the heads, columns and vocabulary each tensor-parallel rank holds (pure arithmetic).

KV heads follow vLLM: with at least as many KV heads as ranks they are split evenly; with fewer, each
rank holds one KV head, copied to `world // num_kv_heads` ranks (rank r holds head r // copies).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HeadShard:
    """The attention heads one rank holds: `num_heads` query heads from `q_start`, `num_kv_heads` KV
    heads from `kv_start` (global head indices)."""

    num_heads: int
    q_start: int
    num_kv_heads: int
    kv_start: int


def head_shard(num_heads: int, num_kv_heads: int, rank: int, world: int) -> HeadShard:
    """Rank `rank`'s heads; raises ValueError when the heads cannot be split over `world` ranks."""
    check_heads(num_heads, num_kv_heads, world)
    per_rank = num_heads // world
    if num_kv_heads >= world:
        kv = num_kv_heads // world
        return HeadShard(per_rank, rank * per_rank, kv, rank * kv)
    copies = world // num_kv_heads
    return HeadShard(per_rank, rank * per_rank, 1, rank // copies)


def check_heads(num_heads: int, num_kv_heads: int, world: int) -> None:
    if num_heads % world:
        raise ValueError(
            f"tensor_parallel_size={world} must divide num_attention_heads={num_heads}; "
            f"choose one of {divisors(num_heads)}"
        )
    if num_kv_heads % world and world % num_kv_heads:
        raise ValueError(
            f"tensor_parallel_size={world} and num_key_value_heads={num_kv_heads}: one must divide the other "
            "(KV heads are split over ranks, or copied when there are fewer of them than ranks)"
        )


def kv_heads_per_rank(num_kv_heads: int, world: int) -> int:
    """KV heads each rank caches: a share, or one copied head when there are fewer heads than ranks."""
    return max(1, num_kv_heads // world)


def even_split(size: int, rank: int, world: int) -> tuple[int, int]:
    """(start, length) of rank's share of `size` rows split evenly (size % world == 0)."""
    if size % world:
        raise ValueError(f"{size} does not split over {world} tensor-parallel ranks")
    length = size // world
    return rank * length, length


def vocab_split(vocab: int, rank: int, world: int) -> tuple[int, int, int]:
    """(start, length, padded length): each rank holds ceil(vocab / world) rows (the last may hold fewer
    real ones, zero-padded), so gathered logits have equal parts."""
    padded = -(-vocab // world)
    start = min(vocab, rank * padded)
    return start, min(vocab, start + padded) - start, padded


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
