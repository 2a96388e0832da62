"""Tensor metadata, exactly ggml's: type, ne/nb, op, op_params, sources, view, flags, memory."""
from __future__ import annotations

import struct
from array import array

from .enums import Op, TensorFlag, UnaryOp, GluOp, VIEW_OPS
from .types import Type, type_traits, type_name

MAX_DIMS = 4
MAX_SRC = 10
MAX_OP_PARAMS = 64  # bytes
MAX_NAME = 64


class Tensor:
    """ggml_tensor. `data` is an address (buffer base + offset) or None before allocation."""

    __slots__ = ("type", "ne", "nb", "op", "op_params", "src", "view_src", "view_offs", "flags",
                 "name", "buffer", "data", "extra", "ctx", "_view_cache", "__weakref__")

    def __init__(self, ctx, type: Type, ne, nb, view_src=None, view_offs=0):
        self.ctx = ctx
        self.type = type
        self.ne = ne
        self.nb = nb
        self.op = Op.NONE
        self.op_params = array("i", bytes(MAX_OP_PARAMS))
        self.src: list[Tensor | None] = [None] * MAX_SRC
        self.view_src = view_src
        self.view_offs = view_offs
        self.flags = 0  # TensorFlag bits, kept a plain int: enum arithmetic is slow on hot paths
        self.name = ""
        self.buffer = None
        self.data: int | None = None
        self.extra = None
        self._view_cache = None

    def __repr__(self):
        op = self.op.name if self.op != Op.NONE else "leaf"
        return f"<ggml.Tensor '{self.name}' {type_name(self.type)} ne={list(self.ne)} op={op}>"

    # convenience accessors (the mirrored functions below are the contract)
    @property
    def shape(self):
        """torch-order shape: reversed(ne), trailing size-1 dims kept."""
        return tuple(reversed(self.ne))

    def describe(self) -> str:
        """A short identification for error messages: name, op, type, shape."""
        name = self.name or "<unnamed>"
        return f"tensor '{name}' (op {self.op.name}, {type_name(self.type)}, ne={list(self.ne)})"


# ---------------------------------------------------------------- op params
# ggml keeps op params as int32 words; floats are stored by their bit pattern.

def set_op_params(t: Tensor, values) -> None:
    """Store a sequence of ints and floats as int32 words (floats by their f32 bits)."""
    if len(values) * 4 > MAX_OP_PARAMS:
        raise ValueError(f"too many op params for {t.describe()}")
    for i, v in enumerate(values):
        set_op_params_i32(t, i, v) if isinstance(v, (int, bool)) else set_op_params_f32(t, i, v)


def get_op_params_i32(t: Tensor, i: int) -> int:
    return t.op_params[i]


def set_op_params_i32(t: Tensor, i: int, value: int) -> None:
    t.op_params[i] = int(value)


def get_op_params_f32(t: Tensor, i: int) -> float:
    return struct.unpack("<f", struct.pack("<i", t.op_params[i]))[0]


def set_op_params_f32(t: Tensor, i: int, value: float) -> None:
    t.op_params[i] = struct.unpack("<i", struct.pack("<f", float(value)))[0]


def get_unary_op(t: Tensor) -> UnaryOp:
    return UnaryOp(t.op_params[0])


def get_glu_op(t: Tensor) -> GluOp:
    return GluOp(t.op_params[0])


# ---------------------------------------------------------------- sizes and layout

def memory_buffer(t: Tensor):
    """The buffer that holds the tensor's memory: its view_src's for a view (as upstream's
    scheduler asks), else its own; None while unallocated."""
    return t.view_src.buffer if t.view_src is not None else t.buffer


