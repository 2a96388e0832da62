"""ADD, SUB, MUL, DIV with b broadcast to a (tiled), ADD1 and ADD_ID."""
from __future__ import annotations

import torch

from ...enums import Op
from ...types import Type, is_quantized
from .table import KernelTable, binds
from .common import view, as_float, write, all_float, is_float
from .copy import can_quantize_into

KERNELS = KernelTable("binary")

_FNS = {Op.ADD: torch.add, Op.SUB: torch.sub, Op.MUL: torch.mul, Op.DIV: torch.div}


def tile(b: torch.Tensor, shape) -> torch.Tensor:
    """ggml broadcasts b by tiling (repeat), not only over unit dims."""
    reps = [s // bs for s, bs in zip(shape, b.shape)]
    if all(r == 1 for r in reps):
        return b
    if all(r == 1 or bs == 1 for r, bs in zip(reps, b.shape)):
        return b.expand(*shape)  # unit dims: a free broadcast, no copy
    return b.repeat(*reps)


def _supports_binary(node) -> bool:
    a = node.src[0]
    if node.op == Op.ADD and is_quantized(a.type):
        # ggml adds into dequantized rows of a block-type a (add_cast, LoRA merges)
        return is_float(node.src[1]) and (is_float(node) or can_quantize_into(node.type))
    return all_float(node, 2)


def _bind_binary(node):
    """Same float type everywhere and b broadcast without copies: one torch op into the node.
    (torch computes f16/bf16 element-wise ops in f32 and rounds once, as ggml does.)"""
    a, b = node.src[0], node.src[1]
    if not (a.type == b.type == node.type and is_float(node)):
        return None
    va, vb, dst = view(a), view(b), view(node)
    if any(n != nb and nb != 1 for n, nb in zip(va.shape, vb.shape)):
        return None  # tiling needs a copy of b, which must be taken at compute time
    vb = vb.expand(va.shape)
    fn = _FNS[node.op]
    return lambda _node: fn(va, vb, out=dst)


@KERNELS.register(Op.ADD, Op.SUB, Op.MUL, Op.DIV, supports=_supports_binary)
@binds(_bind_binary)
def binary(node):
    va = as_float(node.src[0])
    vb = tile(as_float(node.src[1]), va.shape)
    write(node, _FNS[node.op](va, vb))


@KERNELS.register(Op.ADD1, supports=lambda n: all_float(n, 2))
def add1(node):
    write(node, as_float(node.src[0]) + as_float(node.src[1]).reshape(()))


def _supports_add_id(node) -> bool:
    return all_float(node, 2) and node.src[2].type == Type.I32


@KERNELS.register(Op.ADD_ID, supports=_supports_add_id)
def add_id(node):
    """dst[:, i1, i2] = a[:, i1, i2] + b[:, ids[i1, i2]] (b's first matrix holds one row per id)."""
    a, b, ids = node.src[0], node.src[1], node.src[2]
    rows = as_float(b)[0, 0]           # [n_rows_b, ne0]
    idx = view(ids)[0, 0].long()       # [a.ne2, a.ne1]
    write(node, as_float(a) + rows[idx])
