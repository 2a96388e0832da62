"""ADD, SUB, MUL, DIV with b broadcast to a (tiled), and ADD1."""
from __future__ import annotations

import torch

from ...enums import Op
from . import CPU_KERNELS
from .common import view, as_float, write, all_float

_FNS = {Op.ADD: torch.add, Op.SUB: torch.sub, Op.MUL: torch.mul, Op.DIV: torch.div}


def _tile(b: torch.Tensor, shape) -> torch.Tensor:
    """ggml broadcasts b by tiling (repeat), not only over unit dims."""
    reps = [s // bs for s, bs in zip(shape, b.shape)]
    return b if all(r == 1 for r in reps) else b.repeat(*reps)


@CPU_KERNELS.register(Op.ADD, Op.SUB, Op.MUL, Op.DIV, supports=lambda n: all_float(n, 2))
def binary(node):
    a, b = node.src[0], node.src[1]
    va = as_float(a)
    vb = _tile(as_float(b), va.shape)
    write(node, _FNS[node.op](va, vb))


@CPU_KERNELS.register(Op.ADD1, supports=lambda n: all_float(n, 2))
def add1(node):
    write(node, as_float(node.src[0]) + as_float(node.src[1]).reshape(()))
