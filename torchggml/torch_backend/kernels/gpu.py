"""The GPU op table (every accelerator device): the torch reference kernels, with Triton kernels
for quantized weights where the `triton_kernels` package handles the case.

GPU_KERNELS falls through to TORCH_KERNELS at lookup time (a ChainMap, not a copy), so a kernel
added to the reference table later is a GPU kernel too; entries here override it.

The Triton entries decide per call: a quantized src0 of a type `triton_kernels.supports`,
memory Triton can run on (CUDA, or CPU under TRITON_INTERPRET=1), and the shapes the wrapper
takes; anything else runs the reference table's torch kernel. `triton_kernels` is imported on first
use; a missing or broken package leaves the torch kernels in place.
"""
from __future__ import annotations

import functools
import warnings

import torch

from ...enums import Op
from ...types import type_traits
from .reference import TORCH_KERNELS
from .table import KernelTable, UnsupportedOpError, binds
from .common import device_graph_capturing, view, write, is_float

GPU_KERNELS = KernelTable("GPU", over=TORCH_KERNELS)


@functools.lru_cache(maxsize=None)
def triton_kernels_module():
    """The triton_kernels package, or None when it cannot be imported (with a warning)."""
    try:
        import triton_kernels
    except Exception as e:  # noqa: BLE001 - any failure means "use the torch kernels"
        warnings.warn(f"triton_kernels unavailable, GPU ops use the torch kernels: {type(e).__name__}: {e}",
                      RuntimeWarning, stacklevel=2)
        return None
    return triton_kernels


def triton_runs_on(device: torch.device) -> bool:
    """Triton kernels run on the memory of the device type Triton's driver compiles for (CUDA),
    and on CPU memory in the interpreter (triton_kernels.runs_on decides)."""
    tk = triton_kernels_module()
    try:
        return tk is not None and bool(tk.runs_on(device))
    except RuntimeError:  # triton was imported before TRITON_INTERPRET was set
        return False


def _triton_fn(name: str):
    tk = triton_kernels_module()
    return getattr(tk, name, None) if tk is not None else None


def _triton_type_ok(t) -> bool:
    """A block type the Triton kernels decode (checked cheaply first: most ops are float)."""
    if not type_traits(t.type).is_quantized:
        return False
    tk = triton_kernels_module()
    return tk is not None and bool(tk.supports(t.type))


def _torch_entry(op: Op):
    return TORCH_KERNELS.entries.get(op)


def _torch_supports(op: Op, node) -> bool:
    entry = _torch_entry(op)
    return entry is not None and bool(entry[1](node))


def _run_torch(op: Op, node, why: str) -> None:
    entry = _torch_entry(op)
    if entry is None or not entry[1](node):
        raise UnsupportedOpError(f"op {op.name} on {node.describe()}: {why}, and the torch kernel "
                                 f"does not support these types")
    entry[0](node)


def _on_triton_memory(node) -> bool:
    return triton_runs_on(view(node).device)


def _register_bound(op: Op, supports, bind):
    """The GPU kernel for op: `bind(node)`'s call (Triton, or the reference table's bound call), else
    the reference table's generic kernel."""
    @GPU_KERNELS.register(op, supports=supports)
    @binds(bind)
    def kernel(node):
        call = bind(node)
        if call is None:
            return _run_torch(op, node, "Triton cannot run it here")
        call(node)
    kernel.__name__ = op.name.lower()
    return kernel


def _bind_torch(op: Op, node):
    """The reference table's bound call for a node Triton does not take, or None (generic path)."""
    if not _torch_supports(op, node):
        return None
    binder = getattr(_torch_entry(op)[0], "bind", None)
    return binder(node) if binder is not None else None


# ---------------------------------------------------------------- MUL_MAT

def _triton_mul_mat_shape_ok(node) -> bool:
    a, b = node.src[0], node.src[1]
    return (a.ne[2] == 1 and a.ne[3] == 1 and is_float(b) and _triton_type_ok(a)
            and _triton_fn("mul_mat") is not None)


