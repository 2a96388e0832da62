"""NORM, RMS_NORM, L2_NORM, GROUP_NORM over rows (any row strides).

Element-wise work runs in float32, as ggml's CPU backend does; the row sums accumulate in
float64 where ggml accumulates in ggml_float (double)."""
from __future__ import annotations

import functools

import torch

from ...enums import Op
from ...tensor import get_op_params_f32, get_op_params_i32
from ...types import wide_float
from .table import KernelTable, binds
from .common import view, as_float, write, all_float

KERNELS = KernelTable("norm")


def _float_rows(node) -> bool:
    return all_float(node, 1)


def _row_mean(x: torch.Tensor) -> torch.Tensor:
    """Mean over the last dim, summed in float64, returned as float32 (keepdim)."""
    return (x.sum(-1, keepdim=True, dtype=wide_float(x.device)) / x.shape[-1]).float()


def _norm_into(vx, dst, eps: float, _node) -> None:
    """(x - mean) / sqrt(var + eps) per row, into dst (rounded once for F16/BF16, as write())."""
    x = vx.float()
    centered = x - _row_mean(x)
    variance = _row_mean(centered * centered)
    torch.mul(centered, variance.add_(eps).sqrt_().reciprocal_(), out=dst)


def _rms_norm_into(vx, dst, eps: float, _node) -> None:
    """x / sqrt(mean(x^2) + eps) per row (f32 products, row sums in f64, then f32 as ggml)."""
    x = vx.float()
    torch.mul(x, _row_mean(x * x).add_(eps).sqrt_().reciprocal_(), out=dst)


def _bind_row_norm(node):
    """The norm's views and eps, bound now; the values are read at each call."""
    into = _norm_into if node.op == Op.NORM else _rms_norm_into
    return functools.partial(into, view(node.src[0]), view(node), get_op_params_f32(node, 0))


@KERNELS.register(Op.NORM, Op.RMS_NORM, supports=_float_rows)
@binds(_bind_row_norm)
def row_norm(node):
    _bind_row_norm(node)(node)


@KERNELS.register(Op.L2_NORM, supports=_float_rows)
def l2_norm(node):
    x = as_float(node.src[0])
    eps = get_op_params_f32(node, 0)
    length = torch.sqrt((x * x).sum(-1, keepdim=True, dtype=wide_float(x.device)).float())
    write(node, x * (1.0 / torch.clamp_min(length, eps)))


@KERNELS.register(Op.GROUP_NORM, supports=_float_rows)
def group_norm(node):
    """Channels (dim 2) form groups of ceil(ne2 / n_groups); the last group may be short."""
    x = as_float(node.src[0])  # [ne3, ne2, ne1, ne0]
    n_groups = get_op_params_i32(node, 0)
    eps = get_op_params_f32(node, 1)
    ne3, ne2 = x.shape[0], x.shape[1]
    per_group = (ne2 + n_groups - 1) // n_groups
    n_used = (ne2 + per_group - 1) // per_group  # groups past the channels stay empty
    wide = wide_float(x.device)
    group_of = torch.arange(ne2, device=x.device) // per_group
    count = torch.zeros(n_used, dtype=wide, device=x.device).index_add_(
        0, group_of, torch.full((ne2,), float(x.shape[2] * x.shape[3]), dtype=wide, device=x.device))

    def group_mean(values):  # per channel [ne3, ne2, 1, 1]: the mean of its group
        per_channel = values.sum((2, 3), dtype=wide)
        sums = torch.zeros(ne3, n_used, dtype=wide, device=x.device).index_add_(1, group_of, per_channel)
        return (sums / count).float()[:, group_of, None, None]

    centered = x - group_mean(x)
    variance = group_mean(centered * centered)
    write(node, centered * (1.0 / torch.sqrt(variance + eps)))
