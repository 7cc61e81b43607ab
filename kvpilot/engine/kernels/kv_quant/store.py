"""Quantising store: key/value rows [N, Hkv, D] into int8 or fp8 paged caches (slot -1 skipped)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvpilot.engine.kernels.dispatch import check_triton_device
from kvpilot.engine.kernels.interpreter_compat import patch_interpreter
from kvpilot.engine.kernels.kv_quant.layout import check_cache_layout, check_scale_layout
from kvpilot.engine.kernels.kv_quant.reference import FP8_MAX, INT8_MAX, INV_INT8_MAX, mode_of
from kvpilot.engine.kernels.specialization import step_kernel

patch_interpreter()


INT8_MAX_C: tl.constexpr = tl.constexpr(INT8_MAX)
INV_INT8_MAX_C: tl.constexpr = tl.constexpr(INV_INT8_MAX)
FP8_MAX_C: tl.constexpr = tl.constexpr(FP8_MAX)


@triton.jit
def _rint(y):
    """Round half to even, as torch.round does."""
    r = tl.floor(y + 0.5)
    tie = (r - y) == 0.5
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
    return tl.where(tie & odd, r - 1.0, r)


@triton.jit
def _pow2(e):
    """2**e for integral fp32 e in the normal range, built from the exponent bits (exact; exp2 is approximate)."""
    return ((e.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _round_to_e4m3(y):
    """Round fp32 to the nearest e4m3 value (ties to even, saturating) while still in fp32.

    The final cast then only meets exactly representable values, so it is exact on every backend
    (the Triton interpreter's own fp32->fp8 cast truncates and loses mantissa carries).
    """
    a = tl.minimum(tl.abs(y), FP8_MAX_C)
    e = tl.minimum(tl.maximum(tl.floor(tl.log2(tl.maximum(a, 1e-30))), -6.0), 8.0)
    # scaling by exact powers of two keeps both products exact
    r = tl.minimum(_rint(a * _pow2(3.0 - e)) * _pow2(e - 3.0), FP8_MAX_C)
    return tl.where(y < 0, -r, r)


@triton.jit
def _quantize_row(x, scale_ptr, scale_off, head, IS_INT8: tl.constexpr, OUT_DTYPE: tl.constexpr):
    if IS_INT8:
        # scale = amax * (1/127) and an IEEE division (div_rn) below, exactly as the torch reference
        # computes them on CPU and GPU (`/` in a Triton kernel is approximate on the GPU)
        scale = tl.maximum(tl.max(tl.abs(x), axis=0) * INV_INT8_MAX_C, 1e-8)
        y = _rint(tl.div_rn(x, tl.broadcast_to(scale, x.shape)))
        y = tl.minimum(tl.maximum(y, -INT8_MAX_C), INT8_MAX_C)
        tl.store(scale_ptr + scale_off, scale.to(scale_ptr.dtype.element_ty))
    else:
        scale = tl.load(scale_ptr + head)
        y = _round_to_e4m3(tl.div_rn(x, tl.broadcast_to(scale, x.shape)))
    return y.to(OUT_DTYPE)


@step_kernel
def _store_kvcache_quant_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, slot_ptr,
    stride_kn, stride_kh, stride_vn, stride_vh,
    stride_cb, stride_ct, stride_ch, stride_db, stride_dt, stride_dh, stride_dd, stride_sb, stride_st, stride_sh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr, IS_INT8: tl.constexpr,
):
    # K cache strides (c*: block, token, head; dim contiguous), V cache strides (d*: any layout of
    # kv_quant.layout), int8 scale-cache strides (s*).
    token = tl.program_id(0)
    head = tl.program_id(1)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // PAGE
    in_block = slot % PAGE
    offs = tl.arange(0, BLOCK_D)
    mask = offs < HEAD_DIM
    s_off = block * stride_sb + in_block * stride_st + head * stride_sh
    k = tl.load(key_ptr + token * stride_kn + head * stride_kh + offs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(value_ptr + token * stride_vn + head * stride_vh + offs, mask=mask, other=0.0).to(tl.float32)
    kq = _quantize_row(k, k_scale_ptr, s_off, head, IS_INT8, k_cache_ptr.dtype.element_ty)
    vq = _quantize_row(v, v_scale_ptr, s_off, head, IS_INT8, v_cache_ptr.dtype.element_ty)
    tl.store(k_cache_ptr + block * stride_cb + in_block * stride_ct + head * stride_ch + offs, kq, mask=mask)
    v_base = block * stride_db + in_block * stride_dt + head * stride_dh
    tl.store(v_cache_ptr + v_base + offs * stride_dd, vq, mask=mask)


def store_kvcache_quant_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Quantise key/value [N, Hkv, D] into the 8-bit caches; int8 writes the scale caches, fp8 reads [Hkv]."""
    check_triton_device(key, value, k_cache, v_cache, k_scale, v_scale, slot_mapping)
    mode = mode_of(k_cache)
    assert v_cache.dtype == k_cache.dtype, f"k/v cache dtypes differ: {k_cache.dtype} vs {v_cache.dtype}"
    assert key.dim() == 3 and key.shape == value.shape, f"key/value must be [N, Hkv, D], got {key.shape}, {value.shape}"
    num_tokens, num_kv_heads, head_dim = key.shape
    assert k_cache.dim() == 4 and k_cache.shape[2:] == (num_kv_heads, head_dim), (
        f"cache must be [num_blocks, block_size, {num_kv_heads}, {head_dim}], got {tuple(k_cache.shape)}"
    )
    assert k_cache.shape == v_cache.shape and k_cache.is_contiguous(), "k_cache must be contiguous, v_cache its shape"
    check_cache_layout(v_cache, "v_cache")
    assert key.stride(-1) == 1 and value.stride(-1) == 1, "key/value last dim must be contiguous"
    assert slot_mapping.shape == (num_tokens,) and slot_mapping.dtype == torch.int32, "slot_mapping int32 [N]"
    if mode == "int8":
        assert k_scale.shape == k_cache.shape[:3] and v_scale.shape == v_cache.shape[:3], (
            f"int8 scale caches must be {tuple(k_cache.shape[:3])}, got {tuple(k_scale.shape)}"
        )
        assert k_scale.dtype in (torch.float32, torch.float16), f"int8 scales must be fp32/fp16, got {k_scale.dtype}"
        assert v_scale.stride() == k_scale.stride(), "k/v scale caches must share a layout"
        check_scale_layout(k_scale, "k_scale")
    else:
        assert k_scale.shape == (num_kv_heads,) and v_scale.shape == (num_kv_heads,), "fp8 scales must be [Hkv]"
        assert k_scale.dtype == torch.float32 and v_scale.dtype == torch.float32, "fp8 scales must be fp32"
    if num_tokens == 0:
        return
    _store_kvcache_quant_kernel[(num_tokens, num_kv_heads)](
        key, value, k_cache, v_cache, k_scale, v_scale, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        *k_cache.stride()[:3], *v_cache.stride(), *(k_scale.stride() if mode == "int8" else (0, 0, 0)),
        HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim), PAGE=k_cache.shape[1],
        IS_INT8=mode == "int8",
    )
