"""The fused path's repack buffer: weights stored as (q, scale, bias), multiplied by numba.

At a repacked tensor's address (N rows of K values, G values per group):

    q      int8 [N, K]        (4-bit types: uint8 [N, K/2], see below)
    scale  f32  [N, K/G]      (64-byte aligned after q)
    bias   f32  [N, K/G]      (only for types with an offset: Q4_1, Q5_1, Q2_K, Q4_K, Q5_K, and
                               the 4-bit types)

Every block type llama.cpp's CPU backend multiplies is written so at load (decompose.py), which
costs 8 bits a weight (plus 1-2 for the scales) instead of 5.5-8.5: the price of loops LLVM
vectorizes. The 4-bit types Q4_0, Q4_1 and Q4_K keep 4 bits: u = q - offset in [0, 15], two to
a byte (byte i of a 32-value group holds values i and i + 16), with the offset folded into the
bias (bias + offset*scale; exact in float32). Products: M < FUSED_MAX_ROWS rows of activations run the fused matvec; larger
micro-batches dequantize the weight once per call into the fastest GEMM dtype and use torch's
GEMM (the dequantize is ~1% of a 128-row product).
"""
from __future__ import annotations

import functools
import threading

import numpy as np
import torch

from ...tensor import Tensor, nbytes, round_up
from ...types import Type
from ..repack import RepackBuffer, RepackBufferType, is_whole_contiguous
from ...memory import byte_view
from .decompose import DECOMPOSE, HAS_BIAS, decompose, group_size
from .features import fastest_gemm_dtype
from .kernels import numba_kernels

ALIGN = 64
# below this many activation rows the fused matvec wins; from it on dequantize + GEMM does
FUSED_MAX_ROWS = 4
CONVERT_ROWS_VALUES = 1 << 22  # rows are decomposed this many values at a time at load


# 4-bit types stored two values to a byte, and the offset that makes their q unsigned
NIBBLE_OFFSET = {Type.Q4_0: -8, Type.Q4_1: 0, Type.Q4_K: 0}


def _has_bias(qtype) -> bool:
    return qtype in HAS_BIAS or qtype in NIBBLE_OFFSET


def supports_shape(qtype, ne) -> bool:
    ne = list(ne) + [1] * (4 - len(ne))
    return qtype in DECOMPOSE and ne[2] == 1 and ne[3] == 1 and ne[0] % group_size(qtype) == 0


