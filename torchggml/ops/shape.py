"""Shape-building ops: repeat, concat, pad, arange, diag_mask_inf."""
from __future__ import annotations

from ..enums import Op
from ..tensor import Tensor, can_repeat
from ..types import Type
from ._common import new_op, same_as, require


def repeat(ctx, a: Tensor, b: Tensor) -> Tensor:
    """a tiled to b's shape."""
    require(can_repeat(a, b), "repeat", "b.ne[i] must be multiples of a.ne[i]", a, b)
    return new_op(ctx, Op.REPEAT, a.type, b.ne, [a])


def repeat_4d(ctx, a: Tensor, ne0, ne1, ne2, ne3) -> Tensor:
    ne = [ne0, ne1, ne2, ne3]
    require(all(ne[i] % a.ne[i] == 0 for i in range(4)), "repeat_4d", f"ne={ne} not multiples of a.ne", a)
    return new_op(ctx, Op.REPEAT, a.type, ne, [a])


def concat(ctx, a: Tensor, b: Tensor, dim: int) -> Tensor:
    require(0 <= dim < 4, "concat", f"dim {dim} out of range", a, b)
    require(a.type == b.type, "concat", "types differ", a, b)
    for d in range(4):
        if d != dim:
            require(a.ne[d] == b.ne[d], "concat", f"ne[{d}] differs", a, b)
    ne = list(a.ne)
    ne[dim] += b.ne[dim]
    return new_op(ctx, Op.CONCAT, a.type, ne, [a, b], [int(dim)])


def pad_ext(ctx, a: Tensor, lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3) -> Tensor:
    """Zero padding on both sides of every dim."""
    lp = [lp0, lp1, lp2, lp3]
    rp = [rp0, rp1, rp2, rp3]
    require(all(p >= 0 for p in lp + rp), "pad", "padding must be non-negative", a)
    ne = [a.ne[i] + lp[i] + rp[i] for i in range(4)]
    return new_op(ctx, Op.PAD, a.type, ne, [a], [lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3])


def pad(ctx, a: Tensor, p0: int, p1: int, p2: int = 0, p3: int = 0) -> Tensor:
    """Zero padding at the end of every dim."""
    return pad_ext(ctx, a, 0, p0, 0, p1, 0, p2, 0, p3)


def arange(ctx, start: float, stop: float, step: float) -> Tensor:
    import math
    require(stop > start and step > 0, "arange", f"need stop > start and step > 0 (got {start}, {stop}, {step})")
    n = math.ceil((stop - start) / step)
    return new_op(ctx, Op.ARANGE, Type.F32, [n], [], [float(start), float(stop), float(step)])


def diag_mask_inf(ctx, a: Tensor, n_past: int) -> Tensor:
    """-inf above the diagonal shifted by n_past: element (i, j) with i > n_past + j."""
    return same_as(ctx, Op.DIAG_MASK_INF, a, [a], [int(n_past)])


def diag_mask_inf_inplace(ctx, a: Tensor, n_past: int) -> Tensor:
    return same_as(ctx, Op.DIAG_MASK_INF, a, [a], [int(n_past)], inplace=True)


def diag_mask_zero(ctx, a: Tensor, n_past: int) -> Tensor:
    return same_as(ctx, Op.DIAG_MASK_ZERO, a, [a], [int(n_past)])
