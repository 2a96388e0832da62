"""Views and copies: reshape, view_*, permute, transpose, cont, cpy, dup."""
from __future__ import annotations

from ..context import new_tensor_impl
from ..enums import Op
from ..tensor import Tensor, is_contiguous, nelements, set_op_params, MAX_DIMS
from ._common import new_op, require, named


def _view(ctx, a: Tensor, op: Op, ne, nb, offset: int, suffix: str) -> Tensor:
    t = new_tensor_impl(ctx, a.type, ne, a, offset, nb)
    t.op = op
    t.src[0] = a
    named(t, "%s (%s)", a.name, suffix)
    return t


def reshape(ctx, a: Tensor, b: Tensor) -> Tensor:
    """a's data with b's shape."""
    return _reshape(ctx, a, b.ne)


def _reshape(ctx, a: Tensor, ne) -> Tensor:
    ne = list(ne) + [1] * (MAX_DIMS - len(ne))
    require(is_contiguous(a), "reshape", "source must be contiguous (use cont first)", a)
    require(nelements(a) == ne[0] * ne[1] * ne[2] * ne[3], "reshape", f"element count differs for ne={ne}", a)
    from ..tensor import contiguous_strides
    return _view(ctx, a, Op.RESHAPE, ne, contiguous_strides(a.type, ne), 0, "reshaped")


def reshape_1d(ctx, a, ne0):
    return _reshape(ctx, a, [ne0])


def reshape_2d(ctx, a, ne0, ne1):
    return _reshape(ctx, a, [ne0, ne1])


def reshape_3d(ctx, a, ne0, ne1, ne2):
    return _reshape(ctx, a, [ne0, ne1, ne2])


def reshape_4d(ctx, a, ne0, ne1, ne2, ne3):
    return _reshape(ctx, a, [ne0, ne1, ne2, ne3])


def _view_impl(ctx, a: Tensor, ne, nb_rest, offset: int) -> Tensor:
    from ..types import type_traits
    tr = type_traits(a.type)
    ne = list(ne) + [1] * (MAX_DIMS - len(ne))
    nb = [tr.type_size, 0, 0, 0]
    nb[1] = nb[0] * (ne[0] // tr.blck_size)
    for i, s in enumerate(nb_rest):
        nb[i + 1] = s
    for i in range(len(nb_rest) + 1, MAX_DIMS):
        nb[i] = nb[i - 1] * ne[i - 1]
    t = _view(ctx, a, Op.VIEW, ne, nb, offset, "view")
    set_op_params(t, _size_t_words(offset))
    return t


def _size_t_words(value: int) -> list[int]:
    """A size_t op param as ggml stores it: two little-endian int32 words."""
    lo, hi = value & 0xFFFFFFFF, value >> 32
    return [lo - (1 << 32) if lo >= 1 << 31 else lo, hi]


def view_1d(ctx, a, ne0, offset=0):
    return _view_impl(ctx, a, [ne0], [], offset)


def view_2d(ctx, a, ne0, ne1, nb1, offset=0):
    return _view_impl(ctx, a, [ne0, ne1], [nb1], offset)


def view_3d(ctx, a, ne0, ne1, ne2, nb1, nb2, offset=0):
    return _view_impl(ctx, a, [ne0, ne1, ne2], [nb1, nb2], offset)


def view_4d(ctx, a, ne0, ne1, ne2, ne3, nb1, nb2, nb3, offset=0):
    return _view_impl(ctx, a, [ne0, ne1, ne2, ne3], [nb1, nb2, nb3], offset)


def permute(ctx, a: Tensor, axis0: int, axis1: int, axis2: int, axis3: int) -> Tensor:
    """Source dim i becomes result dim axis_i (ggml's convention, the inverse of torch.permute)."""
    axes = [axis0, axis1, axis2, axis3]
    require(sorted(axes) == [0, 1, 2, 3], "permute", f"axes {axes} are not a permutation of 0..3", a)
    ne = [0] * 4
    nb = [0] * 4
    for i, ax in enumerate(axes):
        ne[ax] = a.ne[i]
        nb[ax] = a.nb[i]
    t = _view(ctx, a, Op.PERMUTE, ne, nb, 0, "permuted")
    set_op_params(t, axes)
    return t


def transpose(ctx, a: Tensor) -> Tensor:
    ne = [a.ne[1], a.ne[0], a.ne[2], a.ne[3]]
    nb = [a.nb[1], a.nb[0], a.nb[2], a.nb[3]]
    return _view(ctx, a, Op.TRANSPOSE, ne, nb, 0, "transposed")


def cont(ctx, a: Tensor) -> Tensor:
    return _cont(ctx, a, a.ne)


def _cont(ctx, a: Tensor, ne) -> Tensor:
    ne = list(ne) + [1] * (MAX_DIMS - len(ne))
    require(nelements(a) == ne[0] * ne[1] * ne[2] * ne[3], "cont", f"element count differs for ne={ne}", a)
    t = new_op(ctx, Op.CONT, a.type, ne, [a])
    return named(t, "%s (cont)", a.name)


def cont_1d(ctx, a, ne0):
    return _cont(ctx, a, [ne0])


def cont_2d(ctx, a, ne0, ne1):
    return _cont(ctx, a, [ne0, ne1])


def cont_3d(ctx, a, ne0, ne1, ne2):
    return _cont(ctx, a, [ne0, ne1, ne2])


def cont_4d(ctx, a, ne0, ne1, ne2, ne3):
    return _cont(ctx, a, [ne0, ne1, ne2, ne3])


def cpy(ctx, a: Tensor, b: Tensor) -> Tensor:
    """Copy a's values into b's memory (converting type, e.g. quantizing); the result is a view of b."""
    require(nelements(a) == nelements(b), "cpy", "element counts differ", a, b)
    from ..context import view_tensor
    t = view_tensor(ctx, b)
    if b.name:
        named(t, "%s (copy of %s)", b.name, a.name)
    else:
        named(t, "%s (copy)", a.name)
    t.op = Op.CPY
    t.src[0] = a
    t.src[1] = b
    return t


def cast(ctx, a: Tensor, type) -> Tensor:
    """a's values converted to `type` in a new tensor."""
    b = new_tensor_impl(ctx, type, a.ne)
    named(b, "%s (copy)", a.name)
    t = cpy(ctx, a, b)
    return t


def dup(ctx, a: Tensor) -> Tensor:
    return new_op(ctx, Op.DUP, a.type, a.ne, [a])


def dup_inplace(ctx, a: Tensor) -> Tensor:
    return new_op(ctx, Op.DUP, a.type, a.ne, [a], like=a, inplace=True)


# every public op function defined here (several come from factories, e.g. the unary family)
__all__ = [name for name, fn in list(globals().items())
           if not name.startswith("_") and callable(fn) and getattr(fn, "__module__", None) == __name__]
