"""Shared pieces of the graph builders: creating op nodes and checking arguments."""
from __future__ import annotations

from ..context import new_tensor_impl, view_tensor
from ..enums import Op
from ..tensor import Tensor, set_op_params, format_name


def new_op(ctx, op: Op, type, ne, srcs, params=(), like: Tensor | None = None, inplace: bool = False) -> Tensor:
    """A node of `op` with sources `srcs`. With inplace=True the result is a view of `like`
    (ggml's *_inplace variants); otherwise a new contiguous tensor of `type` and shape `ne`."""
    if inplace:
        t = view_tensor(ctx, like)
    else:
        t = new_tensor_impl(ctx, type, ne)
    t.op = op
    for i, s in enumerate(srcs):
        t.src[i] = s
    if params:
        set_op_params(t, params)
    return t


def same_as(ctx, op: Op, a: Tensor, srcs, params=(), inplace: bool = False) -> Tensor:
    """A node with a's type and shape (element-wise ops)."""
    return new_op(ctx, op, a.type, a.ne, srcs, params, like=a, inplace=inplace)


def require(cond: bool, op: str, msg: str, *tensors: Tensor) -> None:
    """ggml's GGML_ASSERT as an exception naming the op and the tensors involved."""
    if not cond:
        involved = "; ".join(t.describe() for t in tensors if t is not None)
        raise ValueError(f"{op}: {msg}" + (f" [{involved}]" if involved else ""))


def named(t: Tensor, fmt: str, *args) -> Tensor:
    return format_name(t, fmt, *args)
