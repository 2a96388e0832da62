"""Normalisations over rows: norm, rms_norm, l2_norm, group_norm."""
from __future__ import annotations

from ..enums import Op
from ..tensor import Tensor
from ._common import same_as, require


def norm(ctx, a: Tensor, eps: float) -> Tensor:
    """(x - mean) / sqrt(var + eps) over each row."""
    return same_as(ctx, Op.NORM, a, [a], [float(eps)])


def norm_inplace(ctx, a: Tensor, eps: float) -> Tensor:
    return same_as(ctx, Op.NORM, a, [a], [float(eps)], inplace=True)


def rms_norm(ctx, a: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) over each row."""
    return same_as(ctx, Op.RMS_NORM, a, [a], [float(eps)])


def rms_norm_inplace(ctx, a: Tensor, eps: float) -> Tensor:
    return same_as(ctx, Op.RMS_NORM, a, [a], [float(eps)], inplace=True)


def l2_norm(ctx, a: Tensor, eps: float) -> Tensor:
    """x / max(||x||, eps) over each row."""
    return same_as(ctx, Op.L2_NORM, a, [a], [float(eps)])


def group_norm(ctx, a: Tensor, n_groups: int, eps: float) -> Tensor:
    require(n_groups > 0, "group_norm", "n_groups must be positive", a)
    return same_as(ctx, Op.GROUP_NORM, a, [a], [int(n_groups), float(eps)])
