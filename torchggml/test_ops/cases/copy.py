"""Cases: CPY, DUP, CONT between F32/F16/BF16, F32 <-> I32, into block types (quantized per
destination row, checked against gguf where it quantizes the type), out of block types, block
type to itself; and every view (view_1d..4d, permute, transpose, reshape) made concrete
through CONT. All exact.
"""
from __future__ import annotations

import torch

import torchggml as ggml
from .values import T, FLOAT_TYPES, uniform, randint, rounded, ggml_permute, quantized_roundtrip
from .table import CaseTable

CASES = CaseTable()
case = CASES.case

QUANTIZE_TARGETS = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.IQ4_NL,
                    T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS, T.NVFP4, T.Q1_0, T.Q2_0)


def strided(x: torch.Tensor, ne, nb, offset: int, elsize: int) -> torch.Tensor:
    """torch-order values of a ggml view (ne, nb and offset in bytes) of contiguous values x."""
    size = tuple(reversed(ne))
    stride = tuple(n // elsize for n in reversed(nb))
    return x.flatten().as_strided(size, stride, offset // elsize)


# ---------------------------------------------------------------- float and integer conversions

for _src in FLOAT_TYPES:
    for _dst in FLOAT_TYPES:
        def _build_cpy(ctx, src=_src, dst=_dst):
            a = ggml.new_tensor_4d(ctx, src, 10, 5, 3, 2)
            b = ggml.new_tensor_4d(ctx, dst, 10, 5, 3, 2)
            return ggml.cpy(ctx, a, b), [a]
        case("cpy", f"{_src.name}->{_dst.name}", _build_cpy, lambda a, dst=_dst: rounded(dst, a), max_nmse=0)

        def _build_cpy_permuted(ctx, src=_src, dst=_dst):
            a = ggml.new_tensor_4d(ctx, src, 6, 4, 3, 2)
            b = ggml.new_tensor_4d(ctx, dst, 3, 6, 4, 2)
            return ggml.cpy(ctx, ggml.permute(ctx, a, 1, 2, 0, 3), b), [a]
        case("cpy", f"{_src.name}->{_dst.name},permuted source", _build_cpy_permuted,
             lambda a, dst=_dst: rounded(dst, ggml_permute(a, (1, 2, 0, 3))), max_nmse=0)


def _build_cast(ctx):
    a = ggml.new_tensor_2d(ctx, T.F32, 12, 5)
    return ggml.cast(ctx, ggml.transpose(ctx, a), T.F16), [a]


case("cpy", "cast F32->F16 of a transposed source", _build_cast,
     lambda a: rounded(T.F16, a.transpose(-1, -2)), max_nmse=0)


def _build_f32_to_i32(ctx):
    a = ggml.new_tensor_3d(ctx, T.F32, 9, 4, 2)
    return ggml.cpy(ctx, a, ggml.new_tensor_3d(ctx, T.I32, 9, 4, 2)), [a]


def _build_i32_to_f32(ctx):
    a = ggml.new_tensor_3d(ctx, T.I32, 4, 9, 2)
    return ggml.cpy(ctx, ggml.transpose(ctx, a), ggml.new_tensor_3d(ctx, T.F32, 9, 4, 2)), [a]


# C's float -> int conversion truncates toward zero
case("cpy", "F32->I32", _build_f32_to_i32, lambda a: a.trunc(), max_nmse=0, init={0: uniform(-100, 100)})
case("cpy", "I32->F32,transposed source", _build_i32_to_f32, lambda a: a.transpose(-1, -2).double(),
     max_nmse=0, init={0: randint(-1000, 1000)})


# ---------------------------------------------------------------- into block types

for _q in QUANTIZE_TARGETS:
    _row = max(64, ggml.blck_size(_q))   # whole blocks per row
    _half = max(32, ggml.blck_size(_q))

    def _build_quantize(ctx, q=_q, row=_row):
        a = ggml.new_tensor_3d(ctx, T.F32, row, 3, 2)
        return ggml.cpy(ctx, a, ggml.new_tensor_3d(ctx, q, row, 3, 2)), [a]
    case("cpy", f"F32->{_q.name}", _build_quantize, lambda a, q=_q: quantized_roundtrip(q, a), max_nmse=0)

    def _build_quantize_f16(ctx, q=_q, row=_half):
        a = ggml.new_tensor_2d(ctx, T.F16, row, 4)
        return ggml.cpy(ctx, a, ggml.new_tensor_2d(ctx, q, row, 4)), [a]
    case("cpy", f"F16->{_q.name}", _build_quantize_f16, lambda a, q=_q: quantized_roundtrip(q, a), max_nmse=0)

    def _build_quantize_transposed(ctx, q=_q, row=_row):
        a = ggml.new_tensor_2d(ctx, T.F32, 5, row)
        return ggml.cpy(ctx, ggml.transpose(ctx, a), ggml.new_tensor_2d(ctx, q, row, 5)), [a]
    case("cpy", f"F32->{_q.name},transposed source", _build_quantize_transposed,
         lambda a, q=_q: quantized_roundtrip(q, a.transpose(-1, -2)), max_nmse=0)

    def _build_quantize_reshaped(ctx, q=_q, row=_row):
        # same element count, other shape: rows of the destination are quantized in element order
        a = ggml.new_tensor_3d(ctx, T.F32, row // 4, 6, 2)
        return ggml.cpy(ctx, a, ggml.new_tensor_2d(ctx, q, row, 3)), [a]
    case("cpy", f"F32->{_q.name},reshaped destination", _build_quantize_reshaped,
         lambda a, q=_q, row=_row: quantized_roundtrip(q, a, row).reshape(1, 1, 3, row), max_nmse=0)


for _q in (T.Q8_0, T.Q4_K):
    def _build_quantize_into_view(ctx, q=_q):
        # rows 2..4 of a quantized cache, as a KV-cache update writes them
        row = max(64, ggml.blck_size(q))
        cache = ggml.new_tensor_2d(ctx, q, row, 8)
        rows = ggml.view_2d(ctx, cache, row, 3, cache.nb[1], 2 * cache.nb[1])
        a = ggml.new_tensor_2d(ctx, T.F32, row, 3)
        return ggml.cpy(ctx, a, rows), [a]
    case("cpy", f"F32->{_q.name},into a view of rows", _build_quantize_into_view,
         lambda a, q=_q: quantized_roundtrip(q, a), max_nmse=0)


# ---------------------------------------------------------------- out of and between block types

for _q, _dst in [(T.Q4_0, T.F32), (T.Q8_0, T.F16), (T.Q5_1, T.BF16), (T.MXFP4, T.F32), (T.IQ4_NL, T.F32)]:
    def _build_dequantize(ctx, q=_q, dst=_dst):
        a = ggml.new_tensor_3d(ctx, q, 64, 3, 2)
        return ggml.cpy(ctx, a, ggml.new_tensor_3d(ctx, dst, 64, 3, 2)), [a]
    case("cpy", f"{_q.name}->{_dst.name}", _build_dequantize, lambda a, dst=_dst: rounded(dst, a), max_nmse=0)


def _build_block_cont_rows(ctx):
    # every other row of a Q4_0 matrix, made contiguous: whole blocks move as bytes
    a = ggml.new_tensor_2d(ctx, T.Q4_0, 64, 6)
    rows = ggml.view_2d(ctx, a, 64, 3, 2 * a.nb[1], a.nb[1])
    return ggml.cont(ctx, rows), [a]


def _build_block_cpy_reshaped(ctx):
    a = ggml.new_tensor_2d(ctx, T.Q8_0, 64, 4)
    return ggml.cpy(ctx, a, ggml.new_tensor_2d(ctx, T.Q8_0, 32, 8)), [a]


def _build_block_dup(ctx):
    a = ggml.new_tensor_3d(ctx, T.Q4_1, 32, 3, 2)
    return ggml.dup(ctx, a), [a]


case("cont", "Q4_0 strided rows", _build_block_cont_rows, lambda a: a[:, :, 1::2, :], max_nmse=0)
case("cpy", "Q8_0->Q8_0,reshaped", _build_block_cpy_reshaped, lambda a: a.reshape(1, 1, 8, 32), max_nmse=0)
case("dup", "Q4_1", _build_block_dup, lambda a: a, max_nmse=0)


# ---------------------------------------------------------------- DUP and CONT of every view

def _view_case(desc, type, ne, make_view, reference):
    """cont(make_view(ctx, a)) for a leaf a of `type` and shape ne; reference(a) the expected."""
    def build(ctx):
        a = ggml.new_tensor(ctx, type, ne)
        return ggml.cont(ctx, make_view(ctx, a)), [a]
    init = {0: randint(-1000, 1000)} if type == T.I32 else None
    case("cont", desc, build, reference, max_nmse=0, init=init)


_NE = [8, 6, 4, 3]
for _type in (T.F32, T.F16, T.I32):
    for _axes in [(0, 1, 3, 2), (1, 0, 2, 3), (2, 0, 1, 3), (3, 2, 1, 0), (1, 3, 0, 2)]:
        _view_case(f"type={_type.name},permute{_axes}", _type, _NE,
                   lambda ctx, a, axes=_axes: ggml.permute(ctx, a, *axes),
                   lambda a, axes=_axes: ggml_permute(a, axes))
    _view_case(f"type={_type.name},transpose", _type, _NE, ggml.transpose, lambda a: a.transpose(-1, -2))

_ES = 4  # F32 element size in bytes
_views = [
    ("view_1d offset", lambda ctx, a: ggml.view_1d(ctx, a, 20, 7 * _ES),
     lambda a: strided(a, [20, 1, 1, 1], [_ES, 20 * _ES, 20 * _ES, 20 * _ES], 7 * _ES, _ES)),
    ("view_2d strided rows", lambda ctx, a: ggml.view_2d(ctx, a, 5, 10, 2 * 8 * _ES, 3 * _ES),
     lambda a: strided(a, [5, 10, 1, 1], [_ES, 16 * _ES, 160 * _ES, 160 * _ES], 3 * _ES, _ES)),
    ("view_3d", lambda ctx, a: ggml.view_3d(ctx, a, 4, 3, 5, 8 * _ES, 30 * _ES, 2 * _ES),
     lambda a: strided(a, [4, 3, 5, 1], [_ES, 8 * _ES, 30 * _ES, 150 * _ES], 2 * _ES, _ES)),
    ("view_4d", lambda ctx, a: ggml.view_4d(ctx, a, 3, 2, 2, 3, 8 * _ES, 48 * _ES, 192 * _ES, _ES),
     lambda a: strided(a, [3, 2, 2, 3], [_ES, 8 * _ES, 48 * _ES, 192 * _ES], _ES, _ES)),
    ("view of a view", lambda ctx, a: ggml.view_1d(ctx, ggml.view_2d(ctx, a, 8, 6, 8 * _ES, 48 * _ES), 10, 4 * _ES),
     lambda a: a.flatten()[52:62]),
    ("permute of a view", lambda ctx, a: ggml.permute(ctx, ggml.view_3d(ctx, a, 8, 6, 2, 8 * _ES, 48 * _ES, 0), 2, 0, 1, 3),
     lambda a: ggml_permute(a[:1, :2], (2, 0, 1, 3))),
    ("reshape_1d", lambda ctx, a: ggml.reshape_1d(ctx, a, 576), lambda a: a.reshape(1, 1, 1, 576)),
    ("reshape_2d", lambda ctx, a: ggml.reshape_2d(ctx, a, 24, 24), lambda a: a.reshape(1, 1, 24, 24)),
    ("reshape_3d", lambda ctx, a: ggml.reshape_3d(ctx, a, 12, 6, 8), lambda a: a.reshape(1, 8, 6, 12)),
    ("reshape_4d", lambda ctx, a: ggml.reshape_4d(ctx, a, 2, 3, 4, 24), lambda a: a.reshape(24, 4, 3, 2)),
    ("reshape like b", lambda ctx, a: ggml.reshape(ctx, a, ggml.new_tensor_2d(ctx, T.F32, 48, 12)),
     lambda a: a.reshape(1, 1, 12, 48)),
    ("reshape of a transposed copy", lambda ctx, a: ggml.reshape_2d(ctx, ggml.cont(ctx, ggml.transpose(ctx, a)), 36, 16),
     lambda a: a.transpose(-1, -2).reshape(1, 1, 16, 36)),
]
for _desc, _make, _ref in _views:
    _view_case(_desc, T.F32, _NE, _make, _ref)


def _cont_nd_case(desc, make, reference):
    def build(ctx):
        a = ggml.new_tensor(ctx, T.F32, _NE)
        return make(ctx, ggml.permute(ctx, a, 1, 0, 3, 2)), [a]
    case("cont", desc, build, lambda a: reference(ggml_permute(a, (1, 0, 3, 2))), max_nmse=0)


# cont_Nd: a permuted source's elements, in its logical order, into a new shape
_cont_nd_case("cont_1d of permuted", lambda ctx, p: ggml.cont_1d(ctx, p, 576), lambda v: v.reshape(1, 1, 1, 576))
_cont_nd_case("cont_2d of permuted", lambda ctx, p: ggml.cont_2d(ctx, p, 32, 18), lambda v: v.reshape(1, 1, 18, 32))
_cont_nd_case("cont_3d of permuted", lambda ctx, p: ggml.cont_3d(ctx, p, 6, 8, 12), lambda v: v.reshape(1, 12, 8, 6))
_cont_nd_case("cont_4d of permuted", lambda ctx, p: ggml.cont_4d(ctx, p, 4, 3, 6, 8), lambda v: v.reshape(8, 6, 3, 4))
_cont_nd_case("dup of permuted", lambda ctx, p: ggml.dup(ctx, p), lambda v: v)


# ---------------------------------------------------------------- attention's copies

def _v_transposed_case(src_type, dst_type, n_kv, head_dim=64, n_head=4):
    """cpy(permute(V cache)) as a llama graph makes V^T per head: [n_kv, head_dim * n_head]
    rows -> [n_kv, head_dim, n_head] contiguous; big ones run torch's copy over the coalesced
    2-D transpose, small ones the CPU's numba copy."""
    def build(ctx):
        v = ggml.new_tensor_2d(ctx, src_type, head_dim * n_head, n_kv)
        heads = ggml.reshape_3d(ctx, v, head_dim, n_head, n_kv)
        out = ggml.new_tensor_3d(ctx, dst_type, n_kv, head_dim, n_head)
        return ggml.cpy(ctx, ggml.permute(ctx, heads, 1, 2, 0, 3), out), [v]

    def ref(v):
        return rounded(dst_type, v.reshape(n_kv, n_head, head_dim).permute(1, 2, 0).unsqueeze(0))
    case("cpy", f"V transposed,{src_type.name}->{dst_type.name},n_kv={n_kv},heads={n_head}", build, ref,
         max_nmse=0)


for _src, _dst in [(T.F16, T.F16), (T.F32, T.F16), (T.F16, T.F32), (T.F32, T.F32)]:
    _v_transposed_case(_src, _dst, 40)
    _v_transposed_case(_src, _dst, 168, n_head=16)
