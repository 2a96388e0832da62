"""The CPU's repack buffer type ("CPU_REPACK", as upstream's ggml_backend_cpu_repack_buffer_type).

Weights written into a repack buffer are stored in the layout of torch's CPU int4 weight-only
GEMM (`aten._weight_int4pack_mm_for_cpu`, gpt-fast's path) instead of ggml's blocks, so that
MUL_MAT multiplies them without dequantizing the whole weight at every call. At a tensor's
address lie:

    nibbles          uint8 [N16, K/2]          (aten._convert_weight_to_int4pack_for_cpu)
    scales_and_zeros bf16  [K/32, N16, 2]      (64-byte aligned after the nibbles)

with N16 = N rounded up to 16 (torch packs 16 rows at a time; the padding rows are zero), and
W[n, k] = (q[n, k] - 8) * scale[k/32, n] + zero[k/32, n]. ggml's formats map exactly before
the bf16 rounding of scales and zeros: Q4_0 scale d, zero 0; Q4_1 scale d, zero m + 8d; Q4_K per
32-value sub-block scale d*sc, zero 8*d*sc - dmin*m. The activations are rounded to bf16 too
(llama.cpp's CPU backend rounds them to 8 bits for quantized products).

The bytes are not ggml's layout: the buffer type is not host memory, only whole-tensor writes
are accepted, reads raise, and the CPU device runs no op on a repacked tensor but a MUL_MAT
that has it as its (2-D) weight, or a MUL_MAT_ID that has it as its experts where the buffer
type serves those (`RepackBufferType.reads_as_weight`, `reads_repacked_only_as_weight`).
"""
from __future__ import annotations

import functools

import torch

from ..enums import Op, VIEW_OPS
from ..quants._fields import as_f16, split_bytes, unpack
from ..quants.kquants import k_scale_min
from ..memory import TorchBuffer, TorchBufferType, byte_view
from ..tensor import Tensor, memory_buffer, nbytes, round_up
from ..types import Type, type_traits
from .kernels.table import UnsupportedOpError

GROUP = 32          # values per scale/zero group (torch's group_size)
ROW_MULTIPLE = 16   # torch's CPU int4 packing takes rows 16 at a time
ROW_BLOCK = 64      # ... and interleaves them in blocks of 64: convert in chunks of whole blocks
SCALES_ALIGN = 64   # where the scales start after the nibbles
REPACK_TYPES = frozenset({Type.Q4_0, Type.Q4_1, Type.Q4_K})
# weights are converted this many values at a time (bounds the int32 temporaries)
CONVERT_VALUES = 1 << 22


class RepackedTensorError(RuntimeError):
    """A repacked tensor was read or written as if it held ggml blocks."""


def repack_supports_shape(qtype, ne) -> bool:
    """A weight of this type and shape can be repacked: Q4_0/Q4_1/Q4_K, 2-D."""
    ne = list(ne) + [1] * (4 - len(ne))
    return qtype in REPACK_TYPES and ne[2] == 1 and ne[3] == 1 and ne[0] % GROUP == 0


def is_whole_contiguous(t: Tensor) -> bool:
    """t is not a view and its rows are contiguous ggml blocks (what a repack reads whole)."""
    tr = type_traits(t.type)
    contiguous = t.nb[0] == tr.type_size and t.nb[1] == t.ne[0] // tr.blck_size * tr.type_size
    return t.view_src is None and contiguous


def repack_supports(t: Tensor) -> bool:
    """t can live in a repack buffer: a supported type, 2-D, contiguous, not a view."""
    return is_whole_contiguous(t) and repack_supports_shape(t.type, t.ne)


