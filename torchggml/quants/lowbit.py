"""The 1- and 2-bit formats Q1_0 and Q2_0: one fp16 scale d per block.

Q1_0: 128 values, one bit each (bit j % 8 of byte j // 8): 1 -> +d, 0 -> -d; d = mean |x|.
Q2_0: 64 values, two bits each (bits 2(j % 4) of byte j // 4): q -> (q - 1) d for q in 0..3;
d = max |x| and q = round(x / d) + 1 clamped to [0, 3].
"""
from __future__ import annotations

import torch

from ..types import Type
from ._fields import as_f16, f16_bytes, inverse_or_zero, pack_bits, pack_runs, round_half_away, split_bytes, unpack


def dequantize_q1_0(blocks):
    d, qs = split_bytes(blocks, 2)
    bit = unpack(qs, range(8), 1).transpose(-1, -2).reshape(blocks.shape[0], 128)
    d = as_f16(d)
    return torch.where(bit == 1, d, -d)


def dequantize_q2_0(blocks):
    d, qs = split_bytes(blocks, 2)
    q = unpack(qs, (0, 2, 4, 6), 3).transpose(-1, -2).reshape(blocks.shape[0], 64)
    return (q.int() - 1).float() * as_f16(d)


def quantize_q1_0(x):
    # ggml sums |x| left to right in float32; the same order gives the same scale bits
    total = torch.zeros(x.shape[0], 1, dtype=torch.float32, device=x.device)
    for j in range(x.shape[1]):
        total = total + x[:, j:j + 1].abs()
    d = total / torch.tensor(128.0, device=x.device)
    bits = (x >= 0).to(torch.uint8)
    return torch.cat([f16_bytes(d), pack_bits(bits)], dim=-1)


def quantize_q2_0(x):
    d = x.abs().amax(dim=-1, keepdim=True)
    q = (round_half_away(x * inverse_or_zero(d)) + 1).clamp(0, 3)
    # four 2-bit values per byte, element j at bits 2(j % 4) of byte j // 4
    packed = pack_runs(q.reshape(x.shape[0], 16, 4).transpose(1, 2).reshape(x.shape[0], 1, 4, 16), 2)
    return torch.cat([f16_bytes(d), packed], dim=-1)


DEQUANTIZE = {Type.Q1_0: dequantize_q1_0, Type.Q2_0: dequantize_q2_0}
QUANTIZE = {Type.Q1_0: quantize_q1_0, Type.Q2_0: quantize_q2_0}
