"""GET_ROWS (any readable type -> F32, I32 -> I32; only the gathered rows are dequantized) and
SET_ROWS (F32/F16 rows converted or quantized into the destination at I64/I32 indices)."""
from __future__ import annotations

import functools

import torch

from ...enums import Op
from ...types import Type
from .table import KernelTable, binds
from .common import device_graph_capturing, view
from .copy import needs_float_route
from .matmul import is_readable, float_reader

KERNELS = KernelTable("rows")


def _checked_indices(idx: torch.Tensor, n_rows: int, what, node) -> torch.Tensor:
    """idx as it is; an IndexError naming the op when an index is outside [0, n_rows) (torch
    indexing would wrap negative ones). The check syncs the device, so it is skipped while a
    CUDA graph captures."""
    if idx.numel() and not device_graph_capturing(idx):
        lo, hi = torch.aminmax(idx)
        if int(lo) < 0 or int(hi) >= n_rows:
            raise IndexError(f"{node.op.name}: row indices outside [0, {n_rows}) in {what.describe()} "
                             f"for {node.describe()}")
    return idx


def _batch_index(ne3: int, ne2: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Index tensors over dims 3 and 2 that broadcast against [ne3, ne2, n] row indices."""
    return (torch.arange(ne3, device=device).view(ne3, 1, 1),
            torch.arange(ne2, device=device).view(1, ne2, 1))


# ---------------------------------------------------------------- GET_ROWS

def _supports_get_rows(node) -> bool:
    a, ids = node.src[0], node.src[1]
    if ids is None or ids.type != Type.I32:
        return False
    if a.type == Type.I32:
        return node.type == Type.I32
    return is_readable(a) and node.type == Type.F32


def _gather_rows(table, flat_ids, n_rows: int, ids, to_out, out, node) -> None:
    """out = table[ids] for one matrix: straight into the node when no conversion is needed."""
    idx = _checked_indices(flat_ids, n_rows, ids, node)
    if to_out is None:
        torch.index_select(table, 0, idx, out=out)
    else:
        out.copy_(to_out(table.index_select(0, idx)))


def _gather_batched_rows(va, vids, batch, n_rows: int, ids, to_out, out, node) -> None:
    i3, i2 = batch
    rows = va[i3, i2, _checked_indices(vids, n_rows, ids, node).long()]
    out.copy_(rows if to_out is None else to_out(rows))


def _bind_get_rows(node):
    """out[i3, i2, j] = a[i3, i2, ids[i3, i2, j]]; only the gathered rows are converted."""
    a, ids = node.src[0], node.src[1]
    va, out, n_rows = view(a), view(node), a.ne[1]
    to_out = None if va.dtype == out.dtype else float_reader(a)
    if a.ne[2] == 1 and a.ne[3] == 1:
        return functools.partial(_gather_rows, va[0, 0], view(ids)[0, 0, 0], n_rows, ids, to_out, out[0, 0])
    batch = _batch_index(a.ne[3], a.ne[2], va.device)
    return functools.partial(_gather_batched_rows, va, view(ids)[0], batch, n_rows, ids, to_out, out)


@KERNELS.register(Op.GET_ROWS, supports=_supports_get_rows)
@binds(_bind_get_rows)
def get_rows(node):
    _bind_get_rows(node)(node)


# ---------------------------------------------------------------- SET_ROWS

@functools.lru_cache(maxsize=None)
def _writable_types() -> frozenset:
    from ...quants import quantize_types
    return frozenset(quantize_types())


def _supports_set_rows(node) -> bool:
    b, idx = node.src[0], node.src[1]
    return (b is not None and b.type in (Type.F32, Type.F16) and idx is not None
            and idx.type in (Type.I32, Type.I64) and node.type in _writable_types())


def _cast_rows(dtype: torch.dtype, via_float: bool, rows: torch.Tensor) -> torch.Tensor:
    return (rows.float() if via_float else rows).to(dtype)


def _quantize_rows(block_type, rows: torch.Tensor) -> torch.Tensor:
    from ...quants import quantize
    return quantize(block_type, rows.float().contiguous())


def _row_writer(node, src: torch.dtype, dst: torch.dtype):
    """fn(rows of b) -> the rows in the destination's representation: cast to its float type
    (as through float32), or quantized into its block type."""
    if node.type in (Type.F32, Type.F16, Type.BF16):
        return functools.partial(_cast_rows, dst, needs_float_route(src, dst))
    return functools.partial(_quantize_rows, node.type)


def _scatter_rows(table, flat_idx, n_rows: int, c, to_dst, rows, node) -> None:
    table.index_put_((_checked_indices(flat_idx, n_rows, c, node).long(),), to_dst(rows))


def _scatter_batched_rows(dst, batch, vidx, reps, n_rows: int, c, to_dst, vb, node) -> None:
    idx = vidx if reps is None else vidx.repeat(reps)  # ids tiled over b's dims 2 and 3: a copy
    i3, i2 = batch
    dst[i3, i2, _checked_indices(idx, n_rows, c, node).long()] = to_dst(vb)


def _bind_set_rows(node):
    """dst[i3, i2, c[i3 % c3, i2 % c2, j]] = b[i3, i2, j] (torch order), converted to dst's type."""
    b, c = node.src[0], node.src[1]
    ne3, ne2, n_rows = b.ne[3], b.ne[2], node.ne[1]
    vb, dst = view(b), view(node)  # dst: the destination's memory
    to_dst = _row_writer(node, vb.dtype, dst.dtype)
    if ne3 == 1 and ne2 == 1:
        return functools.partial(_scatter_rows, dst[0, 0], view(c)[0, 0, 0], n_rows, c, to_dst, vb[0, 0])
    vidx = view(c)[0]  # [c3, c2, n]
    reps = (ne3 // vidx.shape[0], ne2 // vidx.shape[1], 1)
    return functools.partial(_scatter_batched_rows, dst, _batch_index(ne3, ne2, dst.device), vidx,
                             None if reps == (1, 1, 1) else reps, n_rows, c, to_dst, vb)


@KERNELS.register(Op.SET_ROWS, supports=_supports_set_rows)
@binds(_bind_set_rows)
def set_rows(node):
    _bind_set_rows(node)(node)
