"""Small helpers shared by the block formats: reading packed fields, unpacking bits, rounding.

Blocks arrive as a uint8 tensor [n_blocks, type_size]. Multi-byte fields are little-endian
(ggml's on-disk order); we read them by copying the few bytes out and viewing them as the
field's dtype, which is exact and works on every torch device.
"""
from __future__ import annotations

import torch


def split_bytes(blocks: torch.Tensor, *sizes: int) -> list[torch.Tensor]:
    """Cut each block into consecutive fields of the given byte sizes (the last takes the rest)."""
    fields, start = [], 0
    for size in sizes:
        fields.append(blocks[:, start:start + size])
        start += size
    fields.append(blocks[:, start:])
    return fields


def view_bytes_as(field: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """uint8 [..., k] -> dtype [..., k / itemsize], reinterpreting the bytes.

    A fresh contiguous copy, so the view's alignment never depends on where the field sat.
    """
    return field.clone(memory_format=torch.contiguous_format).view(dtype)


def as_f16(field: torch.Tensor) -> torch.Tensor:
    """Little-endian fp16 values in `field` -> float32 [n, k/2] (exact conversion)."""
    return view_bytes_as(field, torch.float16).float()


def as_f32(field: torch.Tensor) -> torch.Tensor:
    return view_bytes_as(field, torch.float32)


def as_i16(field: torch.Tensor) -> torch.Tensor:
    """Little-endian int16 values -> int32."""
    return view_bytes_as(field, torch.int16).int()


def as_u16(field: torch.Tensor) -> torch.Tensor:
    """Little-endian uint16 values -> int32 (torch has no full uint16 arithmetic)."""
    return as_i16(field) & 0xFFFF


def as_u32(field: torch.Tensor) -> torch.Tensor:
    """Little-endian uint32 values -> int64."""
    return view_bytes_as(field, torch.int32).long() & 0xFFFFFFFF


def unpack(values: torch.Tensor, shifts, mask: int) -> torch.Tensor:
    """(values >> s) & mask for each shift s, stacked on a new axis before the last one.

    [..., k] -> [..., len(shifts), k]: the usual "low nibbles first, then high nibbles" order.
    """
    return torch.stack([(values >> s) & mask for s in shifts], dim=-2)


def f16_bytes(values: torch.Tensor) -> torch.Tensor:
    """float32 [n, k] -> its fp16 encoding (round to nearest even), uint8 [n, 2k]."""
    return values.to(torch.float16).contiguous().view(torch.uint8)


def div(a: torch.Tensor, b: float) -> torch.Tensor:
    """a / b, correctly rounded on every device.

    CUDA turns division by a Python (or CPU) scalar into a multiplication by its reciprocal,
    which can be off by one ulp; dividing by a tensor on a's device is a true division.
    """
    return a / a.new_full((), b)


def inverse_or_zero(d: torch.Tensor) -> torch.Tensor:
    """1/d, or 0 where d == 0 (ggml's `id = d ? 1/d : 0`)."""
    return torch.where(d == 0, torch.zeros_like(d), torch.reciprocal(d))


def round_half_away(x: torch.Tensor) -> torch.Tensor:
    """C's roundf: to nearest, halves away from zero.

    floor(|x| + 0.5) would be wrong for 0.49999997 (the sum rounds up to 1.0); the
    fraction-part form below is exact, and is also how gguf's np_roundf computes it.
    """
    a = x.abs()
    whole = torch.floor(a)
    return torch.sign(x) * (whole + torch.floor(2 * (a - whole)))


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """0/1 values [n, 8k] -> uint8 [n, k], element j in bit j % 8 of byte j // 8."""
    return pack_runs(bits.reshape(bits.shape[0], -1, 8, 1), 1)


def pack_runs(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Small values [n, groups, runs, width] -> uint8 [n, groups * width]: run r of each group
    goes to bits r*bits .. r*bits + bits-1 of the group's `width` bytes (unpack's inverse)."""
    q = q.to(torch.uint8)
    packed = q[:, :, 0]
    for r in range(1, q.shape[2]):
        packed = packed | (q[:, :, r] << (r * bits))
    return packed.reshape(q.shape[0], -1)


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """4-bit values [n, 32k] -> uint8 [n, 16k]: in each group of 32, element j in the low
    nibble and element j + 16 in the high nibble of byte j (ggml's qs layout)."""
    return pack_runs(q.reshape(q.shape[0], -1, 2, 16), 4)
