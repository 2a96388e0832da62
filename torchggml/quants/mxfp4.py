"""The fp4 (e2m1) formats. MXFP4 (OCP microscaling): 32 e2m1 values sharing one e8m0 (power of
two) scale. NVFP4: 64 values in 4 sub-blocks of 16, each with an unsigned e4m3 scale.

The e2m1 values are kept doubled (integers, tables.MXFP4_VALUES), so the scale is decoded
as half of 2^(e-127), exactly as ggml's GGML_E8M0_TO_FP32_HALF.
"""
from __future__ import annotations

import torch

from ..types import Type, wide_float
from ._fields import pack_nibbles, pack_runs, split_bytes, unpack
from .tables import table


def e8m0_to_fp32_half(e: torch.Tensor) -> torch.Tensor:
    """uint8 exponent -> 2^(e-128) as float32, built from its bit pattern (subnormal for e < 2)."""
    e = e.int()
    bits = torch.where(e < 2, 0x00200000 << e, (e - 1) << 23)
    return bits.view(torch.float32)


def dequantize_mxfp4(blocks):
    e, qs = split_bytes(blocks, 1)
    q = unpack(qs, (0, 4), 0xF).reshape(blocks.shape[0], 32)
    return e8m0_to_fp32_half(e) * table("mxfp4", blocks.device)[q.long()]


def _floor_log2(x: torch.Tensor) -> torch.Tensor:
    """floor(log2f(x)) as numpy (gguf) and C compute it, not the exact exponent: for values
    just below a power of two, log2 rounded to float32 is that power's integer exponent.
    float64 log2 rounded to float32 gives numpy's result for every positive float32
    (checked exhaustively); a device without float64 (MPS) has to do with float32 log2."""
    if wide_float(x.device) is torch.float32:
        return torch.floor(torch.log2(x))
    return torch.floor(torch.log2(x.double()).float())


def quantize_mxfp4(x):
    n = x.shape[0]
    amax = x.abs().amax(dim=-1, keepdim=True)
    positive = amax > 0
    exponent = _floor_log2(torch.where(positive, amax, 1.0)) - 2 + 127
    e = torch.where(positive, exponent, 0.0).int() & 0xFF
    values = table("mxfp4", x.device)
    err = (e8m0_to_fp32_half(e).reshape(n, 1, 1) * values - x.unsqueeze(-1)).abs()
    q = err.argmin(dim=-1)  # first best on ties (0 before -0)
    return torch.cat([e.to(torch.uint8), pack_nibbles(q)], dim=-1)


DEQUANTIZE = {Type.MXFP4: dequantize_mxfp4}
QUANTIZE = {Type.MXFP4: quantize_mxfp4}


# ---------------------------------------------------------------- NVFP4: 64 values, 4 sub-blocks of 16

def _ue4m3_table() -> torch.Tensor:
    """Every ue4m3 byte's value, halved (the e2m1 values are kept doubled): 0 and 0x7F decode
    to 0; exponent 0 is subnormal (man * 2^-9), else (1 + man/8) 2^(exp - 7). All exact in float32."""
    values = []
    for x in range(256):
        exp, man = (x >> 3) & 0xF, x & 0x7
        raw = man * 2.0 ** -9 if exp == 0 else (1 + man / 8) * 2.0 ** (exp - 7)
        values.append(0.0 if x in (0, 0x7F) else raw * 0.5)
    return torch.tensor(values, dtype=torch.float32)


_UE4M3 = _ue4m3_table()


def ue4m3_to_fp32(x: torch.Tensor) -> torch.Tensor:
    return _UE4M3.to(x.device)[x.long()]


def fp32_to_ue4m3(x: torch.Tensor) -> torch.Tensor:
    """ggml_fp32_to_ue4m3: positive float32 -> unsigned e4m3 byte, the mantissa rounded by its
    next bit (half up), subnormals by x*512 + 0.5 truncated, saturating at 0x7E (448)."""
    positive = x > 0
    x = torch.where(positive, x, 0.0).clamp_max(448.0)
    bits = x.view(torch.int32)
    exp = ((bits >> 23) & 0xFF) - 127 + 7
    man = ((bits >> 20) & 0x7) + ((bits >> 19) & 1)
    carry = man > 7
    exp = torch.where(carry, exp + 1, exp)
    normal = torch.where(exp >= 15, 0x7E, (exp << 3) | torch.where(carry, 0, man))
    sub = (x * 512.0 + 0.5).int().clamp_max(7)
    sub = torch.where(sub < 1, 0, sub)
    out = torch.where(exp - carry.int() <= 0, sub, normal)
    return torch.where(positive, out, 0).to(torch.uint8)


def dequantize_nvfp4(blocks):
    d, qs = split_bytes(blocks, 4)
    n = blocks.shape[0]
    q = unpack(qs.reshape(n, 4, 8), (0, 4), 0xF).reshape(n, 4, 16)    # element j and j + 8 per byte
    return (ue4m3_to_fp32(d).unsqueeze(-1) * table("mxfp4", blocks.device)[q.long()]).reshape(n, 64)


def quantize_nvfp4(x):
    n = x.shape[0]
    sub = x.reshape(n, 4, 16)
    amax = sub.abs().amax(dim=-1)
    ue = fp32_to_ue4m3(amax / torch.tensor(6.0, device=x.device))
    d = ue4m3_to_fp32(ue)
    err = (d.reshape(n, 4, 1, 1) * table("mxfp4", x.device) - sub.unsqueeze(-1)).abs()
    q = err.argmin(dim=-1)                                            # first best on ties
    packed = pack_runs(q.reshape(n * 4, 1, 2, 8), 4).reshape(n, 32)
    return torch.cat([ue, packed], dim=-1)


DEQUANTIZE[Type.NVFP4] = dequantize_nvfp4
QUANTIZE[Type.NVFP4] = quantize_nvfp4
