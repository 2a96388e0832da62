"""Op -> torch implementation tables.

A kernel is `fn(node) -> None`: it reads its sources' torch views and writes the node's view.
Every entry also has a `supports(node) -> bool` predicate over types and shapes, so that
`supports_op` answers truthfully. A kernel may also have a `bind(node)` attribute (see
`binds`): called once when a graph is compiled, it returns a call with the views and the torch
function already chosen (or None to use the generic kernel), so compute does no per-node work
beyond the torch op itself. CPU_KERNELS is the reference table; GPU_KERNELS starts as a
copy and overrides entries with Triton kernels (see gpu.py).
"""
from __future__ import annotations

from typing import Callable

from ...enums import Op, TensorFlag, VIEW_OPS
from ...tensor import Tensor, is_empty


_COMPUTE = int(TensorFlag.COMPUTE)


class UnsupportedOpError(NotImplementedError):
    pass


def _always(node: Tensor) -> bool:
    return True


class KernelTable:
    def __init__(self, name: str, base: "KernelTable | None" = None):
        self.name = name
        self.entries: dict[Op, tuple[Callable, Callable]] = dict(base.entries) if base else {}

    def register(self, *ops: Op, supports: Callable[[Tensor], bool] = _always):
        def deco(fn):
            for op in ops:
                self.entries[op] = (fn, supports)
            return fn
        return deco

    def supports(self, node: Tensor) -> bool:
        if node.op in VIEW_OPS:
            return True
        entry = self.entries.get(node.op)
        return entry is not None and bool(entry[1](node))

    def kernel(self, node: Tensor, device_name: str) -> Callable:
        """The kernel for this node; a clear error when the op or its types are unsupported."""
        entry = self.entries.get(node.op)
        if entry is None or not entry[1](node):
            srcs = ", ".join(f"{s.type.name}" for s in node.src if s is not None)
            raise UnsupportedOpError(f"op {node.op.name} is not supported on {device_name} for "
                                     f"{node.describe()} with sources ({srcs})")
        return entry[0]


def binds(binder: Callable[[Tensor], Callable | None]):
    """Attach a binder to a kernel: binder(node) returns fn(node) over views taken now, or None.
    The views are of the node's current memory: a compiled graph is valid until its tensors
    move (as upstream's graph plans, which must be updated after reallocation)."""
    def deco(fn):
        fn.bind = binder
        return fn
    return deco


def compiled_nodes(nodes, table: KernelTable, device_name: str) -> list[tuple[Callable, Tensor]]:
    """The graph as a list of bound kernel calls: view ops and non-COMPUTE nodes dropped."""
    calls = []
    for node in nodes:
        if node.op in VIEW_OPS or not (node.flags & _COMPUTE) or is_empty(node):
            continue
        fn = table.kernel(node, device_name)
        binder = getattr(fn, "bind", None)
        bound = binder(node) if binder is not None else None
        calls.append((bound or fn, node))
    return calls


def run_calls(calls) -> None:
    for fn, node in calls:
        fn(node)


CPU_KERNELS = KernelTable("CPU")

# importing the families fills CPU_KERNELS
from . import families  # noqa: E402,F401
