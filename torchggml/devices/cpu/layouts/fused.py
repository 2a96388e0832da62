"""The `fused` path's layout (the default): weights stored as (q, scale, bias), multiplied by numba.

At a repacked tensor's address (E matrices of N rows of K values, G values per group; E = ne[2]
is the number of experts of a MUL_MAT_ID weight, 1 for MUL_MAT's):

    q      int8 [E*N, K]      (4-bit types: uint8 [E*N, K/2], see below)
    scale  f32  [E*N, K/G]    (64-byte aligned after q; Q4_0: its float16 bits as int16)
    bias   f32  [E*N, K/G]    (only for types with an offset: Q4_1, Q5_1, Q2_K, Q4_K, Q5_K)

so expert e's (q, scale, bias) is the slab of rows e*N .. e*N + N-1 of each.

Every block type llama.cpp's CPU backend multiplies is written so at load (decompose.py), which
costs 8 bits a weight plus the scales instead of 5.5-8.5: the price of loops LLVM vectorizes.
The 4-bit types Q4_0, Q4_1 and Q4_K keep 4 bits, two to a byte (byte i of a 32-value group holds
values i and i + 16): Q4_0's q + 8, which the kernels take back as ggml's do, and Q4_1's and
Q4_K's q in [0, 15]. Decode streams these bytes once a token, so they bound its speed: Q4_0
4.5 bits a weight (llama.cpp's size), Q8_0 9, Q4_1 6, Q5_0 9, Q4_K 6, Q6_K 8 (float32 scales
per group), IQ4_NL and IQ4_XS 9 (int8 table values), Q2_K 12 and Q3_K 10 (against 2.63 and 3.44).
So the 2-D weights of Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and
IQ4_XS are not stored here: the same kernels read their
ggml blocks in place (IN_PLACE_KINDS, block_product; ggml's sizes, nothing converted at load, no
second copy; IQ4_NL's and IQ4_XS's nibbles through their value table, one byte shuffle per 32
values); their experts (3-D, for MUL_MAT_ID) and the other types are. Products: M < FUSED_MATMUL_MAX_ROWS rows of
activations (BLOCK_MAX_ROWS for blocks in place, INT8_GEMM_MIN_ROWS where the int8 GEMM runs;
Q4_1's, Q5_0's, Q5_1's, Q2_K's and Q3_K's blocks split their rows as the stored types: _layout_rows) run the fused matvec, four rows at a time for each weight row it reads, and so do a batched
decode step's rows however many (separate_rows: ops.mul_mat_set_separate_rows; each row then
equals its own step's). Larger micro-batches of those blocks in place (and of the stored
types from LAYOUT_INT8_MIN_ROWS) run the int8 GEMM with
ggml's per-block scales where the CPU has AVX2 or a VNNI (_int8_gemm, jit/gemm_ir.py; faster than
the bf16 path below: docs/benchmarks.md); the rest
dequantize the weight once per call into the fastest float GEMM dtype and use torch's GEMM (for
ggml's blocks in place, one LLVM vector loop a row, several times faster than the scalar loops
it replaced). MUL_MAT_ID groups
its (token, slot) pairs by expert and applies the same rule per expert: the experts with few rows
share one matvec call over their slabs (activations quantized once), each expert with many
rows is dequantized once for its GEMM; unused experts are not read.
"""
from __future__ import annotations

import functools
import threading
import weakref

import numpy as np
import torch

from ....tensor import Tensor, round_up
from ....types import Type, type_traits
from ....storage import byte_view
from ..features import fastest_gemm_dtype, int8_gemm_takes
from ..jit.loader import BoundKernel, gemm_kernels, numba_available, op_kernels, quant_kernels, repack_kernels
from .base import RepackBuffer, RepackBufferType, is_whole_contiguous
from .decompose import DECOMPOSE, HAS_BIAS, decompose, group_size
from ..jit.gemm_ir import PANEL_ROWS, gemm_isa, kind_params
from ..jit.llvm_ir import IQ4_NL_KIND, LOW_K_KINDS, OFFSET_BLOCK_KINDS

ALIGN = 64
# MUL_MAT_ID's experts: one with fewer rows than this goes through the fused matvec (its rows
# one at a time), one with more is dequantized for a GEMM
FUSED_MAX_ROWS = 4
# MUL_MAT's rows of the converted types go through the matvec (quant_kernels.ROWS at a time,
# rows_dot: each weight row loaded and unpacked once for them) below this many rows; from it on,
# dequantized for the float GEMM. The matvec would win up to 16 to 24 rows (scripts/
# bench_cpu_quant.py --rows), but it rounds the activations to int8 as ggml's vec_dot does, and a
# prompt's few tokens through it moved the real files' logits from a float64 reference (SmolLM2
# 0.017 -> 0.031, Gemma 3 0.037 -> 0.042) and Gemma's greedy first token off llama.cpp's
# (tests/test_real_models.py): the product cannot tell a batched decode step from a short prompt
FUSED_MATMUL_MAX_ROWS = 4
# ggml's blocks in place: the matvec reads each weight row once for all activation rows and wins
# up to ~10 rows against dequantizing for the GEMM (scripts/bench_cpu_quant.py): batched decode of
# up to 9 sequences stays fused
BLOCK_MAX_ROWS = 10
# where the int8 GEMM runs (_int8_gemm), it wins from this many rows on (its panels cost about
# what the matvec of 2-4 rows does)
INT8_GEMM_MIN_ROWS = 6
# the stored types' rows (gemm_ir.LAYOUT_KINDS) take the int8 GEMM from this many rows; 4 to 15
# rows keep the float GEMM, whose bf16 activations round finer than int8 blocks: a prompt of a
# few tokens is where one rounding decides a near-tie (Gemma 3 270M's 6-token logits: 0.046 from
# float64 through int8, 0.037 through bf16, llama.cpp's 0.044), while on longer prompts the int8
# GEMM's logits are as close as the float GEMM's and closer than llama.cpp's (docs/cpu.md)
LAYOUT_INT8_MIN_ROWS = 16
# rows are decomposed this many values at a time at load: the chunk's temporaries (int64
# indices among them) are freed into malloc's heap, where they stay resident (glibc serves
# blocks under its mmap threshold from there, and the threshold rises to the largest block
# freed); 4M values left ~50 MB there after converting IQ4_NL's tied 49k x 576 head
CONVERT_ROWS_VALUES = 1 << 20


