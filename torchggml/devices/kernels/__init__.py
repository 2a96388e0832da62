"""Op -> torch implementation tables.

A kernel is `fn(node) -> None`: it reads its sources' torch views and writes the node's view.
Every entry also has a `supports(node) -> bool` predicate over types and shapes, so that
`supports_op` answers truthfully. A kernel may also have a `bind(node)` attribute (see
`binds`): called once when a graph is compiled, it returns a call with the views and the torch
function already chosen (or None to use the generic kernel), so compute does no per-node work
beyond the torch op itself.

TORCH_KERNELS (reference.py) is the torch reference table, built from the family modules
here (each holds its own small table); every device's table layers over it: GPU_KERNELS
(gpu.py) with Triton kernels, the CPU device's table (devices/cpu/kernels.py) with repacked
weights.
"""
from .gpu import GPU_KERNELS
from .reference import TORCH_KERNELS
from .table import KernelTable, UnsupportedOpError, binds, compiled_nodes, member_calls, run_calls

__all__ = ["GPU_KERNELS", "TORCH_KERNELS", "KernelTable", "UnsupportedOpError", "binds",
           "compiled_nodes", "run_calls"]
