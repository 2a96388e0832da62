"""MXFP4 (OCP microscaling): 32 e2m1 values sharing one e8m0 (power of two) scale.

The e2m1 values are kept doubled (integers, tables.MXFP4_VALUES), so the scale is decoded
as half of 2^(e-127), exactly as ggml's GGML_E8M0_TO_FP32_HALF.
"""
from __future__ import annotations

import torch

from ..types import Type, wide_float
from ._fields import pack_nibbles, split_bytes, unpack
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
