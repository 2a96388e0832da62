"""F32, F16 and BF16 as "formats" of block size 1, so one quantize/dequantize covers them."""
from __future__ import annotations

import torch

from ..types import Type
from ._fields import view_bytes_as

PLAIN_DTYPES = {Type.F32: torch.float32, Type.F16: torch.float16, Type.BF16: torch.bfloat16}


def dequantize_plain(qtype: Type, data: torch.Tensor) -> torch.Tensor:
    """Raw bytes (or values of the type's own dtype) [..., k] -> float32 [..., n]."""
    if data.dtype == torch.uint8:
        data = view_bytes_as(data, PLAIN_DTYPES[qtype])
    if qtype == Type.BF16:
        # bf16 is the top half of an fp32: shift the bits instead of converting, so every
        # pattern (NaN payloads included) comes out as gguf's `int16 << 16`
        return (data.view(torch.int16).int() << 16).view(torch.float32)
    return data.float()


def _fp32_to_bf16_bits(x: torch.Tensor) -> torch.Tensor:
    """ggml_compute_fp32_to_bf16: NaNs made quiet, others rounded to nearest even."""
    n = x.contiguous().view(torch.int32).long() & 0xFFFFFFFF
    is_nan = (n & 0x7FFFFFFF) > 0x7F800000
    n = torch.where(is_nan, (n & 0xFFFF0000) | (64 << 16), n)
    return ((n + (0x7FFF + ((n >> 16) & 1))) >> 16).to(torch.int32).to(torch.int16)


def quantize_plain(qtype: Type, x: torch.Tensor) -> torch.Tensor:
    """float32 [..., n] -> the type's bytes, uint8 [..., n * type_size]."""
    if qtype == Type.BF16:
        values = _fp32_to_bf16_bits(x)
    else:
        values = x.to(PLAIN_DTYPES[qtype]).contiguous()
    return values.view(torch.uint8)
