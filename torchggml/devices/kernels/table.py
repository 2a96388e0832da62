"""Kernel tables: op -> (kernel, supports), bound calls, and running them."""
from __future__ import annotations

from collections import ChainMap
from typing import Callable

from ...enums import Op, TensorFlag, VIEW_OPS
from ...tensor import Tensor, is_empty
from .registered import registered_entry


_COMPUTE = int(TensorFlag.COMPUTE)


class UnsupportedOpError(NotImplementedError):
    pass


def _always(node: Tensor) -> bool:
    return True


class KernelTable:
    """Op -> (kernel, supports). A table `over` another looks its missing ops up there at
    lookup time (a ChainMap, not a copy): the GPU and CPU tables layer their own kernels over
    the torch reference table this way."""

    def __init__(self, name: str, over: "KernelTable | None" = None):
        self.name = name
        self.entries = ChainMap({}, over.entries) if over is not None else {}

    @classmethod
    def merged(cls, name: str, tables) -> "KernelTable":
        """One table holding the entries of `tables` (an op in two of them is an error)."""
        merged = cls(name)
        for table in tables:
            for op, entry in table.entries.items():
                if op in merged.entries:
                    raise ValueError(f"{name}: op {op.name} has kernels in both {merged.entries[op][0].__module__} "
                                     f"and {table.name}")
                merged.entries[op] = entry
        return merged

    def register(self, *ops: Op, supports: Callable[[Tensor], bool] = _always):
        def deco(fn):
            for op in ops:
                self.entries[op] = (fn, supports)
            return fn
        return deco

    def supports(self, node: Tensor, device_type: str | None = None) -> bool:
        """Whether a device of `device_type` computes the node: a kernel registered for that
        type (register_kernel) takes it, or this table does."""
        if node.op in VIEW_OPS or registered_entry(node, device_type) is not None:
            return True
        entry = self.entries.get(node.op)
        return entry is not None and bool(entry[1](node))

    def kernel(self, node: Tensor, device_name: str, device_type: str | None = None) -> Callable:
        """The kernel for this node: a kernel registered for `device_type` that takes it, else
        this table's; a clear error when the op or its types are unsupported."""
        registered = registered_entry(node, device_type)
        if registered is not None:
            return registered.kernel
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


def compiled_nodes(nodes, table: KernelTable, device_name: str,
                   device_type: str | None = None) -> list[tuple[Callable, Tensor]]:
    """The graph as a list of bound kernel calls: view ops and non-COMPUTE nodes dropped.
    `device_type` (the device's reg name) selects the registered kernels that apply."""
    calls = []
    for node in nodes:
        if node.op in VIEW_OPS or not (node.flags & _COMPUTE) or is_empty(node):
            continue
        fn = table.kernel(node, device_name, device_type)
        binder = getattr(fn, "bind", None)
        bound = binder(node) if binder is not None else None
        calls.append((bound or fn, node))
    return calls


def member_calls(calls) -> list:
    """Compiled calls with each call that stands for several (a CPU native run's `members`)
    replaced by those."""
    return [member for fn, node in calls for member in getattr(fn, "members", None) or ((fn, node),)]


def run_calls(calls) -> None:
    for fn, node in calls:
        fn(node)
