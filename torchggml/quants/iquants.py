"""The "IQ" formats: grid (lattice) codebooks IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S,
IQ1_M, and the non-linear 4-bit IQ4_NL and IQ4_XS.

A grid format stores, per group of 8 (or 4) values, an index into a table of 8 (or 4)
magnitudes plus sign bits; a sub-block scale multiplies them. The float32 evaluation order
is gguf.quants': ((d * f(scale)) * grid) * sign, or dl * (grid + delta) for IQ1.
"""
from __future__ import annotations

import torch

from ..types import Type
from ._c_order import first_max, nearest_int, ordered_sum, over, signed_amax
from ._fields import as_f16, as_u16, as_u32, div, f16_bytes, pack_nibbles, pack_runs, split_bytes, unpack
from ._scale_search import GROUP_MAX_EPS
from .tables import table


def _lookup(name: str, index: torch.Tensor) -> torch.Tensor:
    """Rows of the named table at `index` (any integer dtype): [..., ] -> [..., row]."""
    return table(name, index.device)[index.long()]


def _half_step_scale(d: torch.Tensor, scale: torch.Tensor, factor: float) -> torch.Tensor:
    """IQ2/IQ3_XXS sub-block scale: d * (0.5 + scale) * factor, in that order."""
    return d * (scale.float() + 0.5) * factor


def _ksigns(packed: torch.Tensor) -> torch.Tensor:
    """A 32-bit word's four 7-bit sign indices (bits 0, 7, 14, 21) -> +-1 [..., 4, 8]."""
    index = unpack(packed, (0, 7, 14, 21), 0x7F).transpose(-1, -2)
    return _lookup("ksign_bits", index)


def dequantize_iq2_xxs(blocks):
    d, qs = split_bytes(blocks, 2)
    n = blocks.shape[0]
    aux = as_u32(qs).reshape(n, 8, 2)  # per 32 values: 4 grid indices, then signs + scale
    grid_index = qs.reshape(n, 8, 2, 4)[:, :, 0]
    db = _half_step_scale(as_f16(d), aux[..., 1] >> 28, 0.25).reshape(n, 8, 1, 1)
    grid = _lookup("iq2xxs", grid_index)  # [n, 8, 4, 8]
    return (db * grid * _ksigns(aux[..., 1])).reshape(n, 256)


def dequantize_iq2_xs(blocks):
    d, qs, scales = split_bytes(blocks, 2, 64)
    n = blocks.shape[0]
    qs = as_u16(qs)  # 9-bit grid index, 7-bit sign index
    sc = unpack(scales, (0, 4), 0xF).transpose(1, 2).reshape(n, 16)
    db = _half_step_scale(as_f16(d), sc, 0.25).reshape(n, 16, 1, 1)
    signs = _lookup("ksign_bits", qs >> 9).reshape(n, 16, 2, 8)
    grid = _lookup("iq2xs", qs & 511).reshape(n, 16, 2, 8)
    return (db * grid * signs).reshape(n, 256)


def dequantize_iq2_s(blocks):
    d, qs, sign_bytes, qh, scales = split_bytes(blocks, 2, 32, 32, 8)
    n = blocks.shape[0]
    sc = unpack(scales, (0, 4), 0xF).transpose(1, 2).reshape(n, 16)
    db = _half_step_scale(as_f16(d), sc, 0.25).reshape(n, 16, 1, 1)
    signs = _lookup("sign_bits", sign_bytes).reshape(n, 16, 2, 8)
    high = unpack(qh, (0, 2, 4, 6), 3).transpose(1, 2).reshape(n, 32)
    grid = _lookup("iq2s", qs.int() | (high.int() << 8)).reshape(n, 16, 2, 8)
    return (db * grid * signs).reshape(n, 256)


def dequantize_iq3_xxs(blocks):
    d, qs, scales_and_signs = split_bytes(blocks, 2, 64)
    n = blocks.shape[0]
    aux = as_u32(scales_and_signs)  # [n, 8]: four 7-bit sign indices, 4-bit scale
    db = _half_step_scale(as_f16(d), aux >> 28, 0.5).reshape(n, 8, 1, 1)
    grid = _lookup("iq3xxs", qs).reshape(n, 8, 4, 8)
    return (db * grid * _ksigns(aux)).reshape(n, 256)


