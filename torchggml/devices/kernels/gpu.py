"""The GPU op table (every accelerator device): the torch reference kernels, with Triton kernels
for quantized weights where the `torchggml.devices.triton` package handles the case.

GPU_KERNELS falls through to TORCH_KERNELS at lookup time (a ChainMap, not a copy), so a kernel
added to the reference table later is a GPU kernel too; entries here override it.

The Triton entries decide per call: a quantized src0 of a type `torchggml.devices.triton.supports`,
memory Triton can run on (CUDA, or CPU under TRITON_INTERPRET=1), and the shapes the wrapper
takes; anything else runs the reference table's torch kernel. `torchggml.devices.triton` is imported on first
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
from .common import view, is_float

GPU_KERNELS = KernelTable("GPU", over=TORCH_KERNELS)


@functools.lru_cache(maxsize=None)
def triton_kernels_module():
    """The torchggml.devices.triton package, or None when it cannot be imported (with a warning)."""
    try:
        from torchggml.devices import triton as triton_kernels
    except Exception as e:  # noqa: BLE001 - any failure means "use the torch kernels"
        warnings.warn(f"torchggml.devices.triton unavailable, GPU ops use the torch kernels: {type(e).__name__}: {e}",
                      RuntimeWarning, stacklevel=2)
        return None
    return triton_kernels


def triton_runs_on(device: torch.device) -> bool:
    """Triton kernels run on the memory of the device type Triton's driver compiles for (CUDA),
    and on CPU memory in the interpreter (torchggml.devices.triton.runs_on decides)."""
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


def _register_triton(op: Op, triton_ok, bind_triton):
    """The GPU entry for op: `bind_triton(node)`'s Triton call for the nodes `triton_ok` takes
    whose memory Triton runs on, else the reference table's kernel."""
    def supports(node) -> bool:
        return _torch_supports(op, node) or triton_ok(node)

    def bind(node):
        if not (triton_ok(node) and _on_triton_memory(node)):
            return _bind_torch(op, node)
        return bind_triton(node)
    return _register_bound(op, supports, bind)


# ---------------------------------------------------------------- MUL_MAT

def _triton_mul_mat_shape_ok(node) -> bool:
    a, b = node.src[0], node.src[1]
    return is_float(b) and _triton_type_ok(a) and _triton_fn("mul_mat") is not None


def _triton_mul_mat(fn, qtype, blocks, vb, out, _node) -> None:
    """One Triton product per weight matrix of a (ggml broadcasts a over b's dims 2 and 3:
    b's matrices j*r2 .. (j+1)*r2 - 1 share a's matrix j, repeat-interleaved)."""
    a3, a2, n_rows = blocks.shape[0], blocks.shape[1], blocks.shape[2]
    r3, r2 = vb.shape[0] // a3, vb.shape[1] // a2
    for i3 in range(vb.shape[0]):
        for j2 in range(a2):
            x = vb[i3, j2 * r2:(j2 + 1) * r2].reshape(-1, vb.shape[-1])  # [r2*M, K], a copy if strided
            dst = out[i3, j2 * r2:(j2 + 1) * r2]
            if dst.is_contiguous():
                fn(qtype, blocks[i3 // r3, j2], x, out=dst.view(-1, n_rows))
            else:
                dst.copy_(fn(qtype, blocks[i3 // r3, j2], x).view(dst.shape))


def _bind_triton_mul_mat(node):
    """Views are bound once per compiled node, never values."""
    a, b = node.src[0], node.src[1]
    # blocks uint8 [a3, a2, N, row_bytes], b F32/F16 [b3, b2, M, K], out F32 [b3, b2, M, N]
    return functools.partial(_triton_mul_mat, _triton_fn("mul_mat"), a.type, view(a), view(b), view(node))


mul_mat = _register_triton(Op.MUL_MAT, _triton_mul_mat_shape_ok, _bind_triton_mul_mat)


# ---------------------------------------------------------------- GET_ROWS

def _triton_get_rows_shape_ok(node) -> bool:
    a, ids = node.src[0], node.src[1]
    return (ids.ne[1] == a.ne[2] and ids.ne[2] == a.ne[3] and ids.ne[3] == 1
            and is_float(node) and _triton_type_ok(a) and _triton_fn("get_rows") is not None)


def _check_ids_on_device(node, ids) -> None:
    """The ids' range checked on the device (no host sync: CUDA graphs capture it)."""
    tk = triton_kernels_module()
    tk.assert_ids_async(f"{node.op.name} {node.describe()}: ids", ids, node.src[0].ne[2 if node.op == Op.MUL_MAT_ID else 1])


def _triton_get_rows(fn, qtype, blocks, vids, out, node) -> None:
    """Rows ids[0, i2, i1, :] of a's matrix [i2, i1] into out[i2, i1], one call per matrix."""
    _check_ids_on_device(node, vids)
    for i2 in range(blocks.shape[0]):
        for i1 in range(blocks.shape[1]):
            rows = fn(qtype, blocks[i2, i1], vids[0, i2, i1], dtype=out.dtype, check_bounds=False)
            out[i2, i1].copy_(rows)


def _bind_triton_get_rows(node):
    a, ids = node.src[0], node.src[1]
    # blocks uint8 [a3, a2, n_rows, row_bytes], ids [1, a3, a2, n], out [a3, a2, n, ne0]
    return functools.partial(_triton_get_rows, _triton_fn("get_rows"), a.type, view(a), view(ids), view(node))


get_rows = _register_triton(Op.GET_ROWS, _triton_get_rows_shape_ok, _bind_triton_get_rows)


# ---------------------------------------------------------------- MUL_MAT_ID

def _triton_mul_mat_id_shape_ok(node) -> bool:
    a, b = node.src[0], node.src[1]
    return is_float(b) and _triton_type_ok(a) and _triton_fn("mul_mat_id") is not None


def _triton_mul_mat_id(fn, qtype, blocks, x, ids, out, node) -> None:
    _check_ids_on_device(node, ids)
    fn(qtype, blocks, x, ids, out=out, check_bounds=False)


def _bind_triton_mul_mat_id(node):
    a, b, ids = node.src[0], node.src[1], node.src[2]
    # ggml [K, N, n_expert] x [K, n_used|1, n_tokens] by ids [n_used, n_tokens] -> [N, n_used, n_tokens]
    return functools.partial(_triton_mul_mat_id, _triton_fn("mul_mat_id"), a.type, view(a)[0], view(b)[0],
                             view(ids)[0, 0], view(node)[0])


mul_mat_id = _register_triton(Op.MUL_MAT_ID, _triton_mul_mat_id_shape_ok, _bind_triton_mul_mat_id)
