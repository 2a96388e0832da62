"""Shape-building ops: REPEAT, CONCAT, PAD (zero or circular), ARANGE, DIAG_MASK_INF/ZERO.
REPEAT and PAD move values of any plain type unchanged, CONCAT of any type (block rows as bytes); the masks compute in float32."""
from __future__ import annotations

import torch

from ...enums import Op
from ...tensor import get_op_params_f32
from ...types import Type, is_quantized
from .table import KernelTable
from .common import view, as_float, write, all_float
from .binary import tile

KERNELS = KernelTable("shape")


def _plain_same_type(node) -> bool:
    srcs = [s for s in node.src if s is not None]
    return not is_quantized(node.type) and all(s.type == node.type for s in srcs)


@KERNELS.register(Op.REPEAT, supports=_plain_same_type)
def repeat(node):
    dst = view(node)
    dst.copy_(tile(view(node.src[0]), dst.shape))


def _same_type(node) -> bool:
    return all(s.type == node.type for s in node.src if s is not None)


@KERNELS.register(Op.CONCAT, supports=_same_type)
def concat(node):
    """Block types too: their rows are whole blocks (raw bytes), so the byte rows concatenate
    along ne0 as the blocks do, and along the other dims as rows."""
    dim = 3 - node.op_params[0]  # ggml dim d is torch dim 3 - d
    view(node).copy_(torch.cat([view(node.src[0]), view(node.src[1])], dim=dim))


def _wrapped_index(n_out: int, left: int, n_in: int, device) -> torch.Tensor:
    return (torch.arange(n_out, device=device) - left) % n_in


@KERNELS.register(Op.PAD, supports=_plain_same_type)
def pad(node):
    """Zeros around the source, or (circular) the source repeated around a torus."""
    pads = [node.op_params[i] for i in range(8)]  # lp0, rp0, lp1, rp1, ...
    x = view(node.src[0])
    if node.op_params[8]:
        for d in range(4):
            x = x.index_select(3 - d, _wrapped_index(node.ne[d], pads[2 * d], x.shape[3 - d], x.device))
    else:
        x = torch.nn.functional.pad(x, pads)  # torch pads the last dim first: ggml's ne0 first
    view(node).copy_(x)


@KERNELS.register(Op.ARANGE, supports=lambda n: n.type == Type.F32)
def arange(node):
    """start + step * i in float32."""
    start, step = get_op_params_f32(node, 0), get_op_params_f32(node, 2)
    dst = view(node)
    steps = torch.arange(node.ne[0], dtype=torch.float32, device=dst.device)
    dst.copy_(steps * step + start)


def _diag_mask(node, value: float):
    """Elements (i0, i1) with i0 > n_past + i1 (above the shifted diagonal) become value."""
    n_past = node.op_params[0]
    x = as_float(node.src[0])
    i0 = torch.arange(node.ne[0], device=x.device)
    i1 = torch.arange(node.ne[1], device=x.device)
    write(node, x.masked_fill(i0[None, :] > n_past + i1[:, None], value))


@KERNELS.register(Op.DIAG_MASK_INF, supports=lambda n: all_float(n, 1))
def diag_mask_inf(node):
    _diag_mask(node, float("-inf"))


@KERNELS.register(Op.DIAG_MASK_ZERO, supports=lambda n: all_float(n, 1))
def diag_mask_zero(node):
    _diag_mask(node, 0.0)
