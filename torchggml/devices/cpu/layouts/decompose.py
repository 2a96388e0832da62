"""ggml blocks -> (q, scale, bias): every block type as small integers and float group scales.

Each supported type's weights are, exactly as its dequantize computes them,

    W[n, g*G + i] = q[n, g*G + i] * scale[n, g] + bias[n, g]        (float32)

with q an integer in int8 range and G (the group) 32, or 16 for the types whose sub-blocks
have 16 values (Q2_K, Q3_K, Q6_K). bias is None where the type has no offset. This is the
repacked layout the fused CPU products read (layouts/fused.py); the tests check q*scale+bias
against `quants.dequantize` for every type.
"""
from __future__ import annotations

import torch

from ....quants._fields import as_f16, as_u16, split_bytes, unpack
from ....quants.kquants import bit_planes, nibble_runs, q3_k_scales, two_bit_planes, k_scale_min
from ....quants.mxfp4 import e8m0_to_fp32_half
from ....quants.tables import IQ4NL_VALUES, MXFP4_VALUES
from ....types import Type


def _nibbles32(qs):
    """qs [n, 16] -> 32 values: byte j holds value j (low nibble) and j + 16 (high)."""
    return unpack(qs, (0, 4), 0xF).reshape(qs.shape[0], 32)


def _fifth_bits(qh):
    return unpack(qh, range(8), 1).transpose(1, 2).reshape(qh.shape[0], 32)


def _lookup(values, index):
    return torch.tensor(values, dtype=torch.int8)[index.long()]


def _q4_0(b):
    d, qs = split_bytes(b, 2)
    return _nibbles32(qs).to(torch.int8) - 8, as_f16(d), None


def _q4_1(b):
    d, m, qs = split_bytes(b, 2, 2)
    return _nibbles32(qs).to(torch.int8), as_f16(d), as_f16(m)


def _q5_0(b):
    d, qh, qs = split_bytes(b, 2, 4)
    return (_nibbles32(qs) | (_fifth_bits(qh) << 4)).to(torch.int8) - 16, as_f16(d), None


def _q5_1(b):
    d, m, qh, qs = split_bytes(b, 2, 2, 4)
    return (_nibbles32(qs) | (_fifth_bits(qh) << 4)).to(torch.int8), as_f16(d), as_f16(m)


def _q8_0(b):
    d, qs = split_bytes(b, 2)
    return qs.view(torch.int8), as_f16(d), None


def _q2_k(b):
    scales, qs, d, dmin = split_bytes(b, 16, 64, 2)
    return (two_bit_planes(qs, 16).to(torch.int8), as_f16(d) * (scales & 0xF).float(),
            -(as_f16(dmin) * (scales >> 4).float()))


def _q3_k(b):
    hmask, qs, scales, d = split_bytes(b, 32, 64, 12)
    high_clear = bit_planes(hmask, 16) ^ 1  # the value is offset by -4 when the bit is 0
    q = two_bit_planes(qs, 16).to(torch.int8) - (high_clear << 2).to(torch.int8)
    return q, as_f16(d) * q3_k_scales(scales), None


def _k_scale_min(d, dmin, scales):
    sc, mn = k_scale_min(scales)
    return as_f16(d) * sc.float(), -(as_f16(dmin) * mn.float())


def _q4_k(b):
    d, dmin, scales, qs = split_bytes(b, 2, 2, 12)
    return (nibble_runs(qs, 8).to(torch.int8), *_k_scale_min(d, dmin, scales))


def _q5_k(b):
    d, dmin, scales, qh, qs = split_bytes(b, 2, 2, 12, 32)
    q = nibble_runs(qs, 8) | (bit_planes(qh, 8) << 4)
    return (q.to(torch.int8), *_k_scale_min(d, dmin, scales))


def _q6_k(b):
    ql, qh, scales, d = split_bytes(b, 128, 64, 16)
    n = b.shape[0]
    low = unpack(ql.reshape(n, 2, 64), (0, 4), 0xF).reshape(n, 8, 32)
    high = unpack(qh.reshape(n, 2, 32), (0, 2, 4, 6), 3).reshape(n, 8, 32)
    return (low | (high << 4)).to(torch.int8) - 32, as_f16(d) * scales.view(torch.int8).float(), None


def _iq4_nl(b):
    d, qs = split_bytes(b, 2)
    return _lookup(IQ4NL_VALUES, _nibbles32(qs)), as_f16(d), None


def _iq4_xs(b):
    d, scales_h, scales_l, qs = split_bytes(b, 2, 2, 4)
    n = b.shape[0]
    low = unpack(scales_l, (0, 4), 0xF).transpose(1, 2).reshape(n, 8)
    high = unpack(as_u16(scales_h), range(0, 16, 2), 3).reshape(n, 8)
    scale = as_f16(d) * ((low.int() | (high << 4)) - 32).float()
    q = unpack(qs.reshape(n, 8, 16), (0, 4), 0xF).reshape(n, 8, 32)
    return _lookup(IQ4NL_VALUES, q), scale, None


def _mxfp4(b):
    e, qs = split_bytes(b, 1)
    return _lookup(MXFP4_VALUES, _nibbles32(qs)), e8m0_to_fp32_half(e), None


# type -> (values per group, blocks -> (q [n, values], scale [n, groups], bias or None))
DECOMPOSE = {
    Type.Q4_0: (32, _q4_0), Type.Q4_1: (32, _q4_1), Type.Q5_0: (32, _q5_0), Type.Q5_1: (32, _q5_1),
    Type.Q8_0: (32, _q8_0), Type.Q2_K: (16, _q2_k), Type.Q3_K: (16, _q3_k), Type.Q4_K: (32, _q4_k),
    Type.Q5_K: (32, _q5_k), Type.Q6_K: (16, _q6_k), Type.IQ4_NL: (32, _iq4_nl),
    Type.IQ4_XS: (32, _iq4_xs), Type.MXFP4: (32, _mxfp4),
}
HAS_BIAS = frozenset({Type.Q4_1, Type.Q5_1, Type.Q2_K, Type.Q4_K, Type.Q5_K})


def group_size(qtype) -> int:
    return DECOMPOSE[qtype][0]


def decompose(qtype, blocks: torch.Tensor, n_values: int):
    """uint8 blocks of `rows` rows [rows, row_bytes] -> (q int8 [rows, n_values], scale f32
    [rows, n_values/G], bias f32 [rows, n_values/G] or None)."""
    g, fn = DECOMPOSE[qtype]
    rows = blocks.shape[0]
    from ....types import type_traits
    q, scale, bias = fn(blocks.reshape(-1, type_traits(qtype).type_size))
    q = q.reshape(rows, n_values)
    scale = scale.reshape(rows, n_values // g).float()
    bias = None if bias is None else bias.reshape(rows, n_values // g).float()
    return q, scale, bias
