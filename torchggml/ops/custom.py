"""Custom ops whose function is a Python callable: map_custom1/2/3 and custom (upstream's
ggml_map_custom* and ggml_custom_4d / ggml_custom_inplace).

The callable gets zero-copy torch views (as `to_torch` gives them; raw uint8 blocks for block
types) and writes the result into `dst`:

    map_custom1: fun(dst, a, ith, nth)      map_custom2: fun(dst, a, b, ith, nth)
    map_custom3: fun(dst, a, b, c, ith, nth)   custom: fun(dst, args, ith, nth)  (args: a list)

It runs on whatever device the node is scheduled on (its views are that device's tensors).
`n_tasks` is accepted for the C signature and ignored: the callable runs once per node with
ith=0, nth=1, since torch parallelizes inside each op. As upstream keeps the function pointer
in the node's op params, the node keeps a handle to the callable in a process-wide table.
"""
from __future__ import annotations

import itertools
from typing import Callable

from ..enums import Op
from ..tensor import Tensor, n_dims, set_op_params_i32
from ..types import Type
from ._common import new_op, require

__all__ = ["map_custom1", "map_custom1_inplace", "map_custom2", "map_custom2_inplace", "map_custom3",
           "map_custom3_inplace", "custom_4d", "custom_inplace", "N_TASKS_MAX"]

N_TASKS_MAX = -1  # GGML_N_TASKS_MAX: "as many as there are threads"

_CALLABLES: dict[int, Callable] = {}
_next_handle = itertools.count(1)


def _register(fun: Callable, op: str) -> int:
    if not callable(fun):
        raise TypeError(f"{op}: fun must be callable, got {type(fun).__name__}")
    handle = next(_next_handle)
    _CALLABLES[handle] = fun
    return handle


def _custom_node(ctx, op: Op, srcs, fun, n_tasks: int, name: str, like: Tensor | None = None,
                 type=None, ne=None, inplace: bool = False) -> Tensor:
    require(isinstance(n_tasks, int), name, f"n_tasks must be an int, got {n_tasks!r}")
    if like is not None:
        type, ne = like.type, like.ne
    t = new_op(ctx, op, type, list(ne), srcs, like=like, inplace=inplace)
    set_op_params_i32(t, 0, _register(fun, name))
    set_op_params_i32(t, 1, n_tasks)
    return t


def map_custom1(ctx, a: Tensor, fun, n_tasks: int = N_TASKS_MAX) -> Tensor:
    """A tensor like a, computed by fun(dst, a, ith, nth)."""
    return _custom_node(ctx, Op.MAP_CUSTOM1, [a], fun, n_tasks, "map_custom1", like=a)


def map_custom1_inplace(ctx, a: Tensor, fun, n_tasks: int = N_TASKS_MAX) -> Tensor:
    return _custom_node(ctx, Op.MAP_CUSTOM1, [a], fun, n_tasks, "map_custom1_inplace", like=a, inplace=True)


def map_custom2(ctx, a: Tensor, b: Tensor, fun, n_tasks: int = N_TASKS_MAX) -> Tensor:
    """A tensor like a, computed by fun(dst, a, b, ith, nth)."""
    return _custom_node(ctx, Op.MAP_CUSTOM2, [a, b], fun, n_tasks, "map_custom2", like=a)


def map_custom2_inplace(ctx, a: Tensor, b: Tensor, fun, n_tasks: int = N_TASKS_MAX) -> Tensor:
    return _custom_node(ctx, Op.MAP_CUSTOM2, [a, b], fun, n_tasks, "map_custom2_inplace", like=a, inplace=True)


def map_custom3(ctx, a: Tensor, b: Tensor, c: Tensor, fun, n_tasks: int = N_TASKS_MAX) -> Tensor:
    """A tensor like a, computed by fun(dst, a, b, c, ith, nth)."""
    return _custom_node(ctx, Op.MAP_CUSTOM3, [a, b, c], fun, n_tasks, "map_custom3", like=a)


def map_custom3_inplace(ctx, a: Tensor, b: Tensor, c: Tensor, fun, n_tasks: int = N_TASKS_MAX) -> Tensor:
    return _custom_node(ctx, Op.MAP_CUSTOM3, [a, b, c], fun, n_tasks, "map_custom3_inplace", like=a, inplace=True)


def custom_4d(ctx, type: Type, ne0: int, ne1: int, ne2: int, ne3: int, args, fun,
              n_tasks: int = N_TASKS_MAX) -> Tensor:
    """A new [ne0, ne1, ne2, ne3] tensor of `type` computed by fun(dst, args, ith, nth) from up
    to 10 source tensors."""
    args = list(args)
    require(len(args) <= 10, "custom_4d", f"at most 10 args, got {len(args)}")
    return _custom_node(ctx, Op.CUSTOM, args, fun, n_tasks, "custom_4d", type=type, ne=[ne0, ne1, ne2, ne3])


def custom_inplace(ctx, a: Tensor, args, fun, n_tasks: int = N_TASKS_MAX) -> Tensor:
    """A view of a written by fun(dst, [a, *args], ith, nth) (a is the first source)."""
    args = list(args)
    require(len(args) <= 9, "custom_inplace", f"at most 9 args, got {len(args)}")
    return _custom_node(ctx, Op.CUSTOM, [a, *args], fun, n_tasks, "custom_inplace", like=a, inplace=True)


# ---------------------------------------------------------------- running one

def _trimmed(t: Tensor, value):
    """A 4-D value with t's trailing unit dims dropped, as to_torch shows it."""
    n = n_dims(t)
    return value[(0,) * (4 - n)] if n < 4 else value


def custom_function(node: Tensor) -> Callable:
    fun = _CALLABLES.get(node.op_params[0])
    if fun is None:
        raise RuntimeError(f"op {node.op.name}: {node.describe()} has no registered callable")
    return fun


def run_custom(node: Tensor, out, srcs) -> None:
    """Call the node's function with `out` (4-D, the node's) and the 4-D source values."""
    fun = custom_function(node)
    dst = _trimmed(node, out)
    args = [_trimmed(s, v) for s, v in zip(node.src, srcs) if s is not None]
    if node.op == Op.CUSTOM:
        fun(dst, args, 0, 1)
    else:
        fun(dst, *args, 0, 1)