def _layout(t: Tensor) -> tuple[int, int, int, int, int]:
    """(N, K, G, scale offset, bias offset, total bytes)."""
    k, n = t.ne[0], t.ne[1]
    g = group_size(t.type)
    scale_at = round_up(n * k // (2 if t.type in NIBBLE_OFFSET else 1), ALIGN)
    groups_bytes = n * (k // g) * 4
    bias_at = round_up(scale_at + groups_bytes, ALIGN)
    total = bias_at + (groups_bytes if _has_bias(t.type) else 0)
    return n, k, g, scale_at, bias_at, total


def packed_views(t: Tensor):
    """(q int8 [N, K] or nibbles uint8 [N, K/2], scale f32 [N, K/G], bias f32 [N, K/G] or None)
    at t's address."""
    n, k, g, scale_at, bias_at, total = _layout(t)
    raw = byte_view(t.buffer, t.data - t.buffer.base, total)
    q = raw[:n * k // 2].view(n, k // 2) if t.type in NIBBLE_OFFSET else raw[:n * k].view(torch.int8).view(n, k)
    scale = raw[scale_at:scale_at + n * (k // g) * 4].view(torch.float32).view(n, k // g)
    bias = raw[bias_at:total].view(torch.float32).view(n, k // g) if _has_bias(t.type) else None
    return q, scale, bias


class FusedBufferType(RepackBufferType):
    """CPU memory holding weights as (q, scale, bias) for the fused numba products."""

    def get_alloc_size(self, tensor: Tensor) -> int:
        return _layout(tensor)[5] if self.supports_tensor(tensor) else nbytes(tensor)

    def supports_weight(self, qtype, ne) -> bool:
        return supports_shape(qtype, ne)

    def supports_tensor(self, t: Tensor) -> bool:
        return is_whole_contiguous(t) and supports_shape(t.type, t.ne)

    def bind_product(self, t: Tensor):
        """fn(rows [R, K] float, out [R, N] f32): out = rows @ t^T."""
        q, scale, bias = packed_views(t)
        return functools.partial(_product, _Packed(t.type, q, scale, bias))


class FusedBuffer(RepackBuffer):
    def set_tensor(self, tensor: Tensor, data: torch.Tensor, offset: int, size: int) -> None:
        self.check_whole_write(tensor, offset, size, f"contiguous 2-D weights of types "
                                                     f"{', '.join(sorted(t.name for t in DECOMPOSE))}")
        q, scale, bias = packed_views(tensor)
        n, k = tensor.ne[1], tensor.ne[0]
        blocks = data[:size].reshape(n, -1).cpu()
        step = max(1, CONVERT_ROWS_VALUES // k)
        for r0 in range(0, n, step):  # chunks of rows bound the temporaries
            pq, ps, pb = decompose(tensor.type, blocks[r0:r0 + step], k)
            if tensor.type in NIBBLE_OFFSET:
                pq, pb = _as_nibbles(pq, ps, pb, NIBBLE_OFFSET[tensor.type])
            q[r0:r0 + step].copy_(pq)
            scale[r0:r0 + step].copy_(ps)
            if bias is not None:
                bias[r0:r0 + step].copy_(pb)


def _as_nibbles(q, scale, bias, offset: int):
    """q [rows, K] in [offset, offset + 15] -> (uint8 [rows, K/2], bias + offset*scale)."""
    u = (q.to(torch.int16) - offset).to(torch.uint8).view(q.shape[0], -1, 2, 16)
    packed = (u[:, :, 0] | (u[:, :, 1] << 4)).reshape(q.shape[0], -1)
    folded = offset * scale
    return packed, folded if bias is None else bias + folded


FusedBufferType.buffer_class = FusedBuffer


class _Packed:
    """A repacked weight's arrays as numpy (what numba takes), bound once."""

    def __init__(self, qtype, q, scale, bias):
        self.nibbles = qtype in NIBBLE_OFFSET
        self.n, self.k = q.shape[0], q.shape[1] * (2 if self.nibbles else 1)
        self.g = group_size(qtype)
        self.q, self.scale = q.numpy(), scale.numpy()
        self.has_bias = bias is not None
        self.bias = bias.numpy() if bias is not None else self.scale  # unread without a bias


_scratch = threading.local()

# the GEMM dtypes a weight dequantizes into, and the numpy dtype the kernels write them as
_KERNEL_DTYPES = {torch.float32: torch.float32, torch.bfloat16: torch.uint16}


def _scratch_buffer(n_values: int, dtype: torch.dtype) -> torch.Tensor:
    """A per-thread buffer of at least n_values of dtype (the dequantized micro-batch weight)."""
    bufs = getattr(_scratch, "bufs", None)
    if bufs is None:
        bufs = _scratch.bufs = {}
    buf = bufs.get(dtype)
    if buf is None or buf.numel() < n_values:
        buf = bufs[dtype] = torch.empty(n_values, dtype=dtype)
    return buf[:n_values]


def dequantized(p: _Packed, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weight as [N, K] of dtype (float32 or bfloat16, rounded to nearest even), in a
    per-thread scratch buffer."""
    w = _scratch_buffer(p.n * p.k, _KERNEL_DTYPES[dtype]).view(p.n, p.k)
    if p.nibbles:
        numba_kernels()[3](p.q, p.scale, p.bias, w.numpy())
    else:
        numba_kernels()[1](p.q, p.scale, p.bias, p.has_bias, w.numpy())
    return w.view(dtype)


def _product(p: _Packed, rows: torch.Tensor, out: torch.Tensor) -> None:
    m = rows.shape[0]
    if m >= FUSED_MAX_ROWS:
        dtype = fastest_gemm_dtype()
        w = dequantized(p, dtype)
        if dtype == torch.float32:
            torch.mm(rows.float(), w.T, out=out)
        else:
            out.copy_(torch.mm(rows.to(dtype), w.T))
        return
    matvec, _, matvec_nibbles, _, quantize_rows = numba_kernels()
    x = rows.float().contiguous().numpy()
    # activations rounded to int8 per group, as ggml's vec_dot_type (Q8_0) does
    xq = np.empty(x.shape, np.int8)
    xd = np.empty((m, p.k // p.g), np.float32)
    xsum = np.empty_like(xd)
    quantize_rows(x, p.g, xq, xd, xsum)
    target = out if out.is_contiguous() else torch.empty(out.shape, dtype=torch.float32)
    if p.nibbles:
        matvec_nibbles(p.q, p.scale, p.bias, xq, xd, xsum, target.numpy())
    else:
        matvec(p.q, p.scale, p.bias, p.has_bias, xq, xd, xsum, target.numpy())
    if target is not out:
        out.copy_(target)
