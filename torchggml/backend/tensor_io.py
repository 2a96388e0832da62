"""Moving data in and out of tensors: backend_tensor_set/get/memset/copy (synchronous)."""
from __future__ import annotations

import numpy as np
import torch

from ..tensor import Tensor, nbytes, are_same_layout
from .buffer import check_not_freed


def as_byte_tensor(data) -> torch.Tensor:
    """Any torch tensor, numpy array or bytes-like object as a flat uint8 torch tensor (no copy
    where possible)."""
    if isinstance(data, torch.Tensor):
        return data.contiguous().reshape(-1).view(torch.uint8)
    if isinstance(data, np.ndarray):
        arr = np.ascontiguousarray(data)
        if not arr.flags.writeable:
            arr = arr.copy()
        return torch.from_numpy(arr.reshape(-1).view(np.uint8))
    try:
        mv = memoryview(data)
    except TypeError:
        raise TypeError(f"tensor data must be a torch.Tensor, a numpy array or bytes-like, not {type(data).__name__}") from None
    arr = np.frombuffer(mv, dtype=np.uint8)
    return torch.from_numpy(arr.copy() if not arr.flags.writeable else arr)


def as_writable_byte_tensor(data, what: str) -> torch.Tensor:
    """A destination (torch tensor, numpy array, writable bytes-like) as a flat uint8 torch
    tensor sharing its memory, so that writes land in `data`."""
    if isinstance(data, torch.Tensor):
        if not data.is_contiguous():
            raise ValueError(f"{what}: the destination tensor must be contiguous")
        return data.view(-1).view(torch.uint8) if data.numel() else data.view(torch.uint8)
    if isinstance(data, np.ndarray):
        if not (data.flags.c_contiguous and data.flags.writeable):
            raise ValueError(f"{what}: the destination array must be C-contiguous and writable")
        return torch.from_numpy(data.reshape(-1).view(np.uint8))
    try:
        mv = memoryview(data)
    except TypeError:
        raise TypeError(f"{what}: the destination must be a torch.Tensor, a numpy array or a writable "
                        f"bytes-like object, not {type(data).__name__}") from None
    if mv.readonly:
        raise ValueError(f"{what}: the destination {type(data).__name__} is read-only")
    return torch.from_numpy(np.frombuffer(mv, dtype=np.uint8))


def _check_range(t: Tensor, offset: int, size: int, what: str) -> None:
    if t.buffer is None or t.data is None:
        raise RuntimeError(f"{what}: {t.describe()} is not allocated")
    check_not_freed(t.buffer, what, t)
    if offset < 0 or size < 0 or offset + size > nbytes(t):
        raise IndexError(f"{what}: {size} bytes at offset {offset} are past the end of {t.describe()}, "
                         f"which has {nbytes(t)} bytes")


_BYTES = (torch.uint8, torch.int8)


def _values_for(t: Tensor, data, what: str):
    """`data` ready to be written as bytes into t. Bytes-like data and uint8/int8 arrays are raw
    bytes (ggml's meaning). Typed torch/numpy data of another dtype than the tensor's is
    converted when no value can change meaning (float to float, integer to integer when every
    value fits) and refused otherwise: its bytes would otherwise be reinterpreted."""
    if isinstance(data, np.ndarray):
        if data.dtype.kind not in "biuf" or data.dtype == np.uint8 or data.dtype == np.int8:
            return data
        data = torch.from_numpy(np.ascontiguousarray(data))
    if not isinstance(data, torch.Tensor) or data.dtype in _BYTES:
        return data
    from ..types import type_traits
    want = type_traits(t.type).dtype
    if want is None:
        raise TypeError(f"{what}: {t.describe()} holds {t.type.name} blocks: give its raw bytes (uint8, e.g. from "
                        f"quants.quantize), not {data.dtype} values")
    if data.dtype == want:
        return data
    if data.is_floating_point() and want.is_floating_point:
        return data.to(want)
    if not data.is_floating_point() and not data.is_complex() and not want.is_floating_point:
        info = torch.iinfo(want)
        if data.numel() and (int(data.min()) < info.min or int(data.max()) > info.max):
            raise ValueError(f"{what}: values of {t.describe()} must fit in {want}; got "
                             f"[{int(data.min())}, {int(data.max())}]")
        return data.to(want)
    raise TypeError(f"{what}: {t.describe()} is {want}; {data.dtype} data would change meaning (convert it "
                    f"yourself, or pass raw bytes as uint8)")


