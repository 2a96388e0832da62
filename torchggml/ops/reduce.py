"""Reductions and orderings: sum, sum_rows, mean, argmax, argsort, top_k, count_equal."""
from __future__ import annotations

from ..enums import Op, SortOrder
from ..tensor import Tensor, is_matrix, are_same_shape
from ..types import Type
from ._common import new_op, require


def sum(ctx, a: Tensor) -> Tensor:
    """The sum of all elements, a 1-element tensor of a's type."""
    return new_op(ctx, Op.SUM, a.type, [1], [a])


def sum_rows(ctx, a: Tensor) -> Tensor:
    return new_op(ctx, Op.SUM_ROWS, a.type, [1, a.ne[1], a.ne[2], a.ne[3]], [a])


def mean(ctx, a: Tensor) -> Tensor:
    return new_op(ctx, Op.MEAN, Type.F32, [1, a.ne[1], a.ne[2], a.ne[3]], [a])


def argmax(ctx, a: Tensor) -> Tensor:
    """Index of the largest value of each row (first on ties), I32 [a.ne1]."""
    require(is_matrix(a), "argmax", "a must be a matrix", a)
    require(a.ne[0] <= 2**31 - 1, "argmax", "rows too long for I32 indices", a)
    return new_op(ctx, Op.ARGMAX, Type.I32, [a.ne[1]], [a])


def count_equal(ctx, a: Tensor, b: Tensor) -> Tensor:
    require(are_same_shape(a, b), "count_equal", "a and b must have the same shape", a, b)
    return new_op(ctx, Op.COUNT_EQUAL, Type.I64, [1], [a, b])


def argsort(ctx, a: Tensor, order: SortOrder = SortOrder.ASC) -> Tensor:
    """Per-row indices that sort the row, I32 with a's shape."""
    require(a.ne[0] <= 2**31 - 1, "argsort", "rows too long for I32 indices", a)
    return new_op(ctx, Op.ARGSORT, Type.I32, a.ne, [a], [int(SortOrder(order))])


def top_k(ctx, a: Tensor, k: int) -> Tensor:
    """Per-row indices of the k largest values, I32 [k, a.ne1, a.ne2, a.ne3]. ggml does not
    promise an order; torchggml's CPU kernel writes them largest first. k is the result's ne0."""
    require(0 < k <= a.ne[0], "top_k", f"k={k} must be in 1..a.ne[0]", a)
    return new_op(ctx, Op.TOP_K, Type.I32, [k, a.ne[1], a.ne[2], a.ne[3]], [a])


def argsort_top_k(ctx, a: Tensor, k: int) -> Tensor:
    """The first k columns of a descending argsort (a view of an ARGSORT node)."""
    require(0 < k <= a.ne[0], "argsort_top_k", f"k={k} must be in 1..a.ne[0]", a)
    from .views import view_4d
    t = argsort(ctx, a, SortOrder.DESC)
    return view_4d(ctx, t, k, t.ne[1], t.ne[2], t.ne[3], t.nb[1], t.nb[2], t.nb[3], 0)


# every public op function defined here (several come from factories, e.g. the unary family)
__all__ = [name for name, fn in list(globals().items())
           if not name.startswith("_") and callable(fn) and getattr(fn, "__module__", None) == __name__]
