"""Backends: the mirrored functions (backend_*). They check arguments, call the Backend
interface of backend/impl.py and apply ggml's fallbacks where an optional member is None."""
from __future__ import annotations

from .impl import Backend
from ..enums import Status


# ---------------------------------------------------------------- mirrored functions

def backend_guid(backend: Backend) -> bytes:
    return backend.guid


def backend_name(backend: Backend) -> str:
    return backend.get_name()


def backend_free(backend: Backend | None) -> None:
    if backend is not None:
        backend.free()


def backend_get_default_buffer_type(backend: Backend):
    return backend.get_default_buffer_type()


def backend_alloc_buffer(backend: Backend, size: int):
    from .buffer import backend_buft_alloc_buffer
    return backend_buft_alloc_buffer(backend.get_default_buffer_type(), size)


def backend_get_alignment(backend: Backend) -> int:
    return backend.get_default_buffer_type().get_alignment()


def backend_get_max_size(backend: Backend) -> int:
    return backend.get_default_buffer_type().get_max_size()


def backend_get_device(backend: Backend):
    return backend.get_device()


def _check_backend_owns(backend: Backend, t, what: str) -> None:
    if t.buffer is None:
        raise RuntimeError(f"{what}: {t.describe()} is not allocated")
    if not backend.owns(t):
        raise ValueError(f"{what}: {t.describe()} lives in buffer {t.buffer.name} of device "
                         f"{t.buffer.buft.get_device().name}, not usable by backend {backend.name}")


def backend_tensor_set_async(backend: Backend, t, data, offset: int = 0, size: int | None = None) -> None:
    """Queue a write of `data`'s bytes into the tensor, ordered on the backend's stream.

    Upstream's contract: `data` must not be modified until backend_synchronize (the backend
    keeps it alive until the copy has run). Backends without async copies write at once."""
    from .tensor_io import as_byte_tensor, backend_tensor_set, _check_range
    _check_backend_owns(backend, t, "backend_tensor_set_async")
    src = as_byte_tensor(data)
    size = src.numel() if size is None else size
    if size > src.numel():
        raise ValueError(f"backend_tensor_set_async: size {size} exceeds the {src.numel()} bytes of data for {t.describe()}")
    _check_range(t, offset, size, "backend_tensor_set_async")
    if not size:
        return
    if backend.set_tensor_async is None:
        backend_tensor_set(t, src, offset, size)
    else:
        backend.set_tensor_async(t, src, offset, size)


def backend_tensor_get_async(backend: Backend, t, data, offset: int = 0, size: int | None = None) -> None:
    """Queue a read of the tensor into `data` (a contiguous torch tensor, a writable numpy array
    or bytes-like object), ordered on the backend's stream: `data` holds the result only after
    backend_synchronize."""
    from .tensor_io import backend_tensor_get, as_writable_byte_tensor, _check_range
    from ..tensor import nbytes
    _check_backend_owns(backend, t, "backend_tensor_get_async")
    size = nbytes(t) - offset if size is None else size
    _check_range(t, offset, size, "backend_tensor_get_async")
    dst = as_writable_byte_tensor(data, "backend_tensor_get_async")
    if dst.numel() < size:
        raise ValueError(f"backend_tensor_get_async: destination has {dst.numel()} bytes, {size} needed for {t.describe()}")
    if not size:
        return
    if backend.get_tensor_async is None:
        backend_tensor_get(t, dst, offset, size)
    else:
        backend.get_tensor_async(t, dst, offset, size)


def backend_tensor_copy_async(backend_src: Backend, backend_dst: Backend, src, dst) -> None:
    """Copy src into dst ordered after the work queued on both backends (upstream's fallback:
    synchronize both, then a synchronous copy)."""
    from .tensor_io import backend_tensor_copy
    from ..tensor import are_same_layout
    if not are_same_layout(src, dst):
        raise ValueError(f"backend_tensor_copy_async: layouts differ: {src.describe()} -> {dst.describe()}")
    if src is dst:
        return
    if backend_dst.cpy_tensor_async(backend_src, src, dst):
        return
    backend_src.synchronize()
    backend_dst.synchronize()
    backend_tensor_copy(src, dst)


def backend_synchronize(backend: Backend) -> None:
    backend.synchronize()


class _DefaultPlan:
    """The plan of a backend without graph plans: the graph, computed by graph_compute."""

    def __init__(self, graph):
        self.graph = graph


def backend_graph_plan_create(backend: Backend, graph):
    if backend.graph_plan_create is None:
        return _DefaultPlan(graph)
    return backend.graph_plan_create(graph)


def backend_graph_plan_free(backend: Backend, plan) -> None:
    if not isinstance(plan, _DefaultPlan):
        backend.graph_plan_free(plan)


def backend_graph_plan_update(backend: Backend, plan, graph) -> None:
    if isinstance(plan, _DefaultPlan) or backend.graph_plan_update is None:
        plan.graph = graph
    else:
        backend.graph_plan_update(plan, graph)


def backend_graph_plan_compute(backend: Backend, plan) -> Status:
    if isinstance(plan, _DefaultPlan):
        return backend_graph_compute(backend, plan.graph)
    return backend.graph_plan_compute(plan)


def backend_graph_compute_async(backend: Backend, graph) -> Status:
    return backend.graph_compute(graph)


def backend_graph_compute(backend: Backend, graph) -> Status:
    status = backend.graph_compute(graph)
    backend.synchronize()
    return status


def backend_supports_op(backend: Backend, op) -> bool:
    return backend.supports_op(op)


def backend_supports_buft(backend: Backend, buft) -> bool:
    return backend.supports_buft(buft)


def backend_offload_op(backend: Backend, op) -> bool:
    return backend.offload_op(op)
