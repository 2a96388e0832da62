"""UNARY: every ggml_unary_op, computed in float32 as ggml's CPU backend does (F32/F16/BF16)."""
from __future__ import annotations

import functools
import math

import torch

from ...enums import Op, UnaryOp
from ...tensor import get_op_params_f32, get_unary_op
from .table import KernelTable, binds
from .common import view, all_float

KERNELS = KernelTable("unary")

GELU_COEF_A = 0.044715
GELU_QUICK_COEF = 1.702
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
SQRT_2_INV = 1.0 / math.sqrt(2.0)


def gelu(x: torch.Tensor) -> torch.Tensor:
    """ggml's GELU: the tanh approximation."""
    return 0.5 * x * (1.0 + torch.tanh(SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)))


def gelu_erf(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.erf(x * SQRT_2_INV))


def gelu_quick(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(GELU_QUICK_COEF * x)


def silu(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(x)


def relu(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x)


def round_half_away(x: torch.Tensor) -> torch.Tensor:
    """C's roundf: halves round away from zero (torch.round rounds them to even)."""
    t = torch.trunc(x)
    return t + torch.where((x - t).abs() >= 0.5, torch.sign(x), torch.zeros_like(x))


def _hardsigmoid(x):
    return ((x + 3.0) / 6.0).clamp(0.0, 1.0)


def _xielu(x, node):
    alpha_n, alpha_p, beta, eps = (get_op_params_f32(node, i) for i in range(1, 5))
    positive = alpha_p * x * x + beta * x
    negative = (torch.expm1(torch.clamp(x, max=eps)) - x) * alpha_n + beta * x
    return torch.where(x > 0, positive, negative)


# each: (x float32, node) -> values
UNARY_FUNCTIONS = {
    UnaryOp.ABS: lambda x, n: x.abs(),
    UnaryOp.SGN: lambda x, n: torch.sign(x),
    UnaryOp.NEG: lambda x, n: -x,
    UnaryOp.STEP: lambda x, n: (x > 0).to(x.dtype),
    UnaryOp.TANH: lambda x, n: torch.tanh(x),
    UnaryOp.ELU: lambda x, n: torch.where(x > 0, x, torch.expm1(x)),
    UnaryOp.RELU: lambda x, n: relu(x),
    UnaryOp.SIGMOID: lambda x, n: torch.sigmoid(x),
    UnaryOp.GELU: lambda x, n: gelu(x),
    UnaryOp.GELU_QUICK: lambda x, n: gelu_quick(x),
    UnaryOp.SILU: lambda x, n: silu(x),
    UnaryOp.HARDSWISH: lambda x, n: x * _hardsigmoid(x),
    UnaryOp.HARDSIGMOID: lambda x, n: _hardsigmoid(x),
    UnaryOp.EXP: lambda x, n: torch.exp(x),
    UnaryOp.GELU_ERF: lambda x, n: gelu_erf(x),
    UnaryOp.XIELU: _xielu,
    UnaryOp.FLOOR: lambda x, n: torch.floor(x),
    UnaryOp.CEIL: lambda x, n: torch.ceil(x),
    UnaryOp.ROUND: lambda x, n: round_half_away(x),
    UnaryOp.TRUNC: lambda x, n: torch.trunc(x),
    UnaryOp.EXPM1: lambda x, n: torch.exp(x) - 1.0,       # ggml: expf(x) - 1, not expm1f
    UnaryOp.SOFTPLUS: lambda x, n: torch.where(x > 20.0, x, torch.log(1.0 + torch.exp(x))),
}


# unary ops whose torch out= form is exactly the table's function: F32 -> F32 in one call
_UNARY_OUT = {
    UnaryOp.ABS: torch.abs, UnaryOp.SGN: torch.sign, UnaryOp.NEG: torch.neg, UnaryOp.TANH: torch.tanh,
    UnaryOp.SIGMOID: torch.sigmoid, UnaryOp.EXP: torch.exp, UnaryOp.FLOOR: torch.floor,
    UnaryOp.CEIL: torch.ceil, UnaryOp.TRUNC: torch.trunc,
}


def _supports_unary(node) -> bool:
    return all_float(node, 1) and node.op_params[0] in UNARY_FUNCTIONS


def _unary_out(fn, vx, dst, _node) -> None:
    fn(vx, out=dst)


def _unary_into(fn, vx, dst, node) -> None:
    dst.copy_(fn(vx.float(), node))


def _bind_unary(node):
    op = get_unary_op(node)
    vx, dst = view(node.src[0]), view(node)
    direct = _UNARY_OUT.get(op)
    # contiguous only: torch's vectorized and strided loops may round tanh, exp... differently
    contiguous = vx.is_contiguous() and dst.is_contiguous()
    if direct is not None and vx.dtype == dst.dtype == torch.float32 and contiguous:
        return functools.partial(_unary_out, direct, vx, dst)
    return functools.partial(_unary_into, UNARY_FUNCTIONS[op], vx, dst)


@KERNELS.register(Op.UNARY, supports=_supports_unary)
@binds(_bind_unary)
def unary(node):
    _bind_unary(node)(node)
