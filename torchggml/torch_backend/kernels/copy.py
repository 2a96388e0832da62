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
from . import CPU_KERNELS
from .common import view, as_float, write, is_float


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


def _element_order(values: torch.Tensor, shape) -> torch.Tensor:
    """values laid out in the destination's shape, element by element (ne0 fastest)."""
    return values if values.shape == shape else values.reshape(shape)


@CPU_KERNELS.register(Op.CONT, Op.CPY, Op.DUP, supports=_supports_copy)
def copy_values(node):
    src = node.src[0]
    if src.type == node.type or src.type == Type.I32:
        # same type: bytes (block rows) or values moved as they are; I32 -> F32 rounds as C casts
        dst = view(node)
        dst.copy_(_element_order(view(src), dst.shape))
    else:
        # through float32: dequantize a block-type source, round or quantize into the node
        write(node, _element_order(as_float(src), tuple(reversed(node.ne))))
