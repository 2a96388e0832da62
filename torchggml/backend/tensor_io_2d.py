"""2-D data movement (newest ggml-backend.h): n_copies rows of `size` bytes, row i between
data[i*stride_data:] and the tensor's bytes at offset + i*stride_tensor.

    backend_tensor_set_2d(t, data, offset, size, n_copies, stride_tensor, stride_data)
    backend_tensor_get_2d(t, data, offset, size, n_copies, stride_tensor, stride_data)
    backend_tensor_set_2d_async(backend, ...), backend_tensor_get_2d_async(backend, ...)

As upstream: one row (or a buffer/backend without the 2-D member) is a loop of the 1-D calls;
otherwise the whole region is checked once and the member copies every row.
"""
from __future__ import annotations

from functools import partial

from ..tensor import Tensor, memory_buffer
from .tensor_io import as_byte_tensor, as_writable_byte_tensor, backend_tensor_get, backend_tensor_set, _check_range


def _check_2d(t: Tensor, data, size: int, n_copies: int, stride_tensor: int, stride_data: int, offset: int,
              what: str) -> None:
    if min(size, n_copies, stride_tensor, stride_data, offset) < 0:
        raise ValueError(f"{what}: negative size, count, stride or offset for {t.describe()}")
    need = (n_copies - 1) * stride_data + size if n_copies else 0
    if data.numel() < need:
        raise ValueError(f"{what}: {n_copies} rows of {size} bytes, {stride_data} apart, need {need} bytes of "
                         f"data, got {data.numel()} ({t.describe()})")
    if n_copies:
        _check_range(t, offset, (n_copies - 1) * stride_tensor + size, what)


def _copy_2d(what: str, t: Tensor, data, offset, size, n_copies, stride_tensor, stride_data, member, row) -> None:
    """Check the region once, then the 2-D member for several rows, else `row` per row."""
    _check_2d(t, data, size, n_copies, stride_tensor, stride_data, offset, what)
    if n_copies <= 1 or member is None:
        for i in range(n_copies):
            row(t, data[i * stride_data:i * stride_data + size], offset + i * stride_tensor, size)
    elif size:
        member(t, data, offset, size, n_copies, stride_tensor, stride_data)


def backend_tensor_set_2d(t: Tensor, data, offset: int, size: int, n_copies: int, stride_tensor: int,
                          stride_data: int) -> None:
    _copy_2d("backend_tensor_set_2d", t, as_byte_tensor(data), offset, size, n_copies, stride_tensor, stride_data,
             getattr(memory_buffer(t), "set_tensor_2d", None), backend_tensor_set)


def backend_tensor_get_2d(t: Tensor, data, offset: int, size: int, n_copies: int, stride_tensor: int,
                          stride_data: int):
    _copy_2d("backend_tensor_get_2d", t, as_writable_byte_tensor(data, "backend_tensor_get_2d"), offset, size,
             n_copies, stride_tensor, stride_data, getattr(memory_buffer(t), "get_tensor_2d", None), backend_tensor_get)
    return data


def backend_tensor_set_2d_async(backend, t: Tensor, data, offset: int, size: int, n_copies: int,
                                stride_tensor: int, stride_data: int) -> None:
    from .backend import backend_tensor_set_async
    _copy_2d("backend_tensor_set_2d_async", t, as_byte_tensor(data), offset, size, n_copies, stride_tensor,
             stride_data, backend.set_tensor_2d_async, partial(backend_tensor_set_async, backend))


def backend_tensor_get_2d_async(backend, t: Tensor, data, offset: int, size: int, n_copies: int,
                                stride_tensor: int, stride_data: int) -> None:
    from .backend import backend_tensor_get_async
    _copy_2d("backend_tensor_get_2d_async", t, as_writable_byte_tensor(data, "backend_tensor_get_2d_async"), offset,
             size, n_copies, stride_tensor, stride_data, backend.get_tensor_2d_async,
             partial(backend_tensor_get_async, backend))
