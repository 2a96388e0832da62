"""The 256-value "K" super-block formats: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K.

Dequantization follows gguf.quants' float32 evaluation order exactly: the sub-block scale
is formed first (d * scale), then applied to the quant (and the min subtracted). Products
commute bit for bit, so the quants are scaled in place (`q.mul_(dl)`) to save a pass.

Quantization is ggml's quantize_row_*_ref, bit for bit: a scale search per sub-block
(_scale_search), the sub-block scales quantized against the super-block's largest, then
every sub-block re-quantized with its rounded scale.
"""
from __future__ import annotations

import torch

from ..types import Type
from ._c_order import first_max, nearest_int, ordered_sum, over, signed_amax, sqrtf, wrap_int8
from ._fields import as_f16, as_f32, div, f16_bytes, pack_runs, split_bytes, unpack
from ._scale_search import GROUP_MAX_EPS, make_q3_quants, make_qkx2_quants, make_qx_quants


def two_bit_planes(qs: torch.Tensor, n_sub: int) -> torch.Tensor:
    """qs [n, 32*k] -> 2-bit values [n, n_sub, 256/n_sub]: each 32-byte chunk gives 4 runs of
    32 values (bits 0-1, 2-3, 4-5, 6-7)."""
    n = qs.shape[0]
    return unpack(qs.reshape(n, -1, 32), (0, 2, 4, 6), 3).reshape(n, n_sub, -1)


def nibble_runs(qs: torch.Tensor, n_sub: int) -> torch.Tensor:
    """qs [n, 32*k] -> 4-bit values [n, n_sub, ...]: each 32-byte chunk gives 32 low nibbles
    then 32 high nibbles."""
    n = qs.shape[0]
    return unpack(qs.reshape(n, -1, 32), (0, 4), 0xF).reshape(n, n_sub, -1)


def bit_planes(hmask: torch.Tensor, n_sub: int) -> torch.Tensor:
    """hmask [n, 32] -> bits [n, n_sub, ...]: bit b of every byte gives values 32b .. 32b+31."""
    n = hmask.shape[0]
    return unpack(hmask, range(8), 1).reshape(n, n_sub, -1)


def dequantize_q2_k(blocks):
    scales, qs, d, dmin = split_bytes(blocks, 16, 64, 2)
    n = blocks.shape[0]
    dl = (as_f16(d) * (scales & 0xF).float()).reshape(n, 16, 1)
    ml = (as_f16(dmin) * (scales >> 4).float()).reshape(n, 16, 1)
    return two_bit_planes(qs, 16).float().mul_(dl).sub_(ml).reshape(n, 256)


def q3_k_scales(scales: torch.Tensor) -> torch.Tensor:
    """12 bytes -> 16 signed 6-bit scales: low 4 bits from bytes 0-7 (low then high
    nibbles), high 2 bits from bytes 8-11 (bit pairs 0-1, 2-3, 4-5, 6-7)."""
    n = scales.shape[0]
    low = unpack(scales[:, :8], (0, 4), 0xF).reshape(n, 16)
    high = unpack(scales[:, 8:], (0, 2, 4, 6), 3).reshape(n, 16)
    return (low | (high << 4)).float() - 32


def dequantize_q3_k(blocks):
    hmask, qs, scales, d = split_bytes(blocks, 32, 64, 12)
    n = blocks.shape[0]
    dl = (as_f16(d) * q3_k_scales(scales)).reshape(n, 16, 1)
    low = two_bit_planes(qs, 16)
    high_clear = bit_planes(hmask, 16) ^ 1  # the value is offset by -4 when the bit is 0
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
    return nibble_runs(qs, 8).float().mul_(dl).sub_(ml).reshape(blocks.shape[0], 256)


def dequantize_q5_k(blocks):
    d, dmin, scales, qh, qs = split_bytes(blocks, 2, 2, 12, 32)
    dl, ml = _scaled_with_min(d, dmin, scales)
    q = nibble_runs(qs, 8) | (bit_planes(qh, 8) << 4)
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


