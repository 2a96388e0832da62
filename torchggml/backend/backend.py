"""Backends (ggml_backend_i): a stream of work on one device. Optional entries default as in ggml."""
from __future__ import annotations

import uuid
from abc import ABC, abstractmethod

from ..enums import Status
from ..tensor import memory_buffer


class Backend(ABC):
    """ggml_backend. Subclasses implement graph_compute; async entries are optional: returning
    NotImplemented (the default) makes the mirrored functions fall back to synchronous calls."""

    def __init__(self, device, name: str | None = None):
        self.device = device
        self.name = name or device.name
        self.guid = uuid.uuid5(uuid.NAMESPACE_OID, f"torchggml.{type(self).__name__}").bytes

    def __repr__(self):
        return f"<ggml.Backend {self.name}>"

    def get_name(self) -> str:
        return self.name

    def free(self) -> None:
        pass

    # --- async data movement; NotImplemented means "use the synchronous fallback"
    def set_tensor_async(self, tensor, data, offset: int, size: int):
        return NotImplemented

    def get_tensor_async(self, tensor, out, offset: int, size: int):
        return NotImplemented

    def cpy_tensor_async(self, backend_src: "Backend", src, dst) -> bool:
        """Copy src (on backend_src) into dst (on this backend) asynchronously; False if unable."""
        return False

    def synchronize(self) -> None:
        pass

    # --- graph plans; the default plan is the graph itself
    def graph_plan_create(self, graph):
        return NotImplemented

    def graph_plan_free(self, plan) -> None:
        pass

    def graph_plan_update(self, plan, graph):
        return NotImplemented

    def graph_plan_compute(self, plan) -> Status:
        return NotImplemented

    @abstractmethod
    def graph_compute(self, graph) -> Status:
        """Run the graph (asynchronously where the backend can); return a Status."""

    # --- events; NotImplemented where the backend has no events
    def event_record(self, event):
        return NotImplemented

    def event_wait(self, event):
        return NotImplemented

    def owns(self, t) -> bool:
        """Whether this backend's stream may read and write t's memory: a buffer of its own
        device (device or host memory) or of a buffer type its device supports. The one
        ownership check (async data movement asks it)."""
        buffer = memory_buffer(t)
        if buffer is None:
            return False
        owner = buffer.buft.get_device()
        return owner is None or owner is self.device or self.device.supports_buft(buffer.buft)

    # --- device delegation
    def get_device(self):
        return self.device

    def get_default_buffer_type(self):
        return self.device.get_buffer_type()

    def supports_op(self, op) -> bool:
        return self.device.supports_op(op)

    def supports_buft(self, buft) -> bool:
        return self.device.supports_buft(buft)

    def offload_op(self, op) -> bool:
        return self.device.offload_op(op)


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
    if size and backend.set_tensor_async(t, src, offset, size) is NotImplemented:
        backend_tensor_set(t, src, offset, size)


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
    if size and backend.get_tensor_async(t, dst, offset, size) is NotImplemented:
        backend_tensor_get(t, dst, offset, size)


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
    def __init__(self, graph):
        self.graph = graph


def backend_graph_plan_create(backend: Backend, graph):
    plan = backend.graph_plan_create(graph)
    return _DefaultPlan(graph) if plan is NotImplemented else plan


def backend_graph_plan_free(backend: Backend, plan) -> None:
    if not isinstance(plan, _DefaultPlan):
        backend.graph_plan_free(plan)


def backend_graph_plan_update(backend: Backend, plan, graph) -> None:
    if isinstance(plan, _DefaultPlan) or backend.graph_plan_update(plan, graph) is NotImplemented:
        plan.graph = graph


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
