"""CONT, CPY, DUP: copy values between layouts and types (quantizing into block types)."""
from __future__ import annotations

from ...enums import Op
from ...types import Type
from . import CPU_KERNELS
from .common import view, as_float, write, is_float

QUANTIZE_TARGETS = frozenset({Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1, Type.Q8_0, Type.IQ4_NL})


def _supports_copy(node):
    src = node.src[0]
    if src.type == node.type:
        return True  # same type: a plain byte-level copy, any type
    if is_float(src) and (is_float(node) or node.type in QUANTIZE_TARGETS or node.type == Type.F64):
        return True
    return {src.type, node.type} <= {Type.F32, Type.I32, Type.F16, Type.BF16, Type.F64, Type.I16, Type.I8, Type.I64}


@CPU_KERNELS.register(Op.CONT, Op.CPY, Op.DUP, supports=_supports_copy)
def copy_values(node):
    src = node.src[0]
    if src.type == node.type and src.type.name.startswith(("Q", "I", "T", "M")) and src.type not in (Type.I8, Type.I16, Type.I32, Type.I64):
        # block type to the same block type: rows of blocks in element order
        view(node).copy_(view(src).reshape(view(node).shape))
        return
    dst_shape = view(node).shape
    if is_float(src) and is_float(node) and src.type == node.type:
        values = view(src)
    elif is_float(node) or node.type in QUANTIZE_TARGETS:
        values = as_float(src)
    else:
        values = view(src).to(view(node).dtype)
    # element order is row-major over ggml's ne (ne0 fastest): reshape the source's logical order
    write(node, values.reshape(dst_shape) if values.shape != dst_shape else values)