def _mul_mat_supports(node) -> bool:
    return _torch_supports(Op.MUL_MAT, node) or _triton_mul_mat_shape_ok(node)


def _triton_mul_mat(fn, qtype, blocks, vb, out, _node) -> None:
    x = vb.reshape(-1, vb.shape[-1])            # [b3*b2*M, K], reshaped (maybe copied) per call
    if out.is_contiguous():
        fn(qtype, blocks, x, out=out.view(-1, blocks.shape[0]))
    else:
        out.copy_(fn(qtype, blocks, x).view(out.shape))


def _bind_mul_mat(node):
    """Triton or torch is chosen once per compiled node; views are bound, never values."""
    if not (_triton_mul_mat_shape_ok(node) and _on_triton_memory(node)):
        return _bind_torch(Op.MUL_MAT, node)
    a, b = node.src[0], node.src[1]
    # blocks uint8 [N, row_bytes], b F32/F16 [b3, b2, M, K], out F32 [b3, b2, M, N]
    return functools.partial(_triton_mul_mat, _triton_fn("mul_mat"), a.type, view(a)[0, 0], view(b), view(node))


mul_mat = _register_bound(Op.MUL_MAT, _mul_mat_supports, _bind_mul_mat)


# ---------------------------------------------------------------- GET_ROWS

def _triton_get_rows_shape_ok(node) -> bool:
    a, ids = node.src[0], node.src[1]
    return (a.ne[2] == 1 and a.ne[3] == 1 and ids.ne[1] == 1 and ids.ne[2] == 1 and ids.ne[3] == 1
            and is_float(node) and _triton_type_ok(a) and _triton_fn("get_rows") is not None)


def _get_rows_supports(node) -> bool:
    return _torch_supports(Op.GET_ROWS, node) or _triton_get_rows_shape_ok(node)


def _triton_get_rows(fn, qtype, blocks, vids, out, _node) -> None:
    # the bounds check syncs the device, which a CUDA graph capture forbids
    capturing = device_graph_capturing(out)
    rows = fn(qtype, blocks, vids.reshape(-1), dtype=out.dtype, check_bounds=not capturing)
    out.copy_(rows.view(out.shape))


def _bind_get_rows(node):
    if not (_triton_get_rows_shape_ok(node) and _on_triton_memory(node)):
        return _bind_torch(Op.GET_ROWS, node)
    a, ids = node.src[0], node.src[1]
    return functools.partial(_triton_get_rows, _triton_fn("get_rows"), a.type, view(a)[0, 0], view(ids), view(node))


get_rows = _register_bound(Op.GET_ROWS, _get_rows_supports, _bind_get_rows)


# ---------------------------------------------------------------- MUL_MAT_ID

def _triton_mul_mat_id_shape_ok(node) -> bool:
    a, b = node.src[0], node.src[1]
    return is_float(b) and _triton_type_ok(a) and _triton_fn("mul_mat_id") is not None


def _mul_mat_id_supports(node) -> bool:
    return _torch_supports(Op.MUL_MAT_ID, node) or _triton_mul_mat_id_shape_ok(node)


@GPU_KERNELS.register(Op.MUL_MAT_ID, supports=_mul_mat_id_supports)
def mul_mat_id(node):
    if not (_triton_mul_mat_id_shape_ok(node) and _on_triton_memory(node)):
        return _run_torch(Op.MUL_MAT_ID, node, "Triton cannot run it here")
    a, b, ids = node.src[0], node.src[1], node.src[2]
    # ggml [K, N, n_expert] x [K, n_used|1, n_tokens] by ids [n_used, n_tokens] -> [N, n_used, n_tokens]
    result = _triton_fn("mul_mat_id")(a.type, view(a)[0], view(b)[0], view(ids)[0, 0])
    write(node, result.unsqueeze(0))