def _layout(t: Tensor) -> tuple[int, int, int, int]:
    """(padded rows N16, K, byte offset of the scales, total bytes) of t's packed form."""
    k, n16 = t.ne[0], round_up(t.ne[1], ROW_MULTIPLE)
    scales_at = round_up(n16 * k // 2, SCALES_ALIGN)
    return n16, k, scales_at, scales_at + (k // GROUP) * n16 * 2 * 2


def packed_nbytes(t: Tensor) -> int:
    return _layout(t)[3]


def is_repacked(t: Tensor | None) -> bool:
    """t (or the tensor it views) lives in a repack buffer."""
    return t is not None and isinstance(memory_buffer(t), RepackBuffer)


def repacked_views(t: Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(nibbles uint8 [N16, K/2], scales_and_zeros bf16 [K/32, N16, 2]) at t's address."""
    buffer = t.buffer
    if not isinstance(buffer, RepackBuffer):
        raise ValueError(f"{t.describe()} is not in a repack buffer (its buffer: "
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


# ---------------------------------------------------------------- buffer type and buffer

class RepackBufferType(TorchBufferType):
    """CPU memory holding weights in torch's int4 GEMM layout (not ggml's: not host)."""

    def __init__(self, device):
        super().__init__("CPU_REPACK", device, "cpu", host=False, alignment=64)

    def get_alloc_size(self, tensor: Tensor) -> int:
        return packed_nbytes(tensor) if repack_supports(tensor) else nbytes(tensor)

    def supports_weight(self, qtype, ne) -> bool:
        """Whether a weight of this type and shape (used as a MUL_MAT weight) can live here."""
        return repack_supports_shape(qtype, ne)

    def supports_tensor(self, t: Tensor) -> bool:
        """Whether this tensor (its type, shape, strides) is stored repacked here."""
        return repack_supports(t)

    def reads_as_weight(self, node: Tensor, t: Tensor) -> bool:
        """Whether `node` may read t (stored here) as its src0: MUL_MAT of a 2-D weight (the
        fused layout also serves MUL_MAT_ID's experts, through bind_expert_product)."""
        return node.op == Op.MUL_MAT and t.ne[2] == 1 and t.ne[3] == 1

    def bind_product(self, t: Tensor):
        """fn(rows [R, K] float, out [R, N] f32): out = rows @ t^T for a tensor stored here."""
        nibbles, scales = repacked_views(t)
        return functools.partial(_times_packed, nibbles, scales, t.ne[1])


class RepackBuffer(TorchBuffer):
    """A CPU storage whose weights are repacked as they are written (whole tensors only)."""

    ggml_layout = False

    def check_whole_write(self, tensor: Tensor, offset: int, size: int, what: str) -> None:
        """Raise unless this buffer's type repacks `tensor` and the write covers all of it."""
        if not self.buft.supports_tensor(tensor):
            raise ValueError(f"{self.name}: cannot repack {tensor.describe()}: only {what} can live "
                             f"in this repack buffer")
        if offset != 0 or size != nbytes(tensor):
            raise ValueError(f"{self.name}: {tensor.describe()} must be written whole (offset 0, "
                             f"{nbytes(tensor)} bytes), got {size} bytes at offset {offset}")

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

    def get_tensor(self, tensor: Tensor, out: torch.Tensor, offset: int, size: int) -> None:
        raise RepackedTensorError(f"{self.name}: {tensor.describe()} is stored repacked for the CPU's "
                                  f"int4 GEMM, not as ggml blocks: its bytes cannot be read back "
                                  f"(load the weight with repack=False to read it)")

    def memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        raise RepackedTensorError(f"{self.name}: cannot memset {tensor.describe()}: repack buffers "
                                  f"only take whole ggml-format weights")

    def cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        return False  # the generic path writes through set_tensor, which repacks


# ---------------------------------------------------------------- what may read repacked tensors

def reads_repacked_only_as_weight(node: Tensor) -> bool:
    """False when the node would read a repacked tensor as ggml data: the only readers allowed
    are MUL_MAT (and MUL_MAT_ID, where the buffer type serves it) with the repacked tensor itself
    (not a view) as src0 and float rows. View ops read nothing."""
    if node.op in VIEW_OPS:
        return True
    for i, src in enumerate(node.src):
        if not is_repacked(src):
            continue
        b, buft = node.src[1], memory_buffer(src).buft
        if not (i == 0 and src.view_src is None and buft.reads_as_weight(node, src)
                and buft.supports_tensor(src)
                and b is not None and b.type in (Type.F32, Type.F16, Type.BF16)):
            return False
    return True


def check_repacked_reads(nodes, device_name: str) -> None:
    """Raise for a node that would read a repacked tensor as ggml data (checked before kernels
    bind their views)."""
    for node in nodes:
        if node.op not in VIEW_OPS and not reads_repacked_only_as_weight(node):
            srcs = ", ".join(s.describe() for s in node.src if is_repacked(s))
            raise UnsupportedOpError(f"op {node.op.name} on {device_name} cannot read repacked weights "
                                     f"({srcs}) for {node.describe()}: only MUL_MAT with the weight as "
                                     f"src0 can (and MUL_MAT_ID with experts in the fused layout)")


# ---------------------------------------------------------------- MUL_MAT with a repacked weight

def _times_packed(nibbles, scales, n, rows, out) -> None:
    product = torch.ops.aten._weight_int4pack_mm_for_cpu(rows.to(torch.bfloat16), nibbles, GROUP, scales)
    out.copy_(product[:, :n])


def bind_repacked_product(a: Tensor):
    """fn(rows [R, K] float, out [R, N] f32): out = rows @ a^T in a's repack buffer's layout."""
    return a.buffer.buft.bind_product(a)


RepackBufferType.buffer_class = RepackBuffer
