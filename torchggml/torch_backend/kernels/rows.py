"""GET_ROWS (any readable type -> F32, I32 -> I32; only the gathered rows are dequantized) and
SET_ROWS (F32/F16 rows converted or quantized into the destination at I64/I32 indices)."""
from __future__ import annotations

import functools

import torch

from ...enums import Op
from . import CPU_KERNELS
from .common import view, as_float
from .matmul import is_readable, rows_as_float


def capturing(t: torch.Tensor) -> bool:
    """A CUDA graph is being captured on t's device: no host syncs allowed."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _checked_indices(idx: torch.Tensor, n_rows: int, what, node) -> torch.Tensor:
    """Indices as int64; an IndexError naming the op when one is out of range (the check syncs
    the device, so it is skipped while a CUDA graph captures)."""
    idx = idx.long()
    if idx.numel() and not capturing(idx) and (int(idx.min()) < 0 or int(idx.max()) >= n_rows):
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
    if ids is None or ids.type.name != "I32":
        return False
    if a.type.name == "I32":
        return node.type.name == "I32"
    return is_readable(a) and node.type.name == "F32"


@CPU_KERNELS.register(Op.GET_ROWS, supports=_supports_get_rows)
def get_rows(node):
    a, ids = node.src[0], node.src[1]
    idx = _checked_indices(view(ids)[0], a.ne[1], ids, node)  # [a3, a2, n]
    i3, i2 = _batch_index(a.ne[3], a.ne[2], idx.device)
    rows = view(a)[i3, i2, idx]  # [a3, a2, n, row] (uint8 blocks for block types)
    out = view(node)
    out.copy_(rows if a.type.name == "I32" else rows_as_float(a, rows))


# ---------------------------------------------------------------- SET_ROWS

@functools.lru_cache(maxsize=None)
def _writable_types() -> frozenset:
    from ...quants import quantize_types
    return frozenset(quantize_types())


def _supports_set_rows(node) -> bool:
    b, idx = node.src[0], node.src[1]
    return (b is not None and b.type.name in ("F32", "F16") and idx is not None
            and idx.type.name in ("I32", "I64") and node.type in _writable_types())


@CPU_KERNELS.register(Op.SET_ROWS, supports=_supports_set_rows)
def set_rows(node):
    """dst[i3, i2, c[i3 % c3, i2 % c2, j]] = b[i3, i2, j] (torch order), converted to dst's type."""
    b, c = node.src[0], node.src[1]
    ne3, ne2 = b.ne[3], b.ne[2]
    idx = view(c)[0]  # [c3, c2, n]
    idx = _checked_indices(idx.repeat(ne3 // idx.shape[0], ne2 // idx.shape[1], 1), node.ne[1], c, node)
    values = as_float(b)
    dst = view(node)  # the destination's memory (uint8 blocks for block types)
    if node.type.name in ("F32", "F16", "BF16"):
        values = values.to(dst.dtype)
    else:
        from ...quants import quantize
        values = quantize(node.type, values.contiguous())
    i3, i2 = _batch_index(ne3, ne2, idx.device)
    dst[i3, i2, idx] = values
