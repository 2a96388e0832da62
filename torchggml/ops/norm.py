"""Normalisations over rows: norm, rms_norm, l2_norm, group_norm."""
from __future__ import annotations

from ..enums import Op
from ..tensor import Tensor
from ._common import same_as, require

__all__ = ["norm", "norm_inplace", "rms_norm", "rms_norm_inplace", "l2_norm", "l2_norm_inplace",
           "group_norm", "group_norm_inplace"]


def _norm_op(ctx, op: Op, name: str, a: Tensor, eps: float, inplace: bool) -> Tensor:
    require(eps >= 0.0, name, f"eps must be >= 0, got {eps}", a)
    return same_as(ctx, op, a, [a], [float(eps)], inplace=inplace)


def norm(ctx, a: Tensor, eps: float) -> Tensor:
    """(x - mean) / sqrt(var + eps) over each row."""
    return _norm_op(ctx, Op.NORM, "norm", a, eps, False)


def norm_inplace(ctx, a: Tensor, eps: float) -> Tensor:
    return _norm_op(ctx, Op.NORM, "norm", a, eps, True)


def rms_norm(ctx, a: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) over each row."""
    return _norm_op(ctx, Op.RMS_NORM, "rms_norm", a, eps, False)


def rms_norm_inplace(ctx, a: Tensor, eps: float) -> Tensor:
    return _norm_op(ctx, Op.RMS_NORM, "rms_norm", a, eps, True)


def l2_norm(ctx, a: Tensor, eps: float) -> Tensor:
    """x / max(||x||, eps) over each row."""
    return _norm_op(ctx, Op.L2_NORM, "l2_norm", a, eps, False)


def l2_norm_inplace(ctx, a: Tensor, eps: float) -> Tensor:
    return _norm_op(ctx, Op.L2_NORM, "l2_norm", a, eps, True)


def _group_norm(ctx, a: Tensor, n_groups: int, eps: float, inplace: bool) -> Tensor:
    require(n_groups > 0, "group_norm", "n_groups must be positive", a)
    require(eps >= 0.0, "group_norm", f"eps must be >= 0, got {eps}", a)
    return same_as(ctx, Op.GROUP_NORM, a, [a], [int(n_groups), float(eps)], inplace=inplace)


def group_norm(ctx, a: Tensor, n_groups: int, eps: float) -> Tensor:
    """Normalise groups of channels (dim 2): ceil(ne2 / n_groups) channels per group, each group
    over all its [ne0, ne1] values, separately per ne3."""
    return _group_norm(ctx, a, n_groups, eps, False)


def group_norm_inplace(ctx, a: Tensor, n_groups: int, eps: float) -> Tensor:
    return _group_norm(ctx, a, n_groups, eps, True)
