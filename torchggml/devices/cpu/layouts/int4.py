"""The `int4` path's layout: weights in the layout of torch's CPU int4 weight-only GEMM
(`aten._weight_int4pack_mm_for_cpu`, gpt-fast's path) instead of ggml's blocks, so that MUL_MAT
multiplies them without dequantizing the whole weight at every call. At a tensor's address lie:

    nibbles          uint8 [N16, K/2]          (aten._convert_weight_to_int4pack_for_cpu)
    scales_and_zeros bf16  [K/32, N16, 2]      (64-byte aligned after the nibbles)

with N16 = N rounded up to 16 (torch packs 16 rows at a time; the padding rows are zero), and
W[n, k] = (q[n, k] - 8) * scale[k/32, n] + zero[k/32, n]. ggml's formats map exactly before
the bf16 rounding of scales and zeros: Q4_0 scale d, zero 0; Q4_1 scale d, zero m + 8d; Q4_K per
32-value sub-block scale d*sc, zero 8*d*sc - dmin*m. The activations are rounded to bf16 too
(llama.cpp's CPU backend rounds them to 8 bits for quantized products). 2-D weights only: it
serves MUL_MAT, not MUL_MAT_ID.
"""
from __future__ import annotations

import functools

import torch

from ....quants._fields import as_f16, split_bytes, unpack
from ....quants.kquants import k_scale_min
from ....storage import byte_view
from ....tensor import Tensor, nbytes, round_up
from ....types import Type, type_traits
from .base import RepackBuffer, RepackBufferType

GROUP = 32          # values per scale/zero group (torch's group_size)
ROW_MULTIPLE = 16   # torch's CPU int4 packing takes rows 16 at a time
ROW_BLOCK = 64      # ... and interleaves them in blocks of 64: convert in chunks of whole blocks
SCALES_ALIGN = 64   # where the scales start after the nibbles
REPACK_TYPES = frozenset({Type.Q4_0, Type.Q4_1, Type.Q4_K})
# weights are converted this many values at a time (bounds the int32 temporaries)
CONVERT_VALUES = 1 << 22


def repack_supports_shape(qtype, ne) -> bool:
    """A weight of this type and shape can be repacked: Q4_0/Q4_1/Q4_K, 2-D."""
    ne = list(ne) + [1] * (4 - len(ne))
    return qtype in REPACK_TYPES and ne[2] == 1 and ne[3] == 1 and ne[0] % GROUP == 0


