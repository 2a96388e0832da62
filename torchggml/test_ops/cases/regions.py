"""Cases: ACC and SET (set, set_1d, set_2d; in place and not) against slicing a copy of a,
CUMSUM against torch.cumsum, DIAG against torch.diag_embed, TRI against tril/triu, FILL."""
from __future__ import annotations

import torch

import torchggml as ggml
from .values import T, randint
from .table import CaseTable

CASES = CaseTable()
case = CASES.case

_NE = [8, 6, 4, 2]


def _strided_region(x, shape, nb, offset, esize):
    """The elements of contiguous x (torch order) seen through byte strides nb (nb1, nb2, nb3)
    at a byte offset, with ggml shape `shape`: a view to read or write."""
    return x.reshape(-1).as_strided(tuple(reversed(shape)), (nb[2] // esize, nb[1] // esize, nb[0] // esize, 1),
                                    offset // esize)


def _acc_set_ref(shape_b, nb, offset, accumulate):
    def ref(a, b):
        out = a.clone()
        region = _strided_region(out, shape_b, nb, offset, 4)
        region.copy_(region + b if accumulate else b)
        return out
    return ref


# b's shape, (nb1, nb2, nb3) in elements of a [8, 6, 4, 2], offset in elements
_REGIONS = [([3, 2, 2, 1], (8, 48, 192), 9), ([8, 6, 4, 2], (8, 48, 192), 0), ([4, 3, 1, 2], (8, 48, 192), 50),
            ([2, 2, 2, 1], (16, 96, 192), 3)]

for _name, _accumulate in (("acc", True), ("set", False)):
    for _shape_b, _nb, _off in _REGIONS:
        for _inplace in (False, True):
            def _build(ctx, name=_name, shape_b=_shape_b, nb=_nb, off=_off, inplace=_inplace):
                a = ggml.new_tensor(ctx, T.F32, _NE)
                b = ggml.new_tensor(ctx, T.F32, shape_b)
                fn = getattr(ggml, name + ("_inplace" if inplace else ""))
                target = ggml.dup(ctx, a) if inplace else a
                return fn(ctx, target, b, nb[0] * 4, nb[1] * 4, nb[2] * 4, off * 4), [a, b]
            case(_name, f"b={_shape_b},nb={_nb},offset={_off},inplace={_inplace}", _build,
                 _acc_set_ref(_shape_b, [n * 4 for n in _nb], _off * 4, _accumulate), max_nmse=0)

for _type in (T.F16, T.I32):
    def _build_set_typed(ctx, type=_type):
        a = ggml.new_tensor_2d(ctx, type, 10, 5)
        b = ggml.new_tensor_2d(ctx, type, 4, 3)
        size = ggml.type_size(type)
        return ggml.set_2d(ctx, a, b, a.nb[1], (10 + 3) * size), [a, b]

    def _set_typed_ref(a, b):
        out = a.clone()
        out[..., 1:4, 3:7] = b
        return out
    case("set", f"set_2d type={_type.name}", _build_set_typed, _set_typed_ref, max_nmse=0,
         init={0: randint(-50, 50), 1: randint(-50, 50)} if _type == T.I32 else None)


def _build_set_1d(ctx):
    a = ggml.new_tensor_1d(ctx, T.F32, 20)
    b = ggml.new_tensor_1d(ctx, T.F32, 6)
    return ggml.set_1d(ctx, a, b, 7 * 4), [a, b]


def _set_1d_ref(a, b):
    out = a.clone()
    out[..., 7:13] = b
    return out


case("set", "set_1d", _build_set_1d, _set_1d_ref, max_nmse=0)


def _build_set_2d_strided(ctx):
    # rows of b written every other row of a
    a = ggml.new_tensor_2d(ctx, T.F32, 6, 8)
    b = ggml.new_tensor_2d(ctx, T.F32, 5, 3)
    return ggml.set_2d_inplace(ctx, ggml.dup(ctx, a), b, 2 * a.nb[1], a.nb[1] + 4), [a, b]


def _set_2d_strided_ref(a, b):
    out = a.clone()
    out[..., 1:7:2, 1:6] = b
    return out


case("set", "set_2d_inplace every other row", _build_set_2d_strided, _set_2d_strided_ref, max_nmse=0)


# ---------------------------------------------------------------- CUMSUM, DIAG, TRI, FILL

for _ne in ([16, 5, 3, 2], [130, 4, 1, 1], [1, 7, 2, 1]):
    def _build_cumsum(ctx, ne=_ne):
        a = ggml.new_tensor(ctx, T.F32, ne)
        return ggml.cumsum(ctx, a), [a]
    case("cumsum", f"ne={_ne}", _build_cumsum, lambda a: torch.cumsum(a, dim=-1), max_nmse=1e-12)

for _type in (T.F32, T.F16):
    def _build_diag(ctx, type=_type):
        a = ggml.new_tensor_4d(ctx, type, 7, 1, 3, 2)
        return ggml.diag(ctx, a), [a]
    case("diag", f"type={_type.name}", _build_diag, lambda a: torch.diag_embed(a[:, :, 0, :]), max_nmse=0)

# (torch function, diagonal): element (row r, column c) kept for LOWER c < r, LOWER_DIAG c <= r...
_TRI = {ggml.TriType.LOWER: (torch.tril, -1), ggml.TriType.LOWER_DIAG: (torch.tril, 0),
        ggml.TriType.UPPER: (torch.triu, 1), ggml.TriType.UPPER_DIAG: (torch.triu, 0)}

for _tri_type, (_fn, _diagonal) in _TRI.items():
    def _build_tri(ctx, tri_type=_tri_type):
        a = ggml.new_tensor_4d(ctx, T.F32, 9, 9, 3, 2)
        return ggml.tri(ctx, a, tri_type), [a]
    case("tri", f"type={_tri_type.name}", _build_tri, lambda a, fn=_fn, d=_diagonal: fn(a, d), max_nmse=0)

for _type, _c in [(T.F32, 3.25), (T.F16, -0.1), (T.F32, 0.0)]:
    def _build_fill(ctx, type=_type, c=_c):
        a = ggml.new_tensor_3d(ctx, type, 10, 4, 3)
        return ggml.fill(ctx, a, c), [a]
    _value = float(torch.tensor(_c, dtype=ggml.type_to_dtype(_type)))
    case("fill", f"type={_type.name},c={_c}", _build_fill, lambda a, v=_value: torch.full_like(a, v), max_nmse=0)


def _build_fill_inplace(ctx):
    a = ggml.new_tensor_2d(ctx, T.F32, 6, 6)
    return ggml.fill_inplace(ctx, ggml.dup(ctx, a), 7.0), [a]


case("fill", "inplace", _build_fill_inplace, lambda a: torch.full_like(a, 7.0), max_nmse=0)