def quantize_q8_k(x):
    """ggml's quantize_row_q8_K_ref: iscale = -127/max (max: the signed value of largest
    magnitude), q = min(127, nearest_int(iscale*x)), d = 1/iscale; all-zero blocks give d=0."""
    n = x.shape[0]
    signed_max, amax = (v.unsqueeze(-1) for v in signed_amax(x))
    zero = amax == 0
    iscale = over(-127.0, torch.where(zero, torch.ones_like(signed_max), signed_max))
    q = nearest_int(iscale * x).clamp_(max=127)
    q = torch.where(zero, torch.zeros_like(q), q).to(torch.int8)
    d = torch.where(zero, torch.zeros_like(iscale), over(1.0, iscale))
    bsums = q.reshape(n, 16, 16).sum(dim=-1, dtype=torch.int32).to(torch.int16)
    return torch.cat([d.contiguous().view(torch.uint8), q.view(torch.uint8),
                      bsums.contiguous().view(torch.uint8)], dim=-1)


# ---------------------------------------------------------------- quantize: Q2_K .. Q6_K

def _f16_round(v: torch.Tensor) -> torch.Tensor:
    """v as the fp16 a block stores, read back as float32."""
    return v.half().float()


def _requantize(x, dl, search_L, lo: int, hi: int, offset: int = 0, dm=None):
    """ggml's final pass: each sub-block x [m, k] whose rounded scale dl [m, 1] is non-zero is
    quantized against it, clamp(nearest_int((x + dm) / dl), lo, hi) + offset; a sub-block
    with dl == 0 keeps the quants its scale search chose."""
    l = nearest_int((x if dm is None else x + dm) / dl).clamp_(lo, hi) + offset
    return torch.where(dl == 0, search_L, l)


def _unsigned_scales(values: torch.Tensor, top: int):
    """Non-negative sub-block scales (or mins) [n, k] -> (nearest_int(top/max * value) as the
    uint8 C stores it, max/top): the integer scales and the super-block scale."""
    max_, _ = first_max(values)
    inverse = torch.where(max_ > 0, over(top, max_), 0.0)
    return nearest_int(inverse.unsqueeze(-1) * values) & 0xFF, div(max_, top).unsqueeze(-1)


def quantize_q2_k(x):
    n = x.shape[0]
    sub = x.reshape(n * 16, 16)
    scales, mins, L = make_qkx2_quants(sub, sub.abs(), 3, -0.5, 0.1, 15, use_mad=True)
    ls, d = _unsigned_scales(scales.view(n, 16), 15)
    lm, dmin = _unsigned_scales(mins.view(n, 16), 15)
    scale_bytes = (ls | (lm << 4)) & 0xFF
    dl = _f16_round(d) * (scale_bytes & 0xF).float()
    ml = _f16_round(dmin) * (scale_bytes >> 4).float()
    L = _requantize(sub, dl.view(-1, 1), L, 0, 3, dm=ml.view(-1, 1)).view(n, 2, 4, 32)
    return torch.cat([scale_bytes.to(torch.uint8), pack_runs(L, 2), f16_bytes(d), f16_bytes(dmin)], dim=-1)


def _pack_q3_k_scales(l: torch.Tensor) -> torch.Tensor:
    """16 6-bit scales [n, 16] -> 12 bytes (q3_k_scales' inverse)."""
    n = l.shape[0]
    low = pack_runs((l & 0xF).view(n, 1, 2, 8), 4)
    high = pack_runs((l >> 4).view(n, 1, 4, 4), 2)
    return torch.cat([low, high], dim=-1)


def _symmetric_sub_blocks(x, search, nmax: int):
    """Q3_K/Q6_K's first stage: sub-blocks of 16 [n*16, 16], their scales [n, 16] and quants
    from `search`, and the super-block's scale of largest magnitude with that magnitude [n]."""
    n = x.shape[0]
    sub = x.reshape(n * 16, 16)
    scales, L = search(sub, nmax)
    scales = scales.view(n, 16)
    return (n, sub, scales, L, *first_max(scales, scales.abs()))


def quantize_q3_k(x):
    n, sub, scales, L, max_scale, _ = _symmetric_sub_blocks(x, make_q3_quants, 4)
    live = max_scale != 0  # C's `if (max_scale)`: NaN counts as set
    iscale = over(-32, max_scale)
    l = wrap_int8(nearest_int(iscale.unsqueeze(-1) * scales)).clamp_(-32, 31) + 32
    l = torch.where(live.unsqueeze(-1), l, 0)
    d = torch.where(live, over(1, iscale), 0.0).unsqueeze(-1)
    dl = _f16_round(d) * (l - 32).float()
    L = _requantize(sub, dl.view(-1, 1), L, -4, 3, offset=4).view(n, 256)
    hmask = pack_runs((L > 3).view(n, 1, 8, 32), 1)
    qs = pack_runs((L & 3).view(n, 2, 4, 32), 2)
    return torch.cat([hmask, qs, _pack_q3_k_scales(l), f16_bytes(d)], dim=-1)