# types whose activations ggml rounds to Q8_0/Q8_1 blocks, which store the scale in float16
# (the K-quants and IQ4_XS use Q8_K: float32 scales). Rounding ours alike keeps MoE routers on
# llama.cpp's choice: the llama-moe Q4_0 model's decode logits move 6.5e-2 from llama.cpp's
# with float32 scales (one token's top-2 experts flip), 2.2e-2 with float16 ones.
F16_ACTIVATION_SCALES = frozenset({Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1, Type.Q8_0, Type.IQ4_NL,
                                   Type.MXFP4})
# 4-bit types stored two values to a byte, and whether the kernels subtract 8 (Q4_0's signed
# values, as ggml's kernels do) or add the bias (Q4_1, Q4_K: q is already in [0, 15])
NIBBLE_SIGNED = {Type.Q4_0: True, Type.Q4_1: False, Type.Q4_K: False}
# Q6_K's values (q + 32 in [0, 63]) in 6 bits: 24 bytes per 32 values (kernels.matvec)
SIX_BIT = frozenset({Type.Q6_K})
# types whose group scale is stored as its block's float16 (int16 bits; exact): Q4_0 at 4.5 bits
# a weight as llama.cpp (5 with float32 scales). The int8-stored types keep float32 scales:
# their matvec is bound by arithmetic, not bytes, and converting a half per group made the Q8_0
# matvec slower.
HALF_SCALES = frozenset({Type.Q4_0})


def _has_bias(qtype) -> bool:
    return qtype in HAS_BIAS


def _q_bytes(qtype, n_values: int) -> int:
    return n_values // 2 if qtype in NIBBLE_SIGNED else n_values * 3 // 4 if qtype in SIX_BIT else n_values


def _scale_bytes(qtype) -> int:
    return 2 if qtype in HALF_SCALES else 4


def supports_shape(qtype, ne) -> bool:
    """A 2-D (MUL_MAT) or 3-D (MUL_MAT_ID experts) weight of a decomposed type."""
    ne = list(ne) + [1] * (4 - len(ne))
    return qtype in DECOMPOSE and ne[3] == 1 and ne[0] % group_size(qtype) == 0


