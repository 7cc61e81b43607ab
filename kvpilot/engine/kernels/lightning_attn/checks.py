"""Contract checks shared by the lightning-attention launchers (decode and prefill)."""

from __future__ import annotations

import torch


def check_qkv_state(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slopes: torch.Tensor, state_pool: torch.Tensor, rows: str
) -> tuple[int, int, int]:
    """Return (num_heads, dk, dv) after checking q, k [rows, H, Dk], v [rows, H, Dv], the fp32 state
    pool [slots, H, Dk, Dv] and the fp32 slopes [H]; `rows` names the first dim in messages (B or T)."""
    assert q.dim() == 3 and q.shape == k.shape, (
        f"q, k must be [{rows}, H, Dk], got {tuple(q.shape)}, {tuple(k.shape)}"
    )
    assert v.dim() == 3 and v.shape[:2] == q.shape[:2], f"v must be [{rows}, H, Dv], got {tuple(v.shape)}"
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1, "last dims must be contiguous"
    _, num_heads, dk = q.shape
    dv = v.shape[2]
    assert state_pool.dim() == 4 and state_pool.shape[1:] == (num_heads, dk, dv), (
        f"state_pool must be [num_slots, {num_heads}, {dk}, {dv}], got {tuple(state_pool.shape)}"
    )
    assert state_pool.dtype == torch.float32 and state_pool.is_contiguous(), "state_pool must be contiguous fp32"
    assert slopes.shape == (num_heads,) and slopes.dtype == torch.float32, "slopes must be fp32 [H]"
    return num_heads, dk, dv
