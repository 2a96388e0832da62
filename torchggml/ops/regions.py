"""Ops on regions and structure of a matrix: ACC and SET (b added to / written into a strided view
of a), CUMSUM, DIAG, TRI, FILL."""
from __future__ import annotations

from ..enums import Op, TriType
from ..tensor import Tensor, is_contiguous, nbytes, nelements
from ..types import Type, is_quantized, type_size
from ._common import new_op, same_as, require


def _check_region(op: str, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> None:
    """b's shape at byte `offset` with strides (element size, nb1, nb2, nb3) must lie inside a,
    on element boundaries (ggml asserts this when it computes)."""
    esize = type_size(a.type)
    require(not is_quantized(a.type), op, "a must be of a plain (non-block) type", a)
    require(all(v % esize == 0 for v in (nb1, nb2, nb3, offset)), op,
            f"strides ({nb1}, {nb2}, {nb3}) and offset {offset} must be multiples of the element size {esize}", a)
    end = offset + esize * b.ne[0] + sum((n - 1) * s for n, s in zip(b.ne[1:], (nb1, nb2, nb3)))
    require(offset >= 0 and end <= nbytes(a), op,
            f"b {b.ne} at offset {offset} with strides ({nb1}, {nb2}, {nb3}) ends at byte {end}, past a's "
            f"{nbytes(a)} bytes", a, b)


def _acc(ctx, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int, inplace: bool) -> Tensor:
    require(nelements(b) <= nelements(a), "acc", "b has more elements than a", a, b)
    require(is_contiguous(a), "acc", "a must be contiguous", a)
    require(a.type == Type.F32 and b.type == Type.F32, "acc", "a and b must be F32", a, b)
    _check_region("acc", a, b, nb1, nb2, nb3, offset)
    return same_as(ctx, Op.ACC, a, [a, b], [nb1, nb2, nb3, offset, int(inplace)], inplace=inplace)


def acc(ctx, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    """a with b added into the view of a at byte `offset` with strides nb1, nb2, nb3 (b's shape)."""
    return _acc(ctx, a, b, nb1, nb2, nb3, offset, False)


def acc_inplace(ctx, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    return _acc(ctx, a, b, nb1, nb2, nb3, offset, True)


def _set(ctx, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int, inplace: bool) -> Tensor:
    require(nelements(a) >= nelements(b), "set", "b has more elements than a", a, b)
    require(0 <= offset < (1 << 30), "set", f"offset {offset} out of range [0, 2^30)", a)
    require(is_contiguous(a), "set", "a must be contiguous", a)
    _check_region("set", a, b, nb1, nb2, nb3, offset)
    return same_as(ctx, Op.SET, a, [a, b], [nb1, nb2, nb3, offset, int(inplace)], inplace=inplace)


def set(ctx, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:  # noqa: A001 (ggml_set)
    """a with b written into the view of a at byte `offset` with strides nb1, nb2, nb3 (b's shape)."""
    return _set(ctx, a, b, nb1, nb2, nb3, offset, False)


def set_inplace(ctx, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    return _set(ctx, a, b, nb1, nb2, nb3, offset, True)


def set_1d(ctx, a: Tensor, b: Tensor, offset: int) -> Tensor:
    return _set(ctx, a, b, a.nb[1], a.nb[2], a.nb[3], offset, False)


def set_1d_inplace(ctx, a: Tensor, b: Tensor, offset: int) -> Tensor:
    return _set(ctx, a, b, a.nb[1], a.nb[2], a.nb[3], offset, True)


def set_2d(ctx, a: Tensor, b: Tensor, nb1: int, offset: int) -> Tensor:
    return _set(ctx, a, b, nb1, a.nb[2], a.nb[3], offset, False)


def set_2d_inplace(ctx, a: Tensor, b: Tensor, nb1: int, offset: int) -> Tensor:
    return _set(ctx, a, b, nb1, a.nb[2], a.nb[3], offset, True)


def cumsum(ctx, a: Tensor) -> Tensor:
    """Running sums along ne[0]."""
    require(a.type == Type.F32, "cumsum", "a must be F32", a)
    return same_as(ctx, Op.CUMSUM, a, [a])


def diag(ctx, a: Tensor) -> Tensor:
    """Rows a [n, 1, ...] as diagonal matrices [n, n, ...]."""
    require(a.ne[1] == 1, "diag", "a.ne[1] must be 1", a)
    return new_op(ctx, Op.DIAG, a.type, [a.ne[0], a.ne[0], a.ne[2], a.ne[3]], [a])


def tri(ctx, a: Tensor, type: TriType) -> Tensor:
    """a with zeros outside the triangle `type` (upper or lower, with or without the diagonal)."""
    type = TriType(type)
    require(a.type == Type.F32, "tri", "a must be F32", a)
    require(is_contiguous(a), "tri", "a must be contiguous", a)
    require(a.ne[0] == a.ne[1], "tri", "a must be square (ne[0] == ne[1])", a)
    return same_as(ctx, Op.TRI, a, [a], [int(type)])


def _fill(ctx, a: Tensor, c: float, inplace: bool) -> Tensor:
    require(a.type in (Type.F32, Type.F16), "fill", "a must be F32 or F16", a)
    require(is_contiguous(a), "fill", "a must be contiguous", a)
    return same_as(ctx, Op.FILL, a, [a], [float(c)], inplace=inplace)


def fill(ctx, a: Tensor, c: float) -> Tensor:
    """A tensor of a's shape holding c everywhere."""
    return _fill(ctx, a, c, False)


def fill_inplace(ctx, a: Tensor, c: float) -> Tensor:
    return _fill(ctx, a, c, True)


__all__ = [name for name, fn in list(globals().items())
           if not name.startswith("_") and callable(fn) and getattr(fn, "__module__", None) == __name__]