def _layout(t: Tensor) -> tuple[int, int, int, int]:
    """(padded rows N16, K, byte offset of the scales, total bytes) of t's packed form."""
    k, n16 = t.ne[0], round_up(t.ne[1], ROW_MULTIPLE)
    scales_at = round_up(n16 * k // 2, SCALES_ALIGN)
    return n16, k, scales_at, scales_at + (k // GROUP) * n16 * 2 * 2


def packed_nbytes(t: Tensor) -> int:
    return _layout(t)[3]


def repacked_views(t: Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(nibbles uint8 [N16, K/2], scales_and_zeros bf16 [K/32, N16, 2]) at t's address."""
    buffer = t.buffer
    if not isinstance(buffer, Int4Buffer):
        raise ValueError(f"{t.describe()} is not in an int4 repack buffer (its buffer: "
                         f"{buffer.name if buffer is not None else None})")
    n16, k, scales_at, total = _layout(t)
    raw = byte_view(buffer, t.data - buffer.base, total)
    nibbles = raw[:n16 * k // 2].view(n16, k // 2)
    scales = raw[scales_at:total].view(torch.bfloat16).view(k // GROUP, n16, 2)
    return nibbles, scales


# ---------------------------------------------------------------- ggml blocks -> int4 + groups

def _q4_0_groups(blocks):
    d, qs = split_bytes(blocks, 2)
    scale = as_f16(d)
    return _low_then_high(qs), scale, torch.zeros_like(scale)


def _q4_1_groups(blocks):
    d, m, qs = split_bytes(blocks, 2, 2)
    scale = as_f16(d)
    return _low_then_high(qs), scale, as_f16(m) + 8 * scale


def _q4_k_groups(blocks):
    d, dmin, scales, qs = split_bytes(blocks, 2, 2, 12)
    sc, mn = k_scale_min(scales)
    n = blocks.shape[0]
    scale = as_f16(d) * sc.float()                      # [n, 8]: one per 32-value sub-block
    zero = 8 * scale - as_f16(dmin) * mn.float()
    # each 32 bytes of qs hold two sub-blocks: 32 low nibbles, then 32 high nibbles
    q = unpack(qs.reshape(n, 4, 32), (0, 4), 0xF).reshape(n * 8, 32)
    return q, scale.reshape(-1, 1), zero.reshape(-1, 1)


def _low_then_high(qs):
    """qs [n, 16] -> 32 values: byte j holds value j (low nibble) and j + 16 (high)."""
    return unpack(qs, (0, 4), 0xF).reshape(qs.shape[0], 32)


_GROUPS = {Type.Q4_0: _q4_0_groups, Type.Q4_1: _q4_1_groups, Type.Q4_K: _q4_k_groups}


def pack_rows(qtype, blocks: torch.Tensor, n: int, k: int):
    """ggml blocks of n rows of k values -> (nibbles [n, k/2], scales_and_zeros f32 [k/32, n, 2]);
    n must be a multiple of 16."""
    q, scale, zero = _GROUPS[qtype](blocks.reshape(-1, type_traits(qtype).type_size))
    nibbles = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.reshape(n, k).int(), 1)
    groups = torch.stack([scale.reshape(n, k // GROUP), zero.reshape(n, k // GROUP)], dim=-1)
    return nibbles, groups.transpose(0, 1)


# ---------------------------------------------------------------- the layout

class Int4BufferType(RepackBufferType):
    """CPU_REPACK for the int4 path: torch's int4 GEMM layout."""

    def supports_weight(self, qtype, ne) -> bool:
        return repack_supports_shape(qtype, ne)

    def layout_nbytes(self, t: Tensor) -> int:
        return packed_nbytes(t)

    def bind_product(self, t: Tensor, separate_rows: bool = False):
        """separate_rows is not used: torch's int4 GEMM multiplies every micro-batch alike."""
        nibbles, scales = repacked_views(t)
        return functools.partial(_times_packed, nibbles, scales, t.ne[1])


class Int4Buffer(RepackBuffer):
    def set_tensor(self, tensor: Tensor, data: torch.Tensor, offset: int, size: int) -> None:
        self.check_whole_write(tensor, offset, size, f"contiguous 2-D {'/'.join(sorted(t.name for t in REPACK_TYPES))} "
                                                     f"weights (K a multiple of {GROUP})")
        nibbles, groups = repacked_views(tensor)
        n, k = tensor.ne[1], tensor.ne[0]
        row_bytes = nbytes(tensor) // n
        blocks = data[:size].reshape(n, row_bytes).cpu()
        step = max(ROW_BLOCK, CONVERT_VALUES // k // ROW_BLOCK * ROW_BLOCK)
        for r0 in range(0, nibbles.shape[0], step):  # chunks of rows bound the temporaries
            part = blocks[r0:r0 + step]
            rows = min(step, nibbles.shape[0] - r0)
            if part.shape[0] < rows:  # the padding rows: all-zero blocks (scale 0, zero 0)
                part = torch.cat([part, part.new_zeros(rows - part.shape[0], row_bytes)])
            packed, sz = pack_rows(tensor.type, part, rows, k)
            nibbles[r0:r0 + rows].copy_(packed)
            groups[:, r0:r0 + rows].copy_(sz)


Int4BufferType.buffer_class = Int4Buffer


def _times_packed(nibbles, scales, n, rows, out) -> None:
    product = torch.ops.aten._weight_int4pack_mm_for_cpu(rows.to(torch.bfloat16), nibbles, GROUP, scales)
    out.copy_(product[:, :n])
