"""Tensor parallelism: this process's rank and group (state.py), the collectives the layers call, and
the slice of a weight each rank holds (shard.py). docs/dev/tensor-parallel.md explains the design."""
