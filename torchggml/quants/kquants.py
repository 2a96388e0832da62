"""The 256-value "K" super-block formats: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K.

Dequantization follows gguf.quants' float32 evaluation order exactly: the sub-block scale
is formed first (d * scale), then applied to the quant (and the min subtracted). Products
commute bit for bit, so the quants are scaled in place (`q.mul_(dl)`) to save a pass.
"""
from __future__ import annotations

import torch

from ..types import Type
from ._fields import as_f16, as_f32, signed_absmax, split_bytes, unpack


def _two_bit_planes(qs: torch.Tensor, n_sub: int) -> torch.Tensor:
    """qs [n, 32*k] -> 2-bit values [n, n_sub, 256/n_sub]: each 32-byte chunk gives 4 runs of
    32 values (bits 0-1, 2-3, 4-5, 6-7)."""
    n = qs.shape[0]
    return unpack(qs.reshape(n, -1, 32), (0, 2, 4, 6), 3).reshape(n, n_sub, -1)


def _nibble_runs(qs: torch.Tensor, n_sub: int) -> torch.Tensor:
    """qs [n, 32*k] -> 4-bit values [n, n_sub, ...]: each 32-byte chunk gives 32 low nibbles
    then 32 high nibbles."""
    n = qs.shape[0]
    return unpack(qs.reshape(n, -1, 32), (0, 4), 0xF).reshape(n, n_sub, -1)


def _bit_planes(hmask: torch.Tensor, n_sub: int) -> torch.Tensor:
    """hmask [n, 32] -> bits [n, n_sub, ...]: bit b of every byte gives values 32b .. 32b+31."""
    n = hmask.shape[0]
    return unpack(hmask, range(8), 1).reshape(n, n_sub, -1)


def dequantize_q2_k(blocks):
    scales, qs, d, dmin = split_bytes(blocks, 16, 64, 2)
    n = blocks.shape[0]
    dl = (as_f16(d) * (scales & 0xF).float()).reshape(n, 16, 1)
    ml = (as_f16(dmin) * (scales >> 4).float()).reshape(n, 16, 1)
    return _two_bit_planes(qs, 16).float().mul_(dl).sub_(ml).reshape(n, 256)


def _q3_k_scales(scales: torch.Tensor) -> torch.Tensor:
    """12 bytes -> 16 signed 6-bit scales: low 4 bits from bytes 0-7 (low then high
    nibbles), high 2 bits from bytes 8-11 (bit pairs 0-1, 2-3, 4-5, 6-7)."""
    n = scales.shape[0]
    low = unpack(scales[:, :8], (0, 4), 0xF).reshape(n, 16)
    high = unpack(scales[:, 8:], (0, 2, 4, 6), 3).reshape(n, 16)
    return (low | (high << 4)).float() - 32


def dequantize_q3_k(blocks):
    hmask, qs, scales, d = split_bytes(blocks, 32, 64, 12)
    n = blocks.shape[0]
    dl = (as_f16(d) * _q3_k_scales(scales)).reshape(n, 16, 1)
    low = _two_bit_planes(qs, 16)
    high_clear = _bit_planes(hmask, 16) ^ 1  # the value is offset by -4 when the bit is 0
    q = low.to(torch.int8) - (high_clear << 2).to(torch.int8)
    return q.float().mul_(dl).reshape(n, 256)


def k_scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 scale bytes -> 8 6-bit scales and 8 6-bit mins.

    Bytes 0-3 hold scales 0-3 (and the top bits of scales 4-7), bytes 4-7 mins 0-3 (and the
    top bits of mins 4-7), bytes 8-11 the low nibbles of scales/mins 4-7.
    """
    sc_lo, m_lo, both = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat([sc_lo & 0x3F, (both & 0xF) | ((sc_lo >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m_lo & 0x3F, (both >> 4) | ((m_lo >> 2) & 0x30)], dim=-1)
    return sc, mn


def _scaled_with_min(d, dmin, scales):
    n = d.shape[0]
    sc, mn = k_scale_min(scales)
    return ((as_f16(d) * sc.float()).reshape(n, 8, 1),
            (as_f16(dmin) * mn.float()).reshape(n, 8, 1))


def dequantize_q4_k(blocks):
    d, dmin, scales, qs = split_bytes(blocks, 2, 2, 12)
    dl, ml = _scaled_with_min(d, dmin, scales)
    return _nibble_runs(qs, 8).float().mul_(dl).sub_(ml).reshape(blocks.shape[0], 256)


def dequantize_q5_k(blocks):
    d, dmin, scales, qh, qs = split_bytes(blocks, 2, 2, 12, 32)
    dl, ml = _scaled_with_min(d, dmin, scales)
    q = _nibble_runs(qs, 8) | (_bit_planes(qh, 8) << 4)
    return q.float().mul_(dl).sub_(ml).reshape(blocks.shape[0], 256)


def dequantize_q6_k(blocks):
    ql, qh, scales, d = split_bytes(blocks, 128, 64, 16)
    n = blocks.shape[0]
    dl = (as_f16(d) * scales.view(torch.int8).float()).reshape(n, 16, 1)
    # per 128 values: 64 bytes of low nibbles (low, then high) and 32 bytes of 2-bit highs
    low = unpack(ql.reshape(n, 2, 64), (0, 4), 0xF).reshape(n, 8, 32)
    high = unpack(qh.reshape(n, 2, 32), (0, 2, 4, 6), 3).reshape(n, 8, 32)
    q = ((low | (high << 4)).to(torch.int8) - 32).float().reshape(n, 16, 16)
    return q.mul_(dl).reshape(n, 256)


def dequantize_q8_k(blocks):
    # float32 d, int8 qs[256], int16 bsums[16] (sums of 16 values, used only by dot products)
    d, qs, _bsums = split_bytes(blocks, 4, 256)
    return qs.view(torch.int8).float().mul_(as_f32(d))


def _nearest_int(x: torch.Tensor) -> torch.Tensor:
    """ggml's nearest_int: round to nearest, ties to even (the fp32 magic-number trick)."""
    return torch.round(x).int()


def quantize_q8_k(x):
    """ggml's quantize_row_q8_K_ref: iscale = -127/max (max: the signed value of largest
    magnitude), q = min(127, nearest_int(iscale*x)), d = 1/iscale; all-zero blocks give d=0."""
    n = x.shape[0]
    signed_max = signed_absmax(x)
    zero = signed_max == 0
    iscale = x.new_full((), -127.0) / torch.where(zero, torch.ones_like(signed_max), signed_max)
    q = _nearest_int(iscale * x).clamp_(max=127)
    q = torch.where(zero, torch.zeros_like(q), q).to(torch.int8)
    d = torch.where(zero, torch.zeros_like(iscale), torch.reciprocal(iscale))
    bsums = q.reshape(n, 16, 16).sum(dim=-1, dtype=torch.int32).to(torch.int16)
    return torch.cat([d.contiguous().view(torch.uint8), q.view(torch.uint8),
                      bsums.contiguous().view(torch.uint8)], dim=-1)


DEQUANTIZE = {
    Type.Q2_K: dequantize_q2_k,
    Type.Q3_K: dequantize_q3_k,
    Type.Q4_K: dequantize_q4_k,
    Type.Q5_K: dequantize_q5_k,
    Type.Q6_K: dequantize_q6_k,
    Type.Q8_K: dequantize_q8_k,
}

QUANTIZE = {
    Type.Q8_K: quantize_q8_k,
}