def backend_tensor_set(t: Tensor, data, offset: int = 0, size: int | None = None) -> None:
    """Write `data` into the tensor's memory at byte `offset` (all of data by default): raw bytes
    (bytes-like, uint8), or values of the tensor's dtype; other float or integer dtypes are
    converted to it where that keeps every value (see _values_for), other data is refused."""
    src = as_byte_tensor(_values_for(t, data, "backend_tensor_set"))
    if size is None:
        size = src.numel()
    if size > src.numel():
        raise ValueError(f"backend_tensor_set: size {size} exceeds the {src.numel()} bytes of data for {t.describe()}")
    _check_range(t, offset, size, "backend_tensor_set")
    if size:
        t.buffer.set_tensor(t, src, offset, size)


def backend_tensor_get(t: Tensor, data=None, offset: int = 0, size: int | None = None):
    """Read the tensor's bytes into `data`, or return a new CPU torch tensor: shape reversed(ne)
    with the type's dtype (uint8 blocks for block types) when reading the whole tensor, flat
    uint8 bytes for a partial read."""
    whole = offset == 0 and size is None
    if size is None:
        size = nbytes(t) - offset
    _check_range(t, offset, size, "backend_tensor_get")
    if data is None:
        if whole:
            return _get_whole(t)
        out = torch.empty(size, dtype=torch.uint8)
        t.buffer.get_tensor(t, out, offset, size)
        return out
    dst = as_writable_byte_tensor(data, "backend_tensor_get")
    if dst.numel() < size:
        raise ValueError(f"backend_tensor_get: destination has {dst.numel()} bytes, {size} needed for {t.describe()}")
    t.buffer.get_tensor(t, dst, offset, size)
    return data