def dequantize_iq3_s(blocks):
    d, qs, qh, sign_bytes, scales = split_bytes(blocks, 2, 64, 8, 32)
    n = blocks.shape[0]
    sc = unpack(scales, (0, 4), 0xF).transpose(1, 2).reshape(n, 8)
    db = (as_f16(d) * (2 * sc + 1).float()).reshape(n, 8, 1, 1)
    signs = _lookup("sign_bits", sign_bytes).reshape(n, 8, 4, 8)
    high = unpack(qh, range(8), 1).transpose(1, 2).reshape(n, 64)
    grid = _lookup("iq3s", qs.int() | (high.int() << 8)).reshape(n, 8, 4, 8)
    return (db * grid * signs).reshape(n, 256)


IQ1_DELTA = 0.125


def _iq1_delta(negative: torch.Tensor) -> torch.Tensor:
    return torch.where(negative, -IQ1_DELTA, IQ1_DELTA).float()


def dequantize_iq1_s(blocks):
    d, qs, qh = split_bytes(blocks, 2, 32)
    n = blocks.shape[0]
    qh = as_u16(qh)  # per 32 values: 4 x 3 high index bits, 3-bit scale, delta sign
    dl = (as_f16(d) * (2 * ((qh >> 12) & 7) + 1).float()).reshape(n, 8, 1, 1)
    delta = _iq1_delta((qh & 0x8000) != 0).reshape(n, 8, 1, 1)
    high = unpack(qh, (0, 3, 6, 9), 7).transpose(1, 2).reshape(n, 32)
    grid = _lookup("iq1s", qs.int() | (high << 8)).reshape(n, 8, 4, 8)
    return (dl * (grid + delta)).reshape(n, 256)


def dequantize_iq1_m(blocks):
    qs, qh, scales = split_bytes(blocks, 32, 16)
    n = blocks.shape[0]
    scales = as_u16(scales)  # [n, 4]: 4 x 3-bit sub-block scales; top nibbles: fp16 d
    top = scales & 0xF000
    d_bits = (top[:, 0] >> 12) | (top[:, 1] >> 8) | (top[:, 2] >> 4) | top[:, 3]
    d = d_bits.to(torch.int16).view(torch.float16).float().reshape(n, 1)
    sc = unpack(scales, (0, 3, 6, 9), 7).transpose(1, 2).reshape(n, 16)
    dl = (d * (2 * sc + 1).float()).reshape(n, 8, 2, 1, 1)
    # each qh byte: two nibbles, each 3 high index bits + a delta sign bit
    qh = unpack(qh, (0, 4), 0xF).transpose(1, 2).reshape(n, 32)
    grid = _lookup("iq1s", qs.int() | ((qh & 7).int() << 8)).reshape(n, 8, 2, 2, 8)
    delta = _iq1_delta((qh & 8) != 0).reshape(n, 8, 2, 2, 1)
    return (dl * (grid + delta)).reshape(n, 256)


def dequantize_iq4_nl(blocks):
    d, qs = split_bytes(blocks, 2)
    q = unpack(qs, (0, 4), 0xF).reshape(blocks.shape[0], 32)
    return as_f16(d) * _lookup("iq4nl", q)


def dequantize_iq4_xs(blocks):
    d, scales_h, scales_l, qs = split_bytes(blocks, 2, 2, 4)
    n = blocks.shape[0]
    low = unpack(scales_l, (0, 4), 0xF).transpose(1, 2).reshape(n, 8)
    high = unpack(as_u16(scales_h), range(0, 16, 2), 3).reshape(n, 8)
    dl = (as_f16(d) * ((low.int() | (high << 4)) - 32).float()).reshape(n, 8, 1)
    q = unpack(qs.reshape(n, 8, 16), (0, 4), 0xF).reshape(n, 8, 32)
    return (dl * _lookup("iq4nl", q)).reshape(n, 256)


def _nearest_iq4nl_index(x: torch.Tensor) -> torch.Tensor:
    """ggml's best_index_int8 over the 16 sorted IQ4_NL values: the nearest value, the
    upper one unless the lower is strictly nearer; clamped at both ends."""
    values = table("iq4nl", x.device)
    upper = torch.searchsorted(values, x.contiguous(), right=True).clamp_(1, 15)
    pick_lower = (x - values[upper - 1]) < (values[upper] - x)
    return torch.where(pick_lower, upper - 1, upper)