def round_up(x: int, multiple: int) -> int:
    """x rounded up to a multiple (ggml's GGML_PAD)."""
    return -(-x // multiple) * multiple


def nelements(t: Tensor) -> int:
    ne = t.ne
    return ne[0] * ne[1] * ne[2] * ne[3]


def nrows(t: Tensor) -> int:
    ne = t.ne
    return ne[1] * ne[2] * ne[3]


def nbytes(t: Tensor) -> int:
    """Bytes spanned by the tensor's elements, strides included (ggml_nbytes)."""
    ne, nb = t.ne, t.nb
    for n in ne:
        if n <= 0:
            return 0
    tr = type_traits(t.type)
    if tr.blck_size == 1:
        size = tr.type_size
        for i in range(MAX_DIMS):
            size += (ne[i] - 1) * nb[i]
    else:
        size = ne[0] * nb[0] // tr.blck_size
        for i in range(1, MAX_DIMS):
            size += (ne[i] - 1) * nb[i]
    return size


def element_size(t: Tensor) -> int:
    return type_traits(t.type).type_size


def contiguous_strides(type: Type, ne) -> list[int]:
    tr = type_traits(type)
    if ne[0] % tr.blck_size:
        raise ValueError(f"ne[0]={ne[0]} is not a multiple of {tr.name}'s block size {tr.blck_size}")
    nb = [tr.type_size, tr.type_size * (ne[0] // tr.blck_size), 0, 0]
    for i in range(2, MAX_DIMS):
        nb[i] = nb[i - 1] * ne[i - 1]
    return nb


def is_contiguous_n(t: Tensor, n: int) -> bool:
    """Elements contiguous except that dims 1..n may be strided; dims of size 1 are ignored
    (ggml_is_contiguous_n)."""
    tr = type_traits(t.type)
    ne, nb = t.ne, t.nb
    next_nb = tr.type_size
    if ne[0] != tr.blck_size and nb[0] != next_nb:
        return False
    next_nb *= ne[0] // tr.blck_size
    for i in range(1, MAX_DIMS):
        if ne[i] != 1:
            if i > n:
                if nb[i] != next_nb:
                    return False
                next_nb *= ne[i]
            else:
                next_nb = ne[i] * nb[i]  # this dim may be strided; the next follows it
    return True


def is_contiguous(t: Tensor) -> bool:
    return is_contiguous_n(t, 0)


def is_contiguous_0(t: Tensor) -> bool:
    return is_contiguous_n(t, 0)


def is_contiguous_1(t: Tensor) -> bool:
    """Rows contiguous, dims 2 and 3 packed; dim 1 may be strided."""
    return is_contiguous_n(t, 1)


def is_contiguous_2(t: Tensor) -> bool:
    """Rows contiguous, dim 3 packed; dims 1 and 2 may be strided."""
    return is_contiguous_n(t, 2)


def is_contiguous_channels(t: Tensor) -> bool:
    """Memory order with channels (ne[2]) innermost: a [C, W, H, N] tensor permuted to [W, H, C, N]."""
    return t.nb[0] > t.nb[2] and t.nb[1] > t.nb[0] and t.nb[2] == type_traits(t.type).type_size


def is_padded_1d(t: Tensor) -> bool:
    """Elements contiguous, dims 2 and 3 packed after (possibly strided) rows (ggml_is_padded_1d)."""
    return (t.nb[0] == type_traits(t.type).type_size and t.nb[2] == t.nb[1] * t.ne[1]
            and t.nb[3] == t.nb[2] * t.ne[2])


def is_contiguous_rows(t: Tensor) -> bool:
    """Rows are contiguous (nb[0] is the element size); rows themselves may be strided."""
    return t.ne[0] == type_traits(t.type).blck_size or t.nb[0] == type_traits(t.type).type_size


def is_transposed(t: Tensor) -> bool:
    return t.nb[0] > t.nb[1]


def is_permuted(t: Tensor) -> bool:
    nb = t.nb
    return nb[0] > nb[1] or nb[1] > nb[2] or nb[2] > nb[3]


def is_empty(t: Tensor) -> bool:
    return any(n == 0 for n in t.ne)


def is_scalar(t: Tensor) -> bool:
    return t.ne == [1, 1, 1, 1]


def is_vector(t: Tensor) -> bool:
    return t.ne[1] == 1 and t.ne[2] == 1 and t.ne[3] == 1


def is_matrix(t: Tensor) -> bool:
    return t.ne[2] == 1 and t.ne[3] == 1


def n_dims(t: Tensor) -> int:
    for i in range(MAX_DIMS - 1, 0, -1):
        if t.ne[i] > 1:
            return i + 1
    return 1


def are_same_shape(a: Tensor, b: Tensor) -> bool:
    return a.ne == b.ne


def are_same_stride(a: Tensor, b: Tensor) -> bool:
    return a.nb == b.nb


def are_same_layout(a: Tensor, b: Tensor) -> bool:
    return a.type == b.type and a.ne == b.ne and a.nb == b.nb


def can_repeat(a: Tensor, b: Tensor) -> bool:
    """`a` broadcasts to `b`: every b.ne[i] is a multiple of a.ne[i]."""
    return is_empty(a) and is_empty(b) or all(a.ne[i] > 0 and b.ne[i] % a.ne[i] == 0 for i in range(MAX_DIMS))


def can_repeat_rows(a: Tensor, b: Tensor) -> bool:
    return a.ne[0] == b.ne[0] and can_repeat(a, b)


def is_view_op(op: Op) -> bool:
    return op in VIEW_OPS


# ---------------------------------------------------------------- names and flags

def set_name(t: Tensor, name: str) -> Tensor:
    t.name = str(name)[: MAX_NAME - 1]
    return t


def get_name(t: Tensor) -> str:
    return t.name


def format_name(t: Tensor, fmt: str, *args) -> Tensor:
    return set_name(t, fmt % args if args else fmt)


def set_input(t: Tensor) -> None:
    t.flags |= int(TensorFlag.INPUT)


def set_output(t: Tensor) -> None:
    """Mark the tensor and its view sources as outputs: the allocator never frees them."""
    while t is not None:
        t.flags |= int(TensorFlag.OUTPUT)
        t = t.view_src


def set_param(t: Tensor) -> None:
    if t.op != Op.NONE:
        raise ValueError(f"set_param: {t.describe()} is not a leaf")
    t.flags |= int(TensorFlag.PARAM)


def set_loss(t: Tensor) -> None:
    """Mark t as a training loss (an F32 scalar, as ggml requires)."""
    if not (is_scalar(t) and t.type == Type.F32):
        raise ValueError(f"set_loss: the loss must be an F32 scalar, got {t.describe()}")
    t.flags |= int(TensorFlag.LOSS)
