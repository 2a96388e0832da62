"""MAP_CUSTOM1/2/3 and CUSTOM: the node's Python callable on torch views of its memory, on any
device (see torchggml/ops/custom.py for the calling convention)."""
from __future__ import annotations

from ...enums import Op
from ...ops.custom import run_custom
from .common import view
from .table import KernelTable

KERNELS = KernelTable("custom")


@KERNELS.register(Op.MAP_CUSTOM1, Op.MAP_CUSTOM2, Op.MAP_CUSTOM3, Op.CUSTOM)
def custom(node):
    run_custom(node, view(node), [view(s) if s is not None else None for s in node.src])