def _pack_k_scale_min(sc: torch.Tensor, mn: torch.Tensor) -> torch.Tensor:
    """8 6-bit scales and 8 6-bit mins [n, 8] each -> 12 bytes (k_scale_min's inverse)."""
    top = lambda v: (v[:, 4:] >> 4) << 6  # noqa: E731 - the high bits of scales/mins 4-7
    packed = torch.cat([sc[:, :4] | top(sc), mn[:, :4] | top(mn), (sc[:, 4:] & 0xF) | ((mn[:, 4:] & 0xF) << 4)], dim=-1)
    return packed.to(torch.uint8)


def _quantize_q45_k(x, nmax: int, rmin: float, nstep: int):
    """The shared part of Q4_K and Q5_K: (d, dmin, scale bytes) header [n, 16] and the quants
    L [n, 256] in [0, nmax], sub-blocks of 32 weighted by rms(sub-block) + |x|."""
    n = x.shape[0]
    sub = x.reshape(n * 8, 32)
    av_x = sqrtf(div(ordered_sum(sub * sub), 32))
    weights = av_x.unsqueeze(-1) + sub.abs()
    scales, mins, L = make_qkx2_quants(sub, weights, nmax, rmin, 0.1, nstep, use_mad=False)
    ls, d = _unsigned_scales(scales.view(n, 8), 63)
    lm, dmin = _unsigned_scales(mins.view(n, 8), 63)
    ls, lm = ls.clamp_(max=63), lm.clamp_(max=63)
    dl = _f16_round(d) * ls.float()
    ml = _f16_round(dmin) * lm.float()
    L = _requantize(sub, dl.view(-1, 1), L, 0, nmax, dm=ml.view(-1, 1)).view(n, 256)
    return torch.cat([f16_bytes(d), f16_bytes(dmin), _pack_k_scale_min(ls, lm)], dim=-1), L


def quantize_q4_k(x):
    header, L = _quantize_q45_k(x, 15, -1.0, 20)
    return torch.cat([header, pack_runs(L.view(-1, 4, 2, 32), 4)], dim=-1)


def quantize_q5_k(x):
    header, L = _quantize_q45_k(x, 31, -0.5, 15)
    qh = pack_runs((L >> 4).view(-1, 1, 8, 32), 1)
    return torch.cat([header, qh, pack_runs((L & 0xF).view(-1, 4, 2, 32), 4)], dim=-1)


def quantize_q6_k(x):
    n, sub, scales, L, max_scale, max_abs = _symmetric_sub_blocks(x, make_qx_quants, 32)
    iscale = over(-128, max_scale).unsqueeze(-1)
    d = over(1, iscale)
    sc = wrap_int8(nearest_int(iscale * scales).clamp_(max=127))
    dl = _f16_round(d) * sc.float()
    L = _requantize(sub, dl.view(-1, 1), L, -32, 31, offset=32).view(n, 2, 2, 2, 32)
    # per 128 values: ql byte 32k + l holds values 32k + l (low nibble) and 64 + 32k + l
    ql = pack_runs((L & 0xF).transpose(2, 3).reshape(n, 4, 2, 32), 4)
    qh = pack_runs((L >> 4).view(n, 2, 4, 32), 2)
    block = torch.cat([ql, qh, (sc & 0xFF).to(torch.uint8), f16_bytes(d)], dim=-1)
    return torch.where((max_abs < GROUP_MAX_EPS).unsqueeze(-1), 0, block)  # all-zero blocks


DEQUANTIZE = {
    Type.Q2_K: dequantize_q2_k,
    Type.Q3_K: dequantize_q3_k,
    Type.Q4_K: dequantize_q4_k,
    Type.Q5_K: dequantize_q5_k,
    Type.Q6_K: dequantize_q6_k,
    Type.Q8_K: dequantize_q8_k,
}

QUANTIZE = {
    Type.Q2_K: quantize_q2_k,
    Type.Q3_K: quantize_q3_k,
    Type.Q4_K: quantize_q4_k,
    Type.Q5_K: quantize_q5_k,
    Type.Q6_K: quantize_q6_k,
    Type.Q8_K: quantize_q8_k,
}
