"""The CPU's own matrix products, as binds for its kernel table (kernels.py): a weight stored in
a CPU_REPACK layout multiplies through its buffer type's product (layouts/), a 2-D Q8_0/Q4_0/Q4_K/Q5_K/Q6_K
weight through the fused kernels on its ggml blocks in place, a 2-D F16/BF16 weight through
torch's half GEMM. Each returns None for a node it does not take."""
from __future__ import annotations

import functools

import torch

from ...tensor import memory_buffer
from ...types import Type, type_traits
from ..kernels.common import view
from ..kernels.matmul import bind_mul_mat, bind_mul_mat_id
from ...ops.matmul import mul_mat_separate_rows
from .features import cpu_path
from .jit.loader import numba_available
from .layouts.base import is_repacked
from .layouts.fused import (block_product, bound_int8_gemm, bound_matvec, converted, converted_product, is_in_place, packed_blocks,
                            supports_shape)

# from this many rows on, F16 products convert the weight to f32 (faster than torch's half GEMM
# on AVX2 and Zen 4); below, the half GEMV reads half the bytes. (bf16 would be faster on AVX512-BF16 but loses F16's precision:
# 5.6e-3 relative error on the F16 golden model, bound 2e-3.)
HALF_CONVERT_ROWS = 16
# the weight converts a chunk of rows at a time into a buffer of this size, which stays in the
# cache for its GEMM: about twice as fast as converting the whole weight first (its f32 copy went
# to memory and came back), close to bf16 (docs/benchmarks.md)
CONVERT_CHUNK_BYTES = 2 << 20


def bind_layout_product(node):
    """MUL_MAT of a weight in a CPU_REPACK buffer: its layout's product (ExtraBufferType.bind_product)."""
    a = node.src[0]
    if not is_repacked(a):
        return None
    buft, separate = memory_buffer(a).buft, mul_mat_separate_rows(node)
    if a.ne[2] == 1 and a.ne[3] == 1:
        bound = _bound_rows(node, lambda rows, out: buft.bind_rows_product(a, rows, out, separate))
        if bound is not None:
            return bound
    return bind_mul_mat(node, lambda weight: buft.bind_product(weight, separate))


def _bound_rows(node, bind):
    """A decode step's product of a 2-D weight (b 2-D: fixed rows) bound as one call,
    bind(rows [M, K], out [M, N]), or None."""
    b = node.src[1]
    if b.ne[2] != 1 or b.ne[3] != 1:
        return None
    return bind(view(b)[0, 0], view(node)[0, 0])


def bind_layout_experts(node):
    """MUL_MAT_ID of experts in a CPU_REPACK buffer: its layout's expert product (only the used
    experts are read)."""
    experts = node.src[0]
    if not is_repacked(experts):
        return None
    separate = mul_mat_separate_rows(node)
    return bind_mul_mat_id(node, lambda weight: memory_buffer(weight).buft.bind_expert_product(weight, separate))


def bind_block_product(node):
    """MUL_MAT of a 2-D Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K weight in host memory (left there by the loader, or loaded
    without repacking) on the fused path: the fused kernels read its ggml blocks in place. A 2-D
    weight of another block type there (a tied embedding, which GET_ROWS reads too, so it is not
    repacked at load) is converted once to the fused layout (layouts/fused.converted_product)."""
    a = node.src[0]
    if (cpu_path() != "fused" or is_repacked(a) or not numba_available()
            or a.nb[0] != type_traits(a.type).type_size):
        return None
    raw = view(a)[0, 0]
    if raw.stride(1) != 1:
        return None
    separate = mul_mat_separate_rows(node)
    if not is_in_place(a.type, a.ne):
        if a.ne[2] != 1 or a.ne[3] != 1 or not supports_shape(a.type, a.ne) or not raw.is_contiguous():
            return None
        bound = _bound_rows(node, lambda rows, out: bound_matvec(converted(a, raw), rows, out, separate))
        return bound if bound is not None else bind_mul_mat(node, lambda weight: converted_product(a, raw, separate))
    packed = packed_blocks(a.type, raw)
    bound = _bound_rows(node, lambda rows, out: bound_matvec(packed, rows, out, separate)
                        or (None if separate else bound_int8_gemm(packed, rows, out)))
    return bound if bound is not None else bind_mul_mat(node, lambda weight: block_product(weight.type, raw, separate))


def _times_half_cpu(weight_t, rows, out) -> None:
    """The CPU's F16/BF16 product: torch's half GEMM, many times faster than converting the
    weight at every call. Unlike ggml
    (and the reference table) it rounds each result to the half type: on the F16 golden models
    this moves the error against llama.cpp from 4.9e-4 to 6.7e-4 (the bound is 2e-3)."""
    if weight_t.dtype == torch.float16 and rows.shape[0] >= HALF_CONVERT_ROWS:
        _times_f16_in_chunks(weight_t.T, rows.float(), out)  # a micro-batch: f32 GEMMs
        return
    out.copy_(torch.matmul(rows.to(weight_t.dtype), weight_t))


def _times_f16_in_chunks(weight, rows, out) -> None:
    """out = rows @ weight.T (weight F16 [N, K], rows and out f32), the weight converted to f32
    a chunk of its rows at a time (CONVERT_CHUNK_BYTES): exact f32 products at bf16's speed."""
    n, k = weight.shape
    chunk = max(16, CONVERT_CHUNK_BYTES // (4 * k))
    buffer = torch.empty(min(chunk, n), k)
    for start in range(0, n, chunk):
        end = min(n, start + chunk)
        part = buffer[:end - start]
        part.copy_(weight[start:end])
        torch.mm(rows, part.T, out=out[:, start:end])


def _half_weight_product(a):
    return functools.partial(_times_half_cpu, view(a)[0, 0].T)


def bind_half_weight_product(node):
    """MUL_MAT of a 2-D F16/BF16 weight (ggml blocks in host memory): torch's half GEMM."""
    a = node.src[0]
    if a.type not in (Type.F16, Type.BF16) or a.ne[2] != 1 or a.ne[3] != 1 or is_repacked(a):
        return None
    return bind_mul_mat(node, _half_weight_product)