def _iq4_scales(sub: torch.Tensor, ntry: int):
    """ggml's scale search of quantize_row_iq4_nl_impl (no importance weights: w = x*x) for
    blocks of 32 [m, 32]: d0 = max / -127 (or -max / -127 with ntry > 0) picks indices and a
    least-squares scale; then 1/d = (t - 127) / max for t in -ntry..ntry is tried, keeping the
    scale of largest sum(w*q*x)^2 / sum(w*q*q). Returns (scale [m], the first indices
    [m, 32], whether the block is below GROUP_MAX_EPS [m]: scale 0, indices left unset)."""
    values = table("iq4nl", sub.device)
    max_, amax = signed_amax(sub)
    d0 = div(-max_, -127.0) if ntry > 0 else div(max_, -127.0)
    tries = torch.tensor([t - 127 for t in range(-ntry, ntry + 1)], dtype=torch.float32,
                         device=sub.device)
    inverse = torch.cat([over(1, d0).unsqueeze(-1), tries / max_.unsqueeze(-1)], dim=-1)
    index = _nearest_iq4nl_index(inverse.unsqueeze(-1) * sub.unsqueeze(1))   # [m, C, 32]
    q = values[index]
    wq = (sub * sub).unsqueeze(1) * q
    sumqx, sumq2 = ordered_sum(torch.stack([wq * sub.unsqueeze(1), wq * q]))
    d = torch.where(sumq2[:, 0] > 0, sumqx[:, 0] / sumq2[:, 0], 0.0)
    best = d * sumqx[:, 0]
    for c in range(1, inverse.shape[1]):
        take = (sumq2[:, c] > 0) & (sumqx[:, c] * sumqx[:, c] > best * sumq2[:, c])
        this_d = sumqx[:, c] / sumq2[:, c]
        d = torch.where(take, this_d, d)
        best = torch.where(take, this_d * sumqx[:, c], best)
    dead = amax < GROUP_MAX_EPS
    return torch.where(dead, 0.0, d), index[:, 0], dead


def quantize_iq4_nl(x):
    """ggml's quantize_row_iq4_nl_ref (what ggml's CPU backend uses to write IQ4_NL): the
    first scale search only (ntry = -1), the indices it picked, d = that block's scale.
    Blocks below GROUP_MAX_EPS get d = 0 and index 8 (value 1, where 0 maps); C leaves them
    whatever indices its buffer held, which dequantize to 0 all the same."""
    d, index, dead = _iq4_scales(x, ntry=-1)
    index = torch.where(dead.unsqueeze(-1), 8, index)
    return torch.cat([f16_bytes(d.unsqueeze(-1)), pack_nibbles(index)], dim=-1)


def quantize_iq4_xs(x):
    """ggml's quantize_row_iq4_xs_ref: a full scale search (ntry = 7) per block of 32, the 8
    scales quantized to 6 bits against d = -max/32, then every block re-indexed against its
    rounded scale d * l."""
    n = x.shape[0]
    sub = x.reshape(n * 8, 32)
    scales, _, _ = _iq4_scales(sub, ntry=7)
    scales = scales.view(n, 8)
    max_scale, _ = first_max(scales, scales.abs())
    d = div(-max_scale, 32).unsqueeze(-1)
    inverse = torch.where(d != 0, over(1, d), 0.0)
    l = nearest_int(inverse * scales).clamp_(-32, 31)
    dl = (d * l.float()).view(-1, 1)
    index = _nearest_iq4nl_index(torch.where(dl != 0, over(1, dl), 0.0) * sub).view(n, 256)
    l = l + 32
    scales_h = pack_runs((l >> 4).view(n, 2, 4, 1), 2)
    scales_l = pack_runs((l & 0xF).view(n, 4, 2, 1), 4)
    return torch.cat([f16_bytes(d), scales_h, scales_l, pack_nibbles(index)], dim=-1)


DEQUANTIZE = {
    Type.IQ2_XXS: dequantize_iq2_xxs,
    Type.IQ2_XS: dequantize_iq2_xs,
    Type.IQ2_S: dequantize_iq2_s,
    Type.IQ3_XXS: dequantize_iq3_xxs,
    Type.IQ3_S: dequantize_iq3_s,
    Type.IQ1_S: dequantize_iq1_s,
    Type.IQ1_M: dequantize_iq1_m,
    Type.IQ4_NL: dequantize_iq4_nl,
    Type.IQ4_XS: dequantize_iq4_xs,
}

QUANTIZE = {
    Type.IQ4_NL: quantize_iq4_nl,
    Type.IQ4_XS: quantize_iq4_xs,
}
