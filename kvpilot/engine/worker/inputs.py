"""The step's inputs on the host and their way to the device: block-table mirror and staging buffers."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

_TORCH_INTS = {np.int32: torch.int32, np.int64: torch.int64}


class BlockTableRows:
    """Host mirror of the sequences' block tables: one -1 padded int32 row per request, kept by appends.

    Rebuilding [batch, blocks] tables from Python lists every step costs O(total blocks); here a
    decode step writes only the blocks a sequence gained since the last step. `Sequence.block_table`
    is append-only: code that drops or reorders entries assigns a new list (eviction, deallocate),
    which this mirror detects by identity and rewrites the row.
    """

    def __init__(self, rows: int = 8, width: int = 64) -> None:
        self.table = np.full((rows, width), -1, dtype=np.int32)
        self._entries: dict[str, list[Any]] = {}  # request id -> [row, the mirrored list, entries written]
        self._free = list(range(rows - 1, -1, -1))

    def row(self, request_id: str, block_table: list[int]) -> int:
        """The request's row, updated to block_table."""
        entry = self._entries.get(request_id)
        if entry is None:
            if not self._free:
                self._grow(rows=2 * self.table.shape[0])
            entry = self._entries[request_id] = [self._free.pop(), None, 0]
        row, mirrored, written = entry
        n = len(block_table)
        if mirrored is not block_table or n < written:  # a new list: rewrite the row
            if n < written:
                self.table[row, n:written] = -1
            written = 0
        if n > written:
            if n > self.table.shape[1]:
                self._grow(width=max(n, 2 * self.table.shape[1]))
            self.table[row, written:n] = block_table[written:n]
        entry[1], entry[2] = block_table, n
        return row

    def release(self, request_id: str) -> None:
        entry = self._entries.pop(request_id, None)
        if entry is not None:
            self.table[entry[0], : entry[2]] = -1
            self._free.append(entry[0])

    def _grow(self, rows: int | None = None, width: int | None = None) -> None:
        old = self.table
        rows, width = rows or old.shape[0], width or old.shape[1]
        self.table = np.full((rows, -(-width // 64) * 64), -1, dtype=np.int32)
        self.table[: old.shape[0], : old.shape[1]] = old
        self._free = list(range(rows - 1, old.shape[0] - 1, -1)) + self._free


class InputStager:
    """Moves a step's host arrays to the device as one tensor per dtype.

    On CUDA (`staged`) the arrays are packed into a reused pinned buffer and copied without blocking;
    a buffer is rewritten only once the copies queued out of it are done (normally they are: the
    last step's sampled tokens came back to the host after them). Use `with stager:` around packs.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.staged = device.type == "cuda"  # a test turns it on for a CPU (unpinned buffers then)
        self._buffers: dict[type, torch.Tensor] = {}
        self._copied: torch.cuda.Event | None = None

    def __enter__(self) -> InputStager:
        if self._copied is not None:
            self._copied.synchronize()
            self._copied = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            self._copied = torch.cuda.Event()
            self._copied.record()

    def pack(self, parts: list[np.ndarray], dtype: type) -> torch.Tensor:
        """parts back to back, cast to dtype, as one 1-d tensor on the device."""
        total = sum(p.size for p in parts)
        if not self.staged:
            return torch.from_numpy(np.concatenate(parts).astype(dtype, copy=False))
        buffer = self._buffers.get(dtype)
        if buffer is None or buffer.numel() < total:
            size = max(total, 2 * buffer.numel() if buffer is not None else 1 << 16)
            buffer = torch.empty(size, dtype=_TORCH_INTS[dtype], pin_memory=self.device.type == "cuda")
            self._buffers[dtype] = buffer
        np.concatenate(parts, out=buffer.numpy()[:total], casting="unsafe")
        return buffer[:total].to(self.device, non_blocking=True)

    @staticmethod
    def split(flat: torch.Tensor, shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
        """Views of flat, one per shape, back to back."""
        out, at = [], 0
        for shape in shapes:
            size = math.prod(shape)
            out.append(flat[at : at + size].view(shape))
            at += size
        return out
