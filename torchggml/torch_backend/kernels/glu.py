"""GLU: act(x) * gate, fused (one tensor's row halves, optionally swapped) or split (two tensors)."""
from __future__ import annotations

import torch

from ...enums import Op, GluOp
from ...tensor import get_op_params_f32, get_glu_op
from . import CPU_KERNELS
from .common import as_float, write, all_float
from .unary import gelu, gelu_erf, gelu_quick, silu, relu


def _swiglu_oai(x, g, node):
    """gpt-oss: x clamped above at limit, the gate to [-limit, limit], then x*sigmoid(alpha*x)*(g+1)."""
    alpha, limit = get_op_params_f32(node, 2), get_op_params_f32(node, 3)
    x = torch.clamp(x, max=limit)
    g = torch.clamp(g, -limit, limit)
    return x * torch.sigmoid(alpha * x) * (g + 1.0)


# each: (x, gate, node) -> values
_GLU = {
    GluOp.REGLU: lambda x, g, n: relu(x) * g,
    GluOp.GEGLU: lambda x, g, n: gelu(x) * g,
    GluOp.SWIGLU: lambda x, g, n: silu(x) * g,
    GluOp.SWIGLU_OAI: _swiglu_oai,
    GluOp.GEGLU_ERF: lambda x, g, n: gelu_erf(x) * g,
    GluOp.GEGLU_QUICK: lambda x, g, n: gelu_quick(x) * g,
}


def _halves(node):
    """(x, gate) from the sources: split tensors, or the two halves of each row of src0."""
    a, b = node.src[0], node.src[1]
    va = as_float(a)
    if b is not None:
        return va, as_float(b)
    n = node.ne[0]  # a.ne0 // 2; an odd last column is unused, as in ggml
    first, second = va[..., :n], va[..., n:2 * n]
    return (second, first) if node.op_params[1] else (first, second)


def _supports_glu(node) -> bool:
    n_src = 2 if node.src[1] is not None else 1
    return all_float(node, n_src) and node.op_params[0] in _GLU


@CPU_KERNELS.register(Op.GLU, supports=_supports_glu)
def glu(node):
    x, g = _halves(node)
    write(node, _GLU[get_glu_op(node)](x, g, node))
