"""The 32-value block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1.

Each function maps blocks [n, type_size] uint8 <-> values [n, 32] float32, evaluating in
the same float32 order as gguf.quants (so results are bit for bit the same; products are
commutative, so `q.mul_(d)` in place equals gguf's `d * q`).
"""
from __future__ import annotations

import torch

from ..types import Type
from ._c_order import first_min_max, signed_amax
from ._fields import (as_f16, div, f16_bytes, inverse_or_zero, pack_bits, pack_nibbles,
                      round_half_away, split_bytes, unpack)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """qs [n, 16] -> the 32 4-bit values, low nibbles first."""
    return unpack(qs, (0, 4), 0xF).reshape(qs.shape[0], 32)


def _fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """qh [n, 4] (a little-endian uint32) -> bit j for j in 0..31."""
    return unpack(qh, range(8), 1).transpose(1, 2).reshape(qh.shape[0], 32)


def dequantize_q4_0(blocks):
    d, qs = split_bytes(blocks, 2)
    return (_nibbles(qs).to(torch.int8) - 8).float().mul_(as_f16(d))


def dequantize_q4_1(blocks):
    d, m, qs = split_bytes(blocks, 2, 2)
    return _nibbles(qs).float().mul_(as_f16(d)).add_(as_f16(m))


def dequantize_q5_0(blocks):
    d, qh, qs = split_bytes(blocks, 2, 4)
    q = _nibbles(qs) | (_fifth_bits(qh) << 4)
    return (q.to(torch.int8) - 16).float().mul_(as_f16(d))


def dequantize_q5_1(blocks):
    d, m, qh, qs = split_bytes(blocks, 2, 2, 4)
    q = _nibbles(qs) | (_fifth_bits(qh) << 4)
    return q.float().mul_(as_f16(d)).add_(as_f16(m))


def dequantize_q8_0(blocks):
    d, qs = split_bytes(blocks, 2)
    return qs.view(torch.int8).float().mul_(as_f16(d))


def dequantize_q8_1(blocks):
    # d, s (= d * sum(qs), used only by dot products), qs
    d, _s, qs = split_bytes(blocks, 2, 2)
    return qs.view(torch.int8).float().mul_(as_f16(d))


def _truncate(x: torch.Tensor, top: int) -> torch.Tensor:
    """ggml's MIN(top, (int)x) for the non-negative x of these formats."""
    return torch.trunc(x).to(torch.uint8).clamp_(max=top)


def _signed_max(x: torch.Tensor) -> torch.Tensor:
    """The value of largest magnitude per block [n, 1], as C scans for it (0.0 for a block of
    zeros, -0.0 included, where gguf's argmax would return the -0.0)."""
    return signed_amax(x)[0].unsqueeze(-1)


def quantize_q4_0(x):
    d = div(_signed_max(x), -8)
    q = _truncate(x * inverse_or_zero(d) + 8.5, 15)
    return torch.cat([f16_bytes(d), pack_nibbles(q)], dim=-1)


def quantize_q4_1(x):
    lo, hi = first_min_max(x)
    d = div(hi - lo, 15)
    q = _truncate((x - lo) * inverse_or_zero(d) + 0.5, 15)
    return torch.cat([f16_bytes(d), f16_bytes(lo), pack_nibbles(q)], dim=-1)


def quantize_q5_0(x):
    d = div(_signed_max(x), -16)
    q = _truncate(x * inverse_or_zero(d) + 16.5, 31)
    return torch.cat([f16_bytes(d), pack_bits(q >> 4), pack_nibbles(q & 0xF)], dim=-1)


def quantize_q5_1(x):
    lo, hi = first_min_max(x)
    d = div(hi - lo, 31)
    q = _truncate((x - lo) * inverse_or_zero(d) + 0.5, 31)
    return torch.cat([f16_bytes(d), f16_bytes(lo), pack_bits(q >> 4), pack_nibbles(q & 0xF)], dim=-1)


def _q8_scale_and_values(x):
    d = div(x.abs().amax(dim=-1, keepdim=True), 127)
    q = round_half_away(x * inverse_or_zero(d)).to(torch.int8)
    return d, q


def quantize_q8_0(x):
    d, q = _q8_scale_and_values(x)
    return torch.cat([f16_bytes(d), q.view(torch.uint8)], dim=-1)


def quantize_q8_1(x):
    # ggml (quantize_row_q8_1_ref): s = fp16(float(sum of the int8 values) * d)
    d, q = _q8_scale_and_values(x)
    s = q.int().sum(dim=-1, keepdim=True).float() * d
    return torch.cat([f16_bytes(d), f16_bytes(s), q.view(torch.uint8)], dim=-1)


DEQUANTIZE = {
    Type.Q4_0: dequantize_q4_0,
    Type.Q4_1: dequantize_q4_1,
    Type.Q5_0: dequantize_q5_0,
    Type.Q5_1: dequantize_q5_1,
    Type.Q8_0: dequantize_q8_0,
    Type.Q8_1: dequantize_q8_1,
}

QUANTIZE = {
    Type.Q4_0: quantize_q4_0,
    Type.Q4_1: quantize_q4_1,
    Type.Q5_0: quantize_q5_0,
    Type.Q5_1: quantize_q5_1,
    Type.Q8_0: quantize_q8_0,
    Type.Q8_1: quantize_q8_1,
}
