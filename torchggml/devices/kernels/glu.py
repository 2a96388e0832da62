"""GLU: act(x) * gate, fused (one tensor's row halves, optionally swapped) or split (two tensors)."""
from __future__ import annotations

import functools

import torch

from ...enums import Op, GluOp
from ...tensor import get_op_params_f32, get_glu_op
from .table import KernelTable, binds
from .common import view, all_float
from .unary import gelu, gelu_erf, gelu_quick, silu, relu

KERNELS = KernelTable("glu")


def swiglu_oai_torch(x, g, node):
    """gpt-oss: x clamped above at limit, the gate to [-limit, limit], then x*sigmoid(alpha*x)*(g+1)."""
    alpha, limit = get_op_params_f32(node, 2), get_op_params_f32(node, 3)
    x = torch.clamp(x, max=limit)
    g = torch.clamp(g, -limit, limit)
    return x * torch.sigmoid(alpha * x) * (g + 1.0)


# the activation of x for each GLU op but SWIGLU_OAI (which also clamps the gate)
GLU_ACTIVATIONS = {
    GluOp.REGLU: relu, GluOp.GEGLU: gelu, GluOp.SWIGLU: silu,
    GluOp.GEGLU_ERF: gelu_erf, GluOp.GEGLU_QUICK: gelu_quick,
}


def glu_halves(node) -> tuple[torch.Tensor, torch.Tensor]:
    """Views (x, gate) of the sources: split tensors, or the two halves of each row of src0."""
    a, b = node.src[0], node.src[1]
    va = view(a)
    if b is not None:
        return va, view(b)
    n = node.ne[0]  # a.ne0 // 2; an odd last column is unused, as in ggml
    first, second = va[..., :n], va[..., n:2 * n]
    return (second, first) if node.op_params[1] else (first, second)


def _supports_glu(node) -> bool:
    n_src = 2 if node.src[1] is not None else 1
    op = node.op_params[0]
    return all_float(node, n_src) and (op in GLU_ACTIVATIONS or op == GluOp.SWIGLU_OAI)


def _glu_into(act, vx, vg, dst, _node) -> None:
    """act(x) * gate in float32, multiplied straight into the node (rounded once for F16/BF16,
    as write() does)."""
    torch.mul(act(vx.float()), vg.float(), out=dst)


def _swiglu_oai_into(vx, vg, dst, node) -> None:
    dst.copy_(swiglu_oai_torch(vx.float(), vg.float(), node))


def _bind_glu(node):
    vx, vg = glu_halves(node)
    op = get_glu_op(node)
    if op == GluOp.SWIGLU_OAI:
        return functools.partial(_swiglu_oai_into, vx, vg, view(node))
    return functools.partial(_glu_into, GLU_ACTIVATIONS[op], vx, vg, view(node))


@KERNELS.register(Op.GLU, supports=_supports_glu)
@binds(_bind_glu)
def glu(node):
    _bind_glu(node)(node)
