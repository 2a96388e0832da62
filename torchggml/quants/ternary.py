"""The ternary formats TQ1_0 and TQ2_0: 256 values in {-1, 0, 1} times one fp16 scale.

TQ1_0 packs 5 ternary digits per byte as a fixed-point fraction (byte = ceil(n * 256/243)),
so digit k is recovered as ((byte * 3^k mod 256) * 3) >> 8; TQ2_0 packs 2 bits per value.
"""
from __future__ import annotations

import torch

from ..types import Type
from ._fields import as_f16, f16_bytes, inverse_or_zero, round_half_away, split_bytes, unpack

_POW3 = (1, 3, 9, 27, 81)


def _base3_digits(packed: torch.Tensor, n_digits: int) -> torch.Tensor:
    """bytes [n, k] -> digits [n, n_digits, k] in {0, 1, 2}, most significant first."""
    packed = packed.int()
    shifted = torch.stack([(packed * p) & 0xFF for p in _POW3[:n_digits]], dim=-2)
    return (shifted * 3) >> 8


def dequantize_tq1_0(blocks):
    qs, qh, d = split_bytes(blocks, 48, 4)
    n = blocks.shape[0]
    q = torch.cat([_base3_digits(qs[:, :32], 5).reshape(n, 160),
                   _base3_digits(qs[:, 32:], 5).reshape(n, 80),
                   _base3_digits(qh, 4).reshape(n, 16)], dim=-1)
    return as_f16(d) * (q - 1).float()


def dequantize_tq2_0(blocks):
    qs, d = split_bytes(blocks, 64)
    n = blocks.shape[0]
    q = unpack(qs.reshape(n, 2, 32), (0, 2, 4, 6), 3).reshape(n, 256)
    return as_f16(d) * (q.float() - 1)


def _ternary(x):
    """Per block: d = max |x| and the digits round(x / d) + 1 in {0, 1, 2}."""
    d = x.abs().amax(dim=-1, keepdim=True)
    q = round_half_away(x * inverse_or_zero(d)).to(torch.int32) + 1
    return d, q


def _pack_base3(q: torch.Tensor, n_digits: int) -> torch.Tensor:
    """digits [n, n_digits, k] -> bytes [n, k]: ceil(value * 256 / 243)."""
    weights = _POW3[::-1][:n_digits]  # 81, 27, 9, 3(, 1)
    value = sum(q[:, i] * w for i, w in enumerate(weights))
    return ((value * 256 + 242) // 243).to(torch.uint8)


def quantize_tq1_0(x):
    d, q = _ternary(x)
    n = x.shape[0]
    packed = torch.cat([_pack_base3(q[:, :160].reshape(n, 5, 32), 5),
                        _pack_base3(q[:, 160:240].reshape(n, 5, 16), 5),
                        _pack_base3(q[:, 240:].reshape(n, 4, 4), 4)], dim=-1)
    return torch.cat([packed, f16_bytes(d)], dim=-1)


def quantize_tq2_0(x):
    d, q = _ternary(x)
    q = q.reshape(x.shape[0], 2, 4, 32)
    packed = q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)
    return torch.cat([packed.reshape(x.shape[0], 64).to(torch.uint8), f16_bytes(d)], dim=-1)


DEQUANTIZE = {Type.TQ1_0: dequantize_tq1_0, Type.TQ2_0: dequantize_tq2_0}
QUANTIZE = {Type.TQ1_0: quantize_tq1_0, Type.TQ2_0: quantize_tq2_0}
