"""MUL_MAT: every broadcast rule, src0 of any type (block types dequantized), src1 F32/F16/BF16."""
from __future__ import annotations

import torch

from ...enums import Op
from . import CPU_KERNELS
from .common import view, as_float, write, is_float


def _supports_mul_mat(node):
    return is_float(node.src[1]) and node.src[0].type.name != "Q8_K"


@CPU_KERNELS.register(Op.MUL_MAT, supports=_supports_mul_mat)
def mul_mat(node):
    a, b = node.src[0], node.src[1]
    va = as_float(a)  # [a3, a2, N, K]
    vb = as_float(b)  # [b3, b2, M, K]
    r2, r3 = vb.shape[1] // va.shape[1], vb.shape[0] // va.shape[0]
    # consecutive b matrices share one a matrix: repeat-interleave, not tile
    if r2 > 1:
        va = va.repeat_interleave(r2, dim=1)
    if r3 > 1:
        va = va.repeat_interleave(r3, dim=0)
    write(node, torch.matmul(vb, va.transpose(-1, -2)))
