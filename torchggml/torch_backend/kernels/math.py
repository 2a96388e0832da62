"""Element-wise math with op params: SCALE, CLAMP, LEAKY_RELU, and SQR, SQRT, LOG, SIN, COS.
Computed in float32 from F32/F16/BF16 sources, as ggml's CPU backend does."""
from __future__ import annotations

import torch

from ...enums import Op
from ...tensor import get_op_params_f32
from . import CPU_KERNELS
from .common import as_float, write, all_float

_MATH = {
    Op.SQR: lambda x: x * x,
    Op.SQRT: torch.sqrt,
    Op.LOG: torch.log,
    Op.SIN: torch.sin,
    Op.COS: torch.cos,
}


def _float_op(node) -> bool:
    return all_float(node, 1)


@CPU_KERNELS.register(*_MATH, supports=_float_op)
def math_op(node):
    write(node, _MATH[node.op](as_float(node.src[0])))


@CPU_KERNELS.register(Op.SCALE, supports=_float_op)
def scale(node):
    """x * s + b."""
    s, b = get_op_params_f32(node, 0), get_op_params_f32(node, 1)
    x = as_float(node.src[0]) * s
    write(node, x + b if b != 0.0 else x)


@CPU_KERNELS.register(Op.CLAMP, supports=_float_op)
def clamp(node):
    """max(min(x, max), min), in ggml's order (min wins when min > max)."""
    lo, hi = get_op_params_f32(node, 0), get_op_params_f32(node, 1)
    write(node, as_float(node.src[0]).clamp(max=hi).clamp(min=lo))


@CPU_KERNELS.register(Op.LEAKY_RELU, supports=_float_op)
def leaky_relu(node):
    slope = get_op_params_f32(node, 0)
    x = as_float(node.src[0])
    write(node, torch.where(x > 0, x, x * slope))
