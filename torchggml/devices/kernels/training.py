"""Training ops: REPEAT_BACK, SILU_BACK, RMS_NORM_BACK, GET_ROWS_BACK, SOFT_MAX_BACK,
CROSS_ENTROPY_LOSS(_BACK), OPT_STEP_ADAMW, OPT_STEP_SGD (ROPE_BACK is in rope.py).

Element-wise work in float32 as ggml's CPU backend; row sums in float64 where ggml accumulates
in ggml_float. The optimizer steps update their parameter (and AdamW its moments) in place."""
from __future__ import annotations

import torch

from ...enums import Op
from ...tensor import get_op_params_f32, nrows
from ...types import Type, wide_float
from .table import KernelTable
from .common import view, as_float, write, all_float

KERNELS = KernelTable("training")


def _all_f32(node, n_src: int) -> bool:
    return node.type == Type.F32 and all(node.src[i].type == Type.F32 for i in range(n_src))


def _row_sum(x: torch.Tensor) -> torch.Tensor:
    return x.sum(-1, keepdim=True, dtype=wide_float(x.device)).float()


@KERNELS.register(Op.REPEAT_BACK, supports=lambda node: all_float(node, 1))
def repeat_back(node):
    """Sum a's tiles of the node's shape: a [n3*ne3, n2*ne2, n1*ne1, n0*ne0] -> [ne3, ne2, ne1, ne0]."""
    a = as_float(node.src[0])
    shape = tuple(reversed(node.ne))
    tiles = [n // s for n, s in zip(a.shape, shape)]
    split = a.reshape(tiles[0], shape[0], tiles[1], shape[1], tiles[2], shape[2], tiles[3], shape[3])
    write(node, split.sum((0, 2, 4, 6), dtype=wide_float(a.device)).float())


@KERNELS.register(Op.SILU_BACK, supports=lambda node: all_float(node, 2))
def silu_back(node):
    dy, x = as_float(node.src[0]), as_float(node.src[1])
    s = torch.sigmoid(x)
    write(node, dy * s * (1 + x * (1 - s)))


@KERNELS.register(Op.RMS_NORM_BACK, supports=lambda node: _all_f32(node, 2))
def rms_norm_back(node):
    """dx = (dy - x * sum(x dy) / (n (mean(x^2) + eps))) / sqrt(mean(x^2) + eps) per row."""
    dy, x = as_float(node.src[0]), as_float(node.src[1])
    eps, n = get_op_params_f32(node, 0), x.shape[-1]
    mean_eps = _row_sum(x * x) / n + eps
    write(node, (dy - x * (_row_sum(x * dy) / (n * mean_eps))) * torch.rsqrt(mean_eps))


def _supports_get_rows_back(node) -> bool:
    return node.type == Type.F32 and node.src[0].type in (Type.F32, Type.F16) and node.src[1].type == Type.I32


@KERNELS.register(Op.GET_ROWS_BACK, supports=_supports_get_rows_back)
def get_rows_back(node):
    """Zeros, then the rows of a added at their indices (repeated indices accumulate)."""
    a, rows = as_float(node.src[0])[0, 0], view(node.src[1])[0, 0, 0].long()
    out = torch.zeros(node.ne[1], node.ne[0], dtype=torch.float32, device=a.device)
    write(node, out.index_add_(0, rows, a))


def _supports_soft_max_back(node) -> bool:
    return _all_f32(node, 2) and get_op_params_f32(node, 1) == 0.0  # ggml: max_bias must be 0


@KERNELS.register(Op.SOFT_MAX_BACK, supports=_supports_soft_max_back)
def soft_max_back(node):
    """dx = scale * y * (dy - dot(y, dy)) per row."""
    dy, y = as_float(node.src[0]), as_float(node.src[1])
    write(node, get_op_params_f32(node, 0) * y * (dy - _row_sum(y * dy)))


def _log_softmax_rows(x: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(x.to(wide_float(x.device)), dim=-1)


@KERNELS.register(Op.CROSS_ENTROPY_LOSS, supports=lambda node: _all_f32(node, 2))
def cross_entropy_loss(node):
    """-sum(labels * log_softmax(logits)) / nrows."""
    logits, labels = as_float(node.src[0]), as_float(node.src[1])
    total = (labels.to(wide_float(labels.device)) * _log_softmax_rows(logits)).sum()
    write(node, (-total / nrows(node.src[0])).float().reshape(1, 1, 1, 1))


@KERNELS.register(Op.CROSS_ENTROPY_LOSS_BACK, supports=lambda node: _all_f32(node, 3))
def cross_entropy_loss_back(node):
    """(softmax(logits) - labels) * d(loss) / nrows."""
    grad, logits, labels = as_float(node.src[0]), as_float(node.src[1]), as_float(node.src[2])
    per_row = grad.reshape(()) / nrows(node.src[1])
    write(node, (torch.softmax(logits, dim=-1) - labels) * per_row)


def _supports_opt_step(node, n_src: int) -> bool:
    return _all_f32(node, n_src) and node.src[0].nb[0] == 4


def _hyper(node, i: int) -> list[torch.Tensor]:
    """The step's hyper-parameters (a small F32 tensor) as 0-d tensors on its device (no host
    read: the learning rate may change between computes of a captured graph)."""
    return list(view(node.src[i]).reshape(-1).unbind())


@KERNELS.register(Op.OPT_STEP_ADAMW, supports=lambda node: _supports_opt_step(node, 5))
def opt_step_adamw(node):
    """m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; w = w (1 - alpha wd) - alpha m b1h /
    (sqrt(v b2h) + eps) (decoupled weight decay, as torch.optim.AdamW)."""
    w, g, m, v = (view(node.src[i]) for i in range(4))
    alpha, beta1, beta2, eps, wd, beta1h, beta2h = _hyper(node, 4)
    m.mul_(beta1).add_(g * (1.0 - beta1))
    v.mul_(beta2).add_(g * g * (1.0 - beta2))
    step = (m * beta1h) / ((v * beta2h).sqrt_().add_(eps))
    w.mul_(1.0 - alpha * wd).sub_(alpha * step)


@KERNELS.register(Op.OPT_STEP_SGD, supports=lambda node: _supports_opt_step(node, 3))
def opt_step_sgd(node):
    """w = w (1 - alpha wd) - alpha g."""
    w, g = view(node.src[0]), view(node.src[1])
    alpha, wd = _hyper(node, 2)
    w.mul_(1.0 - alpha * wd).sub_(alpha * g)
