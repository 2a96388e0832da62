"""CONT, CPY, DUP: copy values between layouts and types, in ggml's element order.

Conversions as ggml's CPU backend allows them: any type to itself (bytes), F32/F16/BF16 among
themselves and into block types (quantized per destination row), block types into F32/F16/BF16
(dequantized), F32 -> I32 (truncation) and I32 -> F32.
"""
from __future__ import annotations

import functools

import torch

from ...enums import Op
from ...types import Type, is_quantized
from .table import KernelTable, binds
from .common import view, as_float, write, is_float

KERNELS = KernelTable("copy")


@functools.cache
def _quantize_targets() -> frozenset:
    from ...quants import quantize_types
    return frozenset(t for t in quantize_types() if is_quantized(t))


def can_quantize_into(type: Type) -> bool:
    """torchggml.quants can quantize float values into this block type."""
    return type in _quantize_targets()


def _supports_copy(node) -> bool:
    src, dst = node.src[0].type, node.type
    if src == dst:
        return True
    if is_float(node.src[0]):
        return is_float(node) or can_quantize_into(dst) or (src == Type.F32 and dst == Type.I32)
    if is_quantized(src):
        return is_float(node)
    return src == Type.I32 and dst == Type.F32


def needs_float_route(src: torch.dtype, dst: torch.dtype) -> bool:
    """F16 <-> BF16 casts go through float32 explicitly (as every conversion here does), so
    that even NaN payloads come out as write() gives them."""
    return {src, dst} == {torch.float16, torch.bfloat16}


def _element_order(values: torch.Tensor, shape) -> torch.Tensor:
    """values laid out in the destination's shape, element by element (ne0 fastest)."""
    return values if values.shape == shape else values.reshape(shape)


def _copy_into(src, shape, via_float: bool, dst, _node) -> None:
    """dst = src's elements in dst's order (shape None: src has the right shape, or is a view
    that has it); the reshape of a strided source copies, so it happens here, at each call."""
    values = src if shape is None else src.reshape(shape)
    dst.copy_(values.float() if via_float else values)


def _bind_copy(node):
    """Plain types, or bytes of one block type: one copy_ into the node (converting as C casts).
    None for a conversion from or to a block type."""
    src = node.src[0]
    if src.type != node.type and (is_quantized(src.type) or is_quantized(node.type)):
        return None
    vs, dst = view(src), view(node)
    shape = None if vs.shape == dst.shape else dst.shape
    if shape is not None and vs.is_contiguous():
        vs, shape = vs.view(shape), None
    return functools.partial(_copy_into, vs, shape, needs_float_route(vs.dtype, dst.dtype), dst)


@KERNELS.register(Op.CONT, Op.CPY, Op.DUP, supports=_supports_copy)
@binds(_bind_copy)
def copy_values(node):
    bound = _bind_copy(node)
    if bound is not None:
        bound(node)
    else:  # through float32: dequantize a block-type source, round or quantize into the node
        write(node, _element_order(as_float(node.src[0]), tuple(reversed(node.ne))))
