"""Element-wise math with op params: SCALE, CLAMP, LEAKY_RELU, and SQR, SQRT, LOG, SIN, COS.
Computed in float32 from F32/F16/BF16 sources, as ggml's CPU backend does."""
from __future__ import annotations

import functools

import torch

from ...enums import Op
from ...tensor import get_op_params_f32
from .table import KernelTable, binds
from .common import view, as_float, write, all_float

KERNELS = KernelTable("math")

MATH_FUNCTIONS = {
    Op.SQR: lambda x: x * x,
    Op.SQRT: torch.sqrt,
    Op.LOG: torch.log,
    Op.SIN: torch.sin,
    Op.COS: torch.cos,
}


def _float_op(node) -> bool:
    return all_float(node, 1)


@KERNELS.register(*MATH_FUNCTIONS, supports=_float_op)
def math_op(node):
    write(node, MATH_FUNCTIONS[node.op](as_float(node.src[0])))


def _scale_into(vx, dst, s: float, b: float, _node) -> None:
    """x * s + b: the product straight into the node (rounded once for F16/BF16, as write() does),
    through a float32 temporary when b must be added before rounding."""
    if b == 0.0:
        torch.mul(vx.float(), s, out=dst)
    elif dst.dtype == torch.float32:
        torch.mul(vx.float(), s, out=dst).add_(b)
    else:
        dst.copy_(vx.float() * s + b)


def _bind_scale(node):
    return functools.partial(_scale_into, view(node.src[0]), view(node), get_op_params_f32(node, 0),
                             get_op_params_f32(node, 1))


@KERNELS.register(Op.SCALE, supports=_float_op)
@binds(_bind_scale)
def scale(node):
    _bind_scale(node)(node)


@KERNELS.register(Op.CLAMP, supports=_float_op)
def clamp(node):
    """max(min(x, max), min), in ggml's order (min wins when min > max)."""
    lo, hi = get_op_params_f32(node, 0), get_op_params_f32(node, 1)
    write(node, as_float(node.src[0]).clamp(max=hi).clamp(min=lo))


@KERNELS.register(Op.LEAKY_RELU, supports=_float_op)
def leaky_relu(node):
    slope = get_op_params_f32(node, 0)
    x = as_float(node.src[0])
    write(node, torch.where(x > 0, x, x * slope))
