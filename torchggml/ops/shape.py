"""Shape-building ops: repeat, concat, pad (zero or circular), arange, diag_mask_inf and diag_mask_zero."""
from __future__ import annotations

from math import ceil as _ceil

import numpy as _np

from ..enums import Op
from ..tensor import Tensor, can_repeat, is_empty
from ..types import Type
from ._common import new_op, same_as, require


def repeat(ctx, a: Tensor, b: Tensor) -> Tensor:
    """a tiled to b's shape."""
    require(can_repeat(a, b), "repeat", "b.ne[i] must be multiples of a.ne[i]", a, b)
    return new_op(ctx, Op.REPEAT, a.type, b.ne, [a])


def repeat_4d(ctx, a: Tensor, ne0, ne1, ne2, ne3) -> Tensor:
    ne = [ne0, ne1, ne2, ne3]
    require(is_empty(a) or all(ne[i] % a.ne[i] == 0 for i in range(4)), "repeat_4d",
            f"ne={ne} not multiples of a.ne", a)
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


def _pad(ctx, a: Tensor, pads, circular: bool) -> Tensor:
    pads = [int(p) for p in pads]
    require(all(p >= 0 for p in pads), "pad", f"padding {pads} must be non-negative", a)
    ne = [a.ne[i] + pads[2 * i] + pads[2 * i + 1] for i in range(4)]
    return new_op(ctx, Op.PAD, a.type, ne, [a], pads + [int(circular)])


def pad_ext(ctx, a: Tensor, lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3) -> Tensor:
    """Zero padding on both sides of every dim; op params [lp0, rp0, ..., lp3, rp3, circular=0]."""
    return _pad(ctx, a, [lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3], False)


def pad_ext_circular(ctx, a: Tensor, lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3) -> Tensor:
    """Padding that wraps around every dim (a torus), as pad_ext otherwise."""
    return _pad(ctx, a, [lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3], True)


def pad(ctx, a: Tensor, p0: int, p1: int, p2: int = 0, p3: int = 0) -> Tensor:
    """Zero padding at the end of every dim."""
    return pad_ext(ctx, a, 0, p0, 0, p1, 0, p2, 0, p3)


def pad_circular(ctx, a: Tensor, p0: int, p1: int, p2: int = 0, p3: int = 0) -> Tensor:
    return pad_ext_circular(ctx, a, 0, p0, 0, p1, 0, p2, 0, p3)


def arange(ctx, start: float, stop: float, step: float) -> Tensor:
    """F32 [ceil((stop - start) / step)] values start + step * i, computed in float32 as ggml does."""
    start32, stop32, step32 = (_np.float32(v) for v in (start, stop, step))
    require(stop32 > start32 and step32 > 0, "arange",
            f"need stop > start and step > 0 (got {start}, {stop}, {step})")
    n = _ceil((stop32 - start32) / step32)
    return new_op(ctx, Op.ARANGE, Type.F32, [n], [], [float(start32), float(stop32), float(step32)])


def diag_mask_inf(ctx, a: Tensor, n_past: int) -> Tensor:
    """-inf above the diagonal shifted by n_past: element (i, j) with i > n_past + j."""
    return same_as(ctx, Op.DIAG_MASK_INF, a, [a], [int(n_past)])


def diag_mask_inf_inplace(ctx, a: Tensor, n_past: int) -> Tensor:
    return same_as(ctx, Op.DIAG_MASK_INF, a, [a], [int(n_past)], inplace=True)


def diag_mask_zero(ctx, a: Tensor, n_past: int) -> Tensor:
    """0 above the diagonal shifted by n_past (as diag_mask_inf)."""
    return same_as(ctx, Op.DIAG_MASK_ZERO, a, [a], [int(n_past)])


def diag_mask_zero_inplace(ctx, a: Tensor, n_past: int) -> Tensor:
    return same_as(ctx, Op.DIAG_MASK_ZERO, a, [a], [int(n_past)], inplace=True)


# every public op function defined here (several come from factories, e.g. the unary family)
__all__ = [name for name, fn in list(globals().items())
           if not name.startswith("_") and callable(fn) and getattr(fn, "__module__", None) == __name__]
