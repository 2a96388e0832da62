"""Torch views of ggml tensors: (storage, data - base, type, ne, nb) -> torch.Tensor, cached."""
from __future__ import annotations

import torch

from ..backend.buffer import check_not_freed
from ..tensor import Tensor, nbytes
from ..types import type_traits


class UnallocatedTensorError(RuntimeError):
    pass


def _require_memory(t: Tensor):
    if t.data is None or t.buffer is None:
        raise UnallocatedTensorError(
            f"{t.describe()} has no memory: allocate it first (gallocr_alloc_graph, "
            f"backend_alloc_ctx_tensors, a scheduler, or a context with no_alloc=False)")
    check_not_freed(t.buffer, "tensor view", t)
    return t.buffer


def tensor_view(t: Tensor) -> torch.Tensor:
    """Zero-copy torch view of the tensor's memory: shape reversed(ne), strides from nb.

    Plain types give their dtype; block types give raw uint8 blocks [ne3, ne2, ne1, row_bytes].
    The view is cached on the tensor and rebuilt when its address or buffer changes.
    """
    cache = t._view_cache
    if cache is not None and cache[0] == t.data and cache[1] is t.buffer and not cache[1].freed:
        return cache[2]
    buffer = _require_memory(t)
    view = _build_view(t, buffer)
    t._view_cache = (t.data, t.buffer, view)
    return view


def _build_view(t: Tensor, buffer) -> torch.Tensor:
    if not getattr(buffer, "ggml_layout", True):
        raise TypeError(f"{t.describe()} is stored in buffer {buffer.name!r} in a repacked layout, "
                        f"not ggml's: only the ops its buffer type supports can read it")
    storage = buffer.storage
    offset = t.data - buffer.base
    tr = type_traits(t.type)
    ne, nb = t.ne, t.nb
    if offset < 0 or offset + nbytes(t) > buffer.size:
        raise IndexError(f"{t.describe()} lies outside its buffer {buffer.name!r} "
                         f"(offset {offset}, {nbytes(t)} bytes, buffer size {buffer.size})")
    offset = t.data - storage.data_ptr()  # a buffer may start inside its storage
    if tr.dtype is not None:
        es = tr.type_size
        if offset % es or any(s % es for s in nb):
            raise ValueError(f"{t.describe()}: offset {offset} or strides {nb} not aligned to the element size {es}")
        shape = (ne[3], ne[2], ne[1], ne[0])
        stride = (nb[3] // es, nb[2] // es, nb[1] // es, nb[0] // es)
        dtype = tr.dtype
        offset //= es
    else:
        if nb[0] != tr.type_size:
            raise ValueError(f"{t.describe()}: blocks within a row must be contiguous for a raw view")
        shape = (ne[3], ne[2], ne[1], ne[0] // tr.blck_size * tr.type_size)
        stride = (nb[3], nb[2], nb[1], 1)
        dtype = torch.uint8
    view = torch.empty(0, dtype=dtype, device=storage.device).set_(storage, offset, shape, stride)
    # keep the user-facing rank: drop nothing, ggml tensors are always 4-D internally
    return view


def byte_view(buffer, offset: int, size: int) -> torch.Tensor:
    """A flat uint8 view of `size` bytes at `offset` inside the buffer."""
    check_not_freed(buffer, "byte view")
    if offset < 0 or size < 0 or offset + size > buffer.size:
        raise IndexError(f"{size} bytes at offset {offset} are outside buffer {buffer.name!r} of size {buffer.size}")
    storage = buffer.storage
    start = buffer.base - storage.data_ptr() + offset
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, start, (size,), (1,))


def tensor_bytes(t: Tensor, offset: int = 0, size: int | None = None) -> torch.Tensor:
    """Raw bytes [data + offset, data + offset + size) of a tensor, bounds-checked against nbytes."""
    buffer = _require_memory(t)
    total = nbytes(t)
    if size is None:
        size = total - offset
    if offset < 0 or size < 0 or offset + size > total:
        raise IndexError(f"{size} bytes at offset {offset} are past the end of {t.describe()}, "
                         f"which has {total} bytes")
    return byte_view(buffer, t.data - buffer.base + offset, size)