def _layout(t: Tensor) -> tuple[int, int, int, int, int, int]:
    """(rows E*N, K, G, scale offset, bias offset, total bytes)."""
    k, n = t.ne[0], t.ne[1] * t.ne[2]
    g = group_size(t.type)
    scale_at = round_up(_q_bytes(t.type, n * k), ALIGN)
    bias_at = round_up(scale_at + n * (k // g) * _scale_bytes(t.type), ALIGN)
    total = bias_at + (n * (k // g) * 4 if _has_bias(t.type) else 0)
    return n, k, g, scale_at, bias_at, total


def packed_views(t: Tensor):
    """(q int8 [E*N, K] or nibbles uint8 [E*N, K/2], scale f32 [E*N, K/G] (int16 float16 bits for
    HALF_SCALES types), bias f32 [E*N, K/G] or None) at t's address."""
    n, k, g, scale_at, bias_at, total = _layout(t)
    raw = byte_view(t.buffer, t.data - t.buffer.base, total)
    q = raw[:_q_bytes(t.type, n * k)].view(n, -1)
    if not (t.type in NIBBLE_SIGNED or t.type in SIX_BIT):
        q = q.view(torch.int8)
    scale_dtype = torch.int16 if t.type in HALF_SCALES else torch.float32
    scale = raw[scale_at:scale_at + n * (k // g) * _scale_bytes(t.type)].view(scale_dtype).view(n, k // g)
    bias = raw[bias_at:total].view(torch.float32).view(n, k // g) if _has_bias(t.type) else None
    return q, scale, bias


class FusedBufferType(RepackBufferType):
    """CPU memory holding weights as (q, scale, bias) for the fused numba products."""

    def supports_weight(self, qtype, ne) -> bool:
        """The loader's question: 2-D weights of the IN_PLACE_KINDS' types are multiplied in place
        instead (is_in_place)."""
        return supports_shape(qtype, ne) and not is_in_place(qtype, ne)

    def supports_tensor(self, t: Tensor) -> bool:
        return is_whole_contiguous(t) and supports_shape(t.type, t.ne)

    def layout_nbytes(self, t: Tensor) -> int:
        return _layout(t)[5]

    def bind_product(self, t: Tensor, separate_rows: bool = False):
        """fn(rows [R, K] float, out [R, N] f32): out = rows @ t^T."""
        return _bound_product(_Packed.of(t), separate_rows)

    def bind_rows_product(self, t: Tensor, rows: torch.Tensor, out: torch.Tensor, separate_rows: bool = False):
        """A decode step's product of a 2-D weight bound once (bound_matvec), or None."""
        return bound_matvec(_Packed.of(t), rows, out, separate_rows)

    def bind_expert_product(self, t: Tensor, separate_rows: bool = False):
        """fn(acts, pair_rows, pair_experts, out) for MUL_MAT_ID (kernels.matmul.bind_mul_mat_id)."""
        return functools.partial(_expert_product, _Packed.of(t), separate_rows=separate_rows)


class FusedBuffer(RepackBuffer):
    def set_tensor(self, tensor: Tensor, data: torch.Tensor, offset: int, size: int) -> None:
        self.check_whole_write(tensor, offset, size, f"contiguous 2-D or 3-D weights of types "
                                                     f"{', '.join(sorted(t.name for t in DECOMPOSE))}")
        q, scale, bias = packed_views(tensor)
        blocks = data[:size].reshape(q.shape[0], -1).cpu()
        if tensor.type in NATIVE_REPACK and numba_available():
            _native_repack(tensor.type, blocks, q, scale, bias)
        else:
            _torch_repack(tensor.type, tensor.ne[0], blocks, q, scale, bias)


# types whose blocks native code converts (jit/repack_kernels.py: every row once, in parallel)
NATIVE_REPACK = frozenset({Type.Q8_0, Type.Q4_0, Type.Q4_K, Type.Q6_K, Type.Q4_1, Type.Q5_0, Type.Q5_1})


def _native_repack(qtype, blocks, q, scale, bias) -> None:
    kernels = repack_kernels()
    b = blocks.numpy()
    if qtype == Type.Q8_0:
        kernels.repack_q8_0(b, q.view(torch.uint8).numpy(), scale.numpy())
    elif qtype == Type.Q4_0:
        kernels.repack_q4_0(b, q.numpy(), scale.numpy().view(np.uint16))
    elif qtype == Type.Q4_K:
        kernels.repack_q4_k(b, q.numpy(), scale.numpy(), bias.numpy())
    elif qtype == Type.Q4_1:
        kernels.repack_q4_1(b, q.numpy(), scale.numpy(), bias.numpy())
    elif qtype in (Type.Q5_0, Type.Q5_1):
        kernels.repack_q5(b, q.numpy(), scale.numpy(), _NO_BIAS if bias is None else bias.numpy(), qtype == Type.Q5_1)
    else:
        kernels.repack_q6_k(b, q.numpy(), scale.numpy())


def _torch_repack(qtype, k: int, blocks, q, scale, bias) -> None:
    """The other types (and every type without numba): decompose.py in torch, rows in chunks."""
    step = max(1, CONVERT_ROWS_VALUES // k)
    for r0 in range(0, q.shape[0], step):  # chunks of rows bound the temporaries
        pq, ps, pb = decompose(qtype, blocks[r0:r0 + step], k)
        if qtype in NIBBLE_SIGNED:
            pq = _as_nibbles(pq, -8 if NIBBLE_SIGNED[qtype] else 0)
        elif qtype in SIX_BIT:
            pq = _as_six_bits(pq)
        q[r0:r0 + step].copy_(pq)
        scale[r0:r0 + step].copy_(ps.half().view(torch.int16) if qtype in HALF_SCALES else ps)
        if bias is not None:
            bias[r0:r0 + step].copy_(pb)


def _as_nibbles(q, offset: int):
    """q [rows, K] in [offset, offset + 15] -> uint8 [rows, K/2] of u = q - offset, two a byte."""
    u = (q.to(torch.int16) - offset).to(torch.uint8).view(q.shape[0], -1, 2, 16)
    return (u[:, :, 0] | (u[:, :, 1] << 4)).reshape(q.shape[0], -1)


def _as_six_bits(q):
    """q [rows, K] in [-32, 31] -> uint8 [rows, 3K/4]: per 32 values u = q + 32, 16 bytes of low
    nibbles (byte i: values i and i + 16) and 8 bytes of high bits (byte b: values b, b + 8,
    b + 16, b + 24, two bits each)."""
    u = (q.to(torch.int16) + 32).to(torch.uint8).view(q.shape[0], -1, 32)
    low = (u[..., :16] & 15) | ((u[..., 16:] & 15) << 4)
    high = (u >> 4).view(q.shape[0], -1, 4, 8)
    high = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    return torch.cat([low, high], dim=2).reshape(q.shape[0], -1)


FusedBufferType.buffer_class = FusedBuffer


_NO_BIAS = np.zeros((1, 1), np.float32)  # float32 keeps the kernels' arithmetic in float32


class _Packed:
    """A repacked weight's arrays as numpy (what numba takes), bound once; n rows per matrix."""

    def __init__(self, qtype, q, scale, bias, n: int):
        self.qtype, self.n = qtype, n
        self.nibbles, self.six_bits = qtype in NIBBLE_SIGNED, qtype in SIX_BIT
        self.signed = NIBBLE_SIGNED.get(qtype, False)
        self.k = q.shape[1] * 2 if self.nibbles else q.shape[1] * 4 // 3 if self.six_bits else q.shape[1]
        self.g = group_size(qtype)
        # the matvec's kind (kernels.matvec)
        self.kind = (-4 if self.signed else 4) if self.nibbles else 6 if self.six_bits else self.g
        self.q, self.scale = q, scale
        self.has_bias = bias is not None
        self.bias = bias if bias is not None else _NO_BIAS  # unread without a bias

    blocks = False  # q holds ggml's blocks in place (block_product)

    @classmethod
    def of(cls, t: Tensor) -> "_Packed":
        q, scale, bias = (None if v is None else v.numpy() for v in packed_views(t))
        return cls(t.type, q, scale, bias, t.ne[1])

    @classmethod
    def of_blocks(cls, qtype, raw: torch.Tensor) -> "_Packed":
        """A 2-D weight's ggml blocks, uint8 [N, row bytes], of a type in IN_PLACE_KINDS."""
        p = cls.__new__(cls)
        p.qtype, p.n, p.q, p.blocks = qtype, raw.shape[0], raw.numpy(), True
        p.kind, p.g = IN_PLACE_KINDS[qtype], group_size(qtype)
        p.k = raw.shape[1] // type_traits(qtype).type_size * type_traits(qtype).blck_size
        return p

    def matrix(self, e: int) -> "_Packed":
        """Expert e's slab (a view)."""
        rows = slice(e * self.n, (e + 1) * self.n)
        return _Packed(self.qtype, self.q[rows], self.scale[rows],
                       self.bias[rows] if self.has_bias else None, self.n)


_scratch = threading.local()

# the GEMM dtypes a weight dequantizes into, and the numpy dtype the kernels write them as
_KERNEL_DTYPES = {torch.float32: torch.float32, torch.bfloat16: torch.uint16}


def _scratch_buffer(n_values: int, dtype: torch.dtype) -> torch.Tensor:
    """A per-thread buffer of at least n_values of dtype (the dequantized micro-batch weight)."""
    bufs = getattr(_scratch, "bufs", None)
    if bufs is None:
        bufs = _scratch.bufs = {}
    buf = bufs.get(dtype)
    if buf is None or buf.numel() < n_values:
        buf = bufs[dtype] = torch.empty(n_values, dtype=dtype)
    return buf[:n_values]


def dequantized(p: _Packed, dtype: torch.dtype = torch.float32, start: int = 0, stop: int | None = None) -> torch.Tensor:
    """The (one-matrix) weight's rows [start, stop) as [rows, K] of dtype (float32 or bfloat16,
    rounded to nearest even), in a per-thread scratch buffer."""
    stop = p.n if stop is None else stop
    w = _scratch_buffer((stop - start) * p.k, _KERNEL_DTYPES[dtype]).view(stop - start, p.k)
    kernels, rows = quant_kernels(), slice(start, stop)
    if p.blocks:
        kernels.dequantize_blocks(p.q[rows], p.kind, w.numpy())
    elif p.six_bits:
        kernels.dequantize_six_bits(p.q[rows], p.scale[rows], w.numpy())
    elif p.nibbles:
        kernels.dequantize_nibbles(p.q[rows], p.scale[rows], p.bias[rows] if p.has_bias else p.bias, p.has_bias,
                                   p.signed, w.numpy())
    else:
        kernels.dequantize_rows(p.q[rows], p.scale[rows], p.bias[rows] if p.has_bias else p.bias, p.has_bias,
                                w.numpy())
    return w.view(dtype)


# a micro-batch's weight is dequantized this many bytes of rows at a time, each chunk multiplied
# while it is in the cache (as the F16 weights' chunks: products.CONVERT_CHUNK_BYTES)
DEQUANT_CHUNK_BYTES = 4 << 20


def _gemm(p: _Packed, rows: torch.Tensor, out: torch.Tensor) -> None:
    """out = rows @ W^T, rows and out in float32 or bfloat16; W dequantized once into that dtype,
    a chunk of its rows at a time."""
    chunk = max(16, DEQUANT_CHUNK_BYTES // (rows.element_size() * p.k))
    if chunk >= p.n:
        torch.mm(rows, dequantized(p, rows.dtype).T, out=out)
        return
    for start in range(0, p.n, chunk):
        stop = min(p.n, start + chunk)
        torch.mm(rows, dequantized(p, rows.dtype, start, stop).T, out=out[:, start:stop])


def _matvec(p: _Packed, x: torch.Tensor, x_row: np.ndarray, w_row0: np.ndarray, out: torch.Tensor) -> None:
    """out[i] = W[w_row0[i] : w_row0[i] + N] @ x[x_row[i]]: every x row quantized once to int8 per
    group, as ggml's vec_dot_type (Q8_0) does, then the fused matvec."""
    kernels = quant_kernels()
    xf = x.float().contiguous().numpy()
    xq = np.empty(xf.shape, np.int8)
    if p.blocks and p.kind in Q8_K_KINDS:  # one scale per 256 and the sums of 16, as ggml
        xd = np.empty((xf.shape[0], p.k // 256), np.float32)
        xsum = np.empty((xf.shape[0], p.k // 16), np.int16)
        kernels.quantize_rows_q8_k(xf, xq, xd, xsum)
    else:
        xd = np.empty((xf.shape[0], p.k // p.g), np.float32)
        xsum = np.empty_like(xd)
        kernels.quantize_rows(xf, p.g, xq, xd, xsum)
    if p.qtype in F16_ACTIVATION_SCALES:
        xd[:] = xd.astype(np.float16)
    target = out if out.is_contiguous() else torch.empty(out.shape, dtype=torch.float32)
    if p.blocks and p.kind in OFFSET_BLOCK_KINDS:
        kernels.offset_block_matvec(p.q, p.kind, w_row0, xq, xd, xsum, x_row, target.numpy())
    elif p.blocks and p.kind in LOW_K_KINDS:
        kernels.low_k_block_matvec(p.q, p.kind, w_row0, xq, xd, xsum, x_row, target.numpy())
    elif p.blocks:
        kernels.block_matvec(p.q, p.kind, w_row0, xq, xd, xsum, x_row, target.numpy())
    else:
        kernels.matvec(p.q, p.scale, p.bias, p.has_bias, p.kind, w_row0, xq, xd, xsum, x_row, target.numpy())
    if target is not out:
        out.copy_(target)


def bound_matvec(p: _Packed, rows: torch.Tensor, out: torch.Tensor, separate_rows: bool = False):
    """A decode step's matvec of weight p by float32 rows [M, K] into out [M, N] (both
    contiguous, M below the matvec's limit unless the rows are separate sequences' (_product);
    else None), bound once: numpy views of the fixed memory and the rounded activations' buffers
    made here, so a call is one numba kernel (rows_block_matvecs for ggml's blocks in place,
    rows_matvec for the converted layout: each rounds the rows and multiplies), not torch and
    numpy calls around three, and a native run (native_plan.py) holds it with the step's other
    kernels."""
    if not (rows.dtype == torch.float32 and rows.is_contiguous() and out.is_contiguous()
            and (separate_rows or rows.shape[0] < _matvec_max_rows(p))):
        return None
    m = rows.shape[0]
    x_row, w_row0 = _plain_rows(m)
    xq = np.empty(tuple(rows.shape), np.int8)
    if not p.blocks:
        xd = np.empty((m, p.k // p.g), np.float32)
        return BoundKernel(quant_kernels().rows_matvec, p.q, p.scale, p.bias, p.has_bias, p.kind,
                           p.qtype in F16_ACTIVATION_SCALES, rows.numpy(), xq, xd, np.empty_like(xd), w_row0, x_row,
                           out.numpy())
    q8_k = p.kind in Q8_K_KINDS
    xd = np.empty((m, p.k // (256 if q8_k else p.g)), np.float32)  # Q2_K's, Q3_K's per 16
    xsum = np.empty((m, 0 if q8_k else p.k // p.g), np.float32)  # Q8_0's sums, or Q8_K's:
    bsums = np.empty((m, p.k // 16 if q8_k else 0), np.int16)
    minus = np.empty((m, 8 * ((p.k // 32 + 1) // 2) if p.kind in PAIRED_KINDS else 0), np.int32)
    none = np.empty((m, 0), np.float32)  # rows_block_matvecs' unused second and third products
    return BoundKernel(quant_kernels().rows_block_matvecs, p.q, p.q[:0], p.q[:0], p.kind, rows.numpy(), xq, xd, xsum,
                       bsums, minus, w_row0, x_row, out.numpy(), none, none)


def _grouped_with(first: BoundKernel, call: BoundKernel) -> BoundKernel | None:
    """first (rows_block_matvecs of one or two products) and call (of one) as one call, where
    both multiply the same rows by weights of the same kind and first has a free place."""
    a, b = first.args, call.args
    if first.kernel is not call.kernel or b[13].shape[1] or a[14].shape[1] or b[3] != a[3]:
        return None
    if not (_same_memory(b[4], a[4]) and np.array_equal(b[10], a[10]) and np.array_equal(b[11], a[11])):
        return None
    weights = [w for w in a[:3] if w.shape[0]] + [b[0]]
    outs = [o for o in a[12:] if o.shape[1]] + [b[12]]
    weights += [a[0][:0]] * (3 - len(weights))
    outs += [a[14]] * (3 - len(outs))
    return BoundKernel(first.kernel, *weights, *a[3:12], *outs)


def _same_memory(u: np.ndarray, v: np.ndarray) -> bool:
    return u.ctypes.data == v.ctypes.data and u.shape == v.shape and u.dtype == v.dtype


def _touches(u: np.ndarray, call, reading: bool) -> bool:
    """Whether call may write u (reading: u is only read by the product that moves past call)
    or touch it at all (else); a call that is not a bound kernel: its memory is unknown."""
    if not isinstance(call, BoundKernel):
        return True
    skip = 4 if reading and call.kernel is quant_kernels().rows_block_matvecs else -1  # its rows: read only
    return any(np.shares_memory(u, a) for i, a in enumerate(call.args)
               if i != skip and isinstance(a, np.ndarray) and a.size)


def group_matvecs(calls: list) -> list:
    """A decode step's bound calls with the products of the same rows by weights of the same kind
    (q, k and v; gate and up) as one rows_block_matvecs call each, at the first one's place: the
    rows rounded once and one parallel region, not three. A product moves up past the calls
    between (GROUP_REACH at most) where none of them writes its rows; where one touches its
    output (memory the step's allocator gave to an earlier output too), it writes into a buffer
    of its own and a copy at its place moves the values."""
    out = []
    for call in calls:
        merged = False
        if isinstance(call, BoundKernel) and call.kernel is quant_kernels().rows_block_matvecs:
            rows, target, private = call.args[4], call.args[12], False
            for back in range(len(out) - 1, max(-1, len(out) - 1 - GROUP_REACH), -1):
                moved = call
                if private:
                    moved = BoundKernel(call.kernel, *call.args[:12], np.empty_like(target), *call.args[13:])
                grouped = _grouped_with(out[back], moved) if isinstance(out[back], BoundKernel) else None
                if grouped is not None:
                    out[back], merged = grouped, True
                    if private:
                        shape = (1, 1, *target.shape)
                        out.append(BoundKernel(op_kernels().copy, moved.args[12].reshape(shape), target.reshape(shape)))
                    break
                if _touches(rows, out[back], reading=True):
                    break
                private = private or _touches(target, out[back], reading=False)
        if not merged:
            out.append(call)
    return out


def _gemm_buffers(key: tuple, make):
    """This Python thread's buffers for key, made once (a prompt's products reuse them)."""
    bufs = getattr(_scratch, "gemm", None)
    if bufs is None:
        bufs = _scratch.gemm = {}
    if key not in bufs:
        if len(bufs) > 64:  # many shapes seen (varying micro-batch sizes): start over
            bufs.clear()
        bufs[key] = make()
    return bufs[key]


def _int8_gemm(p: _Packed, rows: torch.Tensor, out: torch.Tensor) -> None:
    """out = rows @ W^T for ggml's blocks in place (IN_PLACE_KINDS), or the fused
    layout's rows of a type _layout_gemm_kind names (N a multiple of PANEL_ROWS): the rows
    rounded to int8 as the matvec rounds them (ggml's Q8_0, Q8_K for the K-quants blocks), the
    weight's rows laid out PANEL_ROWS at a time into each thread's panel and multiplied by int8
    dot products with the weight's per-group scales (jit/gemm_ir.py)."""
    import numba
    m, k = rows.shape
    kind = p.kind if p.blocks else _layout_gemm_kind(p)
    group, zero, scale_block = kind_params(kind, gemm_isa())
    threads = numba.config.NUMBA_NUM_THREADS
    panels, scales, mins = _gemm_buffers(("panel", k), lambda: (
        np.empty((threads, k * PANEL_ROWS // 4), np.uint32),
        np.empty((threads, (k // 16 + k // 32) * PANEL_ROWS), np.float32),  # Q2_K's, Q3_K's d per 32
        np.empty((threads, k // 16 * PANEL_ROWS), np.float32)))
    xq, dx, xz, xm = _gemm_buffers(("rows", m, k, group, scale_block), lambda: (
        np.empty((m, k), np.int8), np.empty((m, k // scale_block), np.float32), np.empty((m, k // group), np.int32),
        np.empty((m, k // group), np.float32)))
    kernels = gemm_kernels()
    kernels.quantize_activations(rows.float().contiguous().numpy(), group, zero, scale_block, xq, dx, xz, xm)
    target = out if out.is_contiguous() else torch.empty(out.shape, dtype=torch.float32)
    if p.blocks and kind in LOW_K_KINDS:
        kernels.low_k_panel_gemm(p.q, kind, xq, dx, xz, xm, target.numpy(), panels.view(np.uint8), scales, mins)
    elif p.blocks and kind in OFFSET_BLOCK_KINDS:
        kernels.offset_panel_gemm(p.q, kind, xq, dx, xz, xm, target.numpy(), panels.view(np.uint8), scales, mins)
    elif p.blocks:
        kernels.panel_gemm(p.q, kind, xq, dx, xz, xm, target.numpy(), panels.view(np.uint8), scales, mins)
    else:
        kernels.layout_panel_gemm(p.q.view(np.uint32), p.scale, p.bias, kind, xq, dx, xz, xm, target.numpy(),
                                  panels, scales, mins)
    if target is not out:
        out.copy_(target)


def bound_int8_gemm(p: _Packed, rows: torch.Tensor, out: torch.Tensor):
    """A prompt's product of ggml's blocks in place p by float32 rows [M, K] into out [M, N]
    (both contiguous) where the int8 GEMM takes M rows (_route), else None, bound once: one
    kernel rounds the rows and multiplies (gemm_kernels.rows_block_gemm), what _int8_gemm does
    in two calls and Python around them. Products of the same rows can share one rounding
    (shared_rounding)."""
    if not (p.blocks and rows.dtype == torch.float32 and rows.is_contiguous() and out.is_contiguous()):
        return None
    matvec_max_rows, int8_min_rows, _ = _route(p)
    if rows.shape[0] < max(matvec_max_rows, int8_min_rows):
        return None
    import numba
    group, zero, scale_block = kind_params(p.kind, gemm_isa())
    return BoundKernel(gemm_kernels().rows_block_gemm, p.q, p.kind, rows.numpy(), group, zero, scale_block,
                       out.numpy(), numba.config.NUMBA_NUM_THREADS, *_NO_ROUNDED_ROWS, False)


# rows_block_gemm's rounded rows (xq, dx, xz, xm) when the call rounds into areas of its own
_NO_ROUNDED_ROWS = (np.empty((0, 0), np.int8), np.empty((0, 0), np.float32), np.empty((0, 0), np.int32),
                    np.empty((0, 0), np.float32))


def rounding_key(fn):
    """For a bound int8 GEMM (bound_int8_gemm): (the rows' address, shape, and how they are
    rounded), equal for the products whose rows one rounding serves; else None."""
    if getattr(getattr(fn, "kernel", None), "__name__", None) != "rows_block_gemm":
        return None
    x, group, zero, scale_block = fn.args[2:6]
    return x.ctypes.data, x.shape, group, zero, scale_block


def shared_rounding(fn, areas: dict, rounded: bool):
    """fn (a bound int8 GEMM) rounding its rows into areas (a dict of arrays by shape, shared by
    calls that do not run between another's rounding and use) or, where `rounded`, reading the
    rounding an earlier call made there."""
    x, group, _zero, scale_block = fn.args[2:6]
    (m, k) = x.shape

    def area(name, shape, dtype):
        if (name, shape) not in areas:
            areas[name, shape] = np.empty(shape, dtype)
        return areas[name, shape]
    rows = (area("xq", (m, k), np.int8), area("dx", (m, k // scale_block), np.float32),
            area("xz", (m, k // group), np.int32), area("xm", (m, k // group), np.float32))
    return BoundKernel(fn.kernel, *fn.args[:8], *rows, rounded)


def _layout_gemm_kind(p: _Packed) -> int | None:
    """The int8 GEMM's kind for a weight in the fused layout (gemm_ir.LAYOUT_KINDS): int8 q in
    groups of 32 or 16, with or without a bias (Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4),
    Q4_1's nibbles and bias; None for the others (Q4_0's half scales, Q6_K's 6 bits: their
    2-D weights are multiplied in place)."""
    if p.blocks or p.six_bits or p.qtype in HALF_SCALES:
        return None
    if p.nibbles:
        return 4 if p.has_bias and not p.signed else None
    return p.g + int(p.has_bias)


@functools.lru_cache(maxsize=64)
def _plain_rows(m: int) -> tuple[np.ndarray, np.ndarray]:
    """MUL_MAT's (x_row, w_row0): output row i reads activation row i and the one matrix."""
    return np.arange(m, dtype=np.int64), np.zeros(m, dtype=np.int64)


def _takes_int8_gemm(p: _Packed) -> bool:
    kind = p.kind if p.blocks else _layout_gemm_kind(p)
    return kind is not None and p.n % PANEL_ROWS == 0 and int8_gemm_takes(kind)


def _layout_rows(p: _Packed) -> bool:
    """Whether p's products split their rows as the fused layout's (FUSED_MATMUL_MAX_ROWS,
    LAYOUT_INT8_MIN_ROWS): the converted types, and Q4_1's, Q5_0's, Q5_1's, Q2_K's and Q3_K's blocks in place,
    which were converted before and keep the numerics the real models' tests hold them to."""
    return not p.blocks or p.kind in OFFSET_BLOCK_KINDS or p.kind in LOW_K_KINDS


def _matvec_max_rows(p: _Packed) -> int:
    """The fused matvec takes fewer activation rows than this; the GEMMs the rest."""
    if not _layout_rows(p):
        return INT8_GEMM_MIN_ROWS if _takes_int8_gemm(p) else BLOCK_MAX_ROWS
    return FUSED_MATMUL_MAX_ROWS


def _int8_gemm_min_rows(p: _Packed) -> int:
    """The int8 GEMM takes this many rows and more (where it takes the weight's kind)."""
    return LAYOUT_INT8_MIN_ROWS if _layout_rows(p) else INT8_GEMM_MIN_ROWS


def _route(p: _Packed) -> tuple[int, int, torch.dtype]:
    """Which product takes how many rows of p, as the CPU and the environment choose it: (the
    matvec's rows: fewer than this, the int8 GEMM's: this many and more, or a number past any
    micro-batch where it does not take p, the float GEMM's dtype)."""
    return (_matvec_max_rows(p), _int8_gemm_min_rows(p) if _takes_int8_gemm(p) else 1 << 62, fastest_gemm_dtype())


def _product(p: _Packed, rows: torch.Tensor, out: torch.Tensor, separate_rows: bool = False, route=None) -> None:
    """out = rows @ W^T. separate_rows: the rows are separate sequences' tokens (a batched decode
    step): all of them take the matvec, which multiplies each row as it multiplies one alone.
    route: _route(p), chosen when the product was bound (a prompt's products then read no
    environment)."""
    m = rows.shape[0]
    matvec_max_rows, int8_min_rows, dtype = route or _route(p)
    if separate_rows or m < matvec_max_rows:
        _matvec(p, rows, *_plain_rows(m), out)
    elif m >= int8_min_rows:
        _int8_gemm(p, rows, out)
    elif dtype == torch.float32:
        _gemm(p, rows.float(), out)
    else:
        part = torch.empty(m, p.n, dtype=dtype)
        _gemm(p, rows.to(part.dtype), part)
        out.copy_(part)


def _bound_product(p: _Packed, separate_rows: bool):
    """fn(rows, out): _product of p with its route chosen now."""
    return functools.partial(_product, p, separate_rows=separate_rows, route=_route(p))


# 2-D weights of these types are multiplied on ggml's blocks in place (kernels.block_matvec,
# offset_block_matvec for Q4_1, Q5_0, Q5_1, low_k_block_matvec for Q2_K, Q3_K; the row_dot kind is
# the block's bytes, but IQ4_NL's, which are Q4_0's): the loader leaves them in the file's mapping
# (nothing to convert at load, no second copy, and Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, IQ4_NL,
# IQ4_XS, Q2_K and Q3_K read at their 5, 5.5, 6, 4.5, 5.5, 6.56, 4.5, 4.25, 2.63 and 3.44 bits a
# weight instead of 6, 9, 10, 6, 8, 8, 9, 9, 12 and 10 here)
IN_PLACE_KINDS = {Type.Q8_0: 34, Type.Q4_0: 18, Type.Q4_K: 144, Type.Q5_K: 176, Type.Q6_K: 210,
                  Type.Q4_1: 20, Type.Q5_0: 22, Type.Q5_1: 24, Type.IQ4_XS: 136, Type.IQ4_NL: IQ4_NL_KIND,
                  Type.Q2_K: 84, Type.Q3_K: 110}
# the in-place kinds whose activations are rounded as ggml's Q8_K (Q4_K, Q5_K, Q6_K, IQ4_XS: one scale
# per 256 values; their kernels sum a block's scaled groups as integers, as ggml's). Q2_K's and
# Q3_K's round as the converted layout's did (per 16 values in the matvec, per 32 in the int8
# GEMM, bf16 in the float GEMM): Q8_K's coarser rounding moved the
# requantized SmolLM2 files' logits from a float64 reference as far as llama.cpp's (Q2_K 0.107 vs
# 0.047 for 45 tokens) and the seeded llama-Q2_K golden model's argmax off llama.cpp's on 2 of 16
# near-tied tokens
Q8_K_KINDS = (144, 176, 210, 136)
# Q4_0's and IQ4_NL's matvec reads its activations in pair order, with its sums' terms (rounding_ir)
PAIRED_KINDS = (18, IQ4_NL_KIND)
# how many calls back group_matvecs looks for a product of the same rows (a layer's q after its v:
# v's cache store, k, k's rope and cache store between)
GROUP_REACH = 6


_converted = weakref.WeakKeyDictionary()  # weight Tensor -> its converted _Packed (while the weight lives)


def converted(t: Tensor, raw: torch.Tensor) -> _Packed:
    """A 2-D weight's ggml blocks raw (uint8 [N, row bytes]) of a type not multiplied in place,
    converted to the fused layout once for t's lifetime (its products' plans share the copy):
    the blocks stay where they are for the other ops that read them (GET_ROWS of a tied
    embedding), at the price of a second copy of the weight."""
    p = _converted.get(t)
    if p is None:
        p = _converted[t] = packed_blocks(t.type, raw)
    return p


def converted_product(t: Tensor, raw: torch.Tensor, separate_rows: bool = False):
    """fn(rows, out) for t's MUL_MAT on its converted copy (converted)."""
    return _bound_product(converted(t, raw), separate_rows)


def packed_blocks(qtype, raw: torch.Tensor) -> _Packed:
    """A 2-D weight's ggml blocks raw (uint8 [N, row bytes]) as its products read them: in place
    (IN_PLACE_KINDS), else converted to the fused layout (as FusedBuffer.set_tensor writes it)."""
    if qtype in IN_PLACE_KINDS:
        return _Packed.of_blocks(qtype, raw)
    n, k = raw.shape[0], raw.shape[1] // type_traits(qtype).type_size * type_traits(qtype).blck_size
    g = group_size(qtype)
    q = torch.empty(n, _q_bytes(qtype, n * k) // n, dtype=torch.uint8 if qtype in NIBBLE_SIGNED or qtype in SIX_BIT
                    else torch.int8)
    scale = torch.empty(n, k // g, dtype=torch.int16 if qtype in HALF_SCALES else torch.float32)
    bias = torch.empty(n, k // g) if _has_bias(qtype) else None
    _torch_repack(qtype, k, raw, q, scale, bias)
    return _Packed(qtype, q.numpy(), scale.numpy(), None if bias is None else bias.numpy(), n)


def is_in_place(qtype, ne) -> bool:
    ne = list(ne) + [1] * (4 - len(ne))
    return qtype in IN_PLACE_KINDS and ne[2] == 1 and ne[3] == 1


def block_product(qtype, raw: torch.Tensor, separate_rows: bool = False):
    """fn(rows [R, K] float, out [R, N] f32): out = rows @ W^T for the ggml blocks raw (uint8
    [N, row bytes], rows contiguous) of a weight of the IN_PLACE_KINDS' types, as the fused
    layout's product."""
    return _bound_product(_Packed.of_blocks(qtype, raw), separate_rows)


def _expert_product(p: _Packed, acts: torch.Tensor, pair_rows: torch.Tensor, pair_experts: torch.Tensor,
                    out: torch.Tensor, separate_rows: bool = False) -> None:
    """out[i] = expert pair_experts[i] @ acts[pair_rows[i]] for every (token, slot) pair i, grouped
    by expert: the experts with few rows in one matvec over their slabs, each other used expert
    dequantized once for a GEMM of its rows (gathered and converted once for all); every expert
    on the matvec when the tokens are separate sequences' (_product). The index
    arithmetic runs in numpy: a decode step's MUL_MAT_ID costs a few numpy calls, not tens of
    torch ops."""
    experts, rows = pair_experts.numpy(), pair_rows.numpy()
    order = np.argsort(experts, kind="stable")
    few = np.ones(order.size, bool) if separate_rows else np.bincount(experts)[experts[order]] < FUSED_MAX_ROWS
    if few.any():
        sel = order[few]  # ordered by expert: an expert's rows are read while in cache
        x, x_row = acts, rows[sel]
        if acts.shape[0] > sel.size:  # a prompt's few-row experts: quantize only their rows
            needed, x_row = np.unique(x_row, return_inverse=True)
            x = acts[torch.from_numpy(needed)]
        part = torch.empty(sel.size, p.n, dtype=torch.float32)
        _matvec(p, x, x_row, experts[sel] * p.n, part)
        out.numpy()[sel] = part.numpy()
    if not few.all():
        sel = order[~few]
        chosen = experts[sel]
        starts = np.flatnonzero(np.diff(chosen, prepend=-1)).tolist() + [sel.size]
        x = acts[torch.from_numpy(rows[sel])].to(fastest_gemm_dtype())
        part = torch.empty(sel.size, p.n, dtype=x.dtype)
        for start, stop in zip(starts[:-1], starts[1:]):
            _gemm(p.matrix(int(chosen[start])), x[start:stop], part[start:stop])
        out[torch.from_numpy(sel)] = part.float()