def _get_whole(t: Tensor) -> torch.Tensor:
    """The whole tensor as a new CPU tensor, shape reversed(ne) (leading 1s dropped to n_dims)."""
    from .. import tensor as _t
    from ..types import type_traits
    tr = type_traits(t.type)
    shape = (t.ne[3], t.ne[2], t.ne[1], t.ne[0] if tr.dtype is not None else t.ne[0] // tr.blck_size * tr.type_size)
    if getattr(t.buffer, "storage", None) is None:  # no single storage to view (a meta buffer)
        raw = torch.empty(nbytes(t), dtype=torch.uint8)
        t.buffer.get_tensor(t, raw, 0, nbytes(t))
        out = raw.view(tr.dtype if tr.dtype is not None else torch.uint8).reshape(shape)
    else:
        from ..storage import tensor_view
        view = tensor_view(t)
        out = torch.empty(view.shape, dtype=view.dtype)
        out.copy_(view)
    return out.reshape(shape[4 - _t.n_dims(t):]) if _t.n_dims(t) < 4 else out


def backend_tensor_memset(t: Tensor, value: int, offset: int = 0, size: int | None = None) -> None:
    if size is None:
        size = nbytes(t) - offset
    _check_range(t, offset, size, "backend_tensor_memset")
    if t.buffer.memset_tensor is None:
        raise NotImplementedError(f"backend_tensor_memset: buffer {t.buffer.name} cannot memset tensors ({t.describe()})")
    if size:
        t.buffer.memset_tensor(t, value, offset, size)


def backend_tensor_copy(src: Tensor, dst: Tensor) -> None:
    """Copy src's bytes into dst (same layout), device to device where the buffers allow."""
    if not are_same_layout(src, dst):
        raise ValueError(f"backend_tensor_copy: layouts differ: {src.describe()} -> {dst.describe()}")
    if src is dst:
        return
    _check_range(src, 0, nbytes(src), "backend_tensor_copy")
    _check_range(dst, 0, nbytes(dst), "backend_tensor_copy")
    if dst.buffer.cpy_tensor(src, dst) or src.buffer.cpy_tensor(src, dst):
        return
    # fall back through host memory
    tmp = torch.empty(nbytes(src), dtype=torch.uint8)
    src.buffer.get_tensor(src, tmp, 0, nbytes(src))
    dst.buffer.set_tensor(dst, tmp, 0, nbytes(src))


class BoundIO:
    """Values written into and read from the same tensors many times (a model's inputs and
    logits, every decode step): through numpy views of their memory, made once per tensor,
    where backend_tensor_set/get check and view again at every call. Only host memory of a type numpy has, contiguous; other tensors (device memory,
    block types) go through backend_tensor_set/get. Integer values must fit the tensor's type,
    as backend_tensor_set asks."""

    def __init__(self):
        self._views = {}  # id(tensor) -> (buffer, data address, view or None)

    def _view(self, t: Tensor):
        entry = self._views.get(id(t))
        if entry is None or entry[0] is not t.buffer or entry[1] != t.data:
            entry = self._views[id(t)] = (t.buffer, t.data, _host_view(t))
        return entry[2]

    def set(self, t: Tensor, values) -> None:
        view = self._view(t)
        if type(values) is np.ndarray and view is not None and values.dtype == view.dtype and values.size == view.size:
            check_not_freed(t.buffer, "backend_tensor_set", t)  # (the common case, every decode step)
            view[:] = values.reshape(-1)
            return
        if isinstance(values, torch.Tensor):  # numpy has no bf16, and reads only host memory
            if values.dtype == torch.bfloat16 or values.device.type != "cpu":
                backend_tensor_set(t, values)
                return
            values = values.detach().numpy()
        if (view is None or not isinstance(values, np.ndarray) or values.size != view.size
                or not _fits(values, view.dtype)):
            backend_tensor_set(t, values)  # its checks and messages
            return
        check_not_freed(t.buffer, "backend_tensor_set", t)
        np.copyto(view, values.reshape(view.shape), casting="same_kind")

    def get(self, t: Tensor, out: np.ndarray) -> None:
        """t's values into out (a numpy array of t's dtype and element count)."""
        view = self._view(t)
        if view is None or out.dtype != view.dtype or out.size != view.size:
            backend_tensor_get(t, out)
            return
        check_not_freed(t.buffer, "backend_tensor_get", t)
        np.copyto(out.reshape(view.shape), view)


def _host_view(t: Tensor):
    """A flat numpy view of t's values when they lie in host memory, contiguous, of a numpy
    dtype; else None."""
    from ..storage import tensor_bytes
    from ..tensor import is_contiguous
    from ..types import type_traits
    buf = t.buffer
    dtype = type_traits(t.type).dtype
    if (buf is None or t.data is None or not buf.buft.is_host() or dtype is None or dtype == torch.bfloat16
            or getattr(buf, "storage", None) is None or buf.storage.device.type != "cpu" or not is_contiguous(t)):
        return None
    return tensor_bytes(t).numpy().view(torch.empty(0, dtype=dtype).numpy().dtype)


def _fits(values: np.ndarray, dtype: np.dtype) -> bool:
    """Whether values keep their meaning as dtype (as backend_tensor_set converts them)."""
    if values.dtype == dtype or (values.dtype.kind == "f" and dtype.kind == "f"):
        return True
    if values.dtype.kind in "iu" and dtype.kind in "iu":
        info = np.iinfo(dtype)
        return values.size == 0 or (int(values.min()) >= info.min and int(values.max()) <= info.max)
    return False
