"""The backend interfaces, stated once (ggml-backend-impl.h's counterpart): buffer types,
buffers, backends, devices, regs and events.

Each interface is an abstract class whose members are of three kinds, marked below:
- REQUIRED: abstract; every implementation defines it.
- OPTIONAL, default given: the method here is ggml's documented default; override it or not.
- OPTIONAL, None: the class attribute is None, as C's NULL function pointer. An
  implementation that supports the member defines it as a method; one that does not leaves it
  None, and the mirrored function (backend_* in backend/) applies the documented fallback or
  raises NotImplementedError naming the object.

"Unsupported" has that one meaning: an optional member left None. Members that may decline
for particular arguments say so by returning False (cpy_tensor, cpy_tensor_async: "not for
these tensors", as upstream's bool); failures are exceptions.

See docs/architecture.md for how the layers use these.
"""
from __future__ import annotations

import sys
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import IntEnum

from ..enums import Status
from ..tensor import Tensor, memory_buffer, nbytes


class BufferUsage(IntEnum):
    ANY = 0
    WEIGHTS = 1
    COMPUTE = 2


class DeviceType(IntEnum):
    CPU = 0
    GPU = 1
    IGPU = 2
    ACCEL = 3
    META = 4


@dataclass
class DeviceCaps:
    async_: bool = False
    host_buffer: bool = False
    buffer_from_host_ptr: bool = False
    events: bool = False
    mmap_support: bool = False  # buffers can be views of a memory-mapped file (zero-copy GGUF loading)


@dataclass
class DeviceProps:
    name: str
    description: str
    memory_free: int
    memory_total: int
    type: DeviceType
    device_id: str | None
    caps: DeviceCaps = field(default_factory=DeviceCaps)


# ---------------------------------------------------------------- buffer types and buffers

class BufferFreedError(RuntimeError):
    """A freed buffer, or a tensor in one, was used (set, get, memset, copy, compute)."""


def check_not_freed(buffer: "Buffer", what: str, tensor: Tensor | None = None) -> None:
    """BufferFreedError naming the operation, the tensor and the buffer when it was freed."""
    if buffer.freed:
        subject = f"{tensor.describe()} in buffer {buffer.name!r}" if tensor is not None else f"buffer {buffer.name!r}"
        raise BufferFreedError(f"{what}: {subject} was used after the buffer was freed")


class BufferType(ABC):
    """ggml_backend_buffer_type_i: an allocator of buffers of one kind of memory on one device."""

    def __init__(self, name: str, device=None):
        self.name = name
        self.device = device

    def __repr__(self):
        return f"<ggml.BufferType {self.name}>"

    # REQUIRED
    @abstractmethod
    def alloc_buffer(self, size: int) -> "Buffer":
        """Allocate a buffer of `size` bytes; raise MemoryError when the device is out of memory."""

    # OPTIONAL, default given
    def get_name(self) -> str:
        return self.name

    def get_alignment(self) -> int:
        return 32

    def get_max_size(self) -> int:
        return sys.maxsize

    def get_alloc_size(self, tensor: Tensor) -> int:
        return nbytes(tensor)

    def is_host(self) -> bool:
        return False

    def get_device(self):
        return self.device


class Buffer(ABC):
    """ggml_backend_buffer_i: `size` bytes at address `base` in one kind of memory."""

    def __init__(self, buft: BufferType, size: int, base: int):
        self.buft = buft
        self.size = int(size)
        self.base = int(base)
        self.usage = BufferUsage.ANY
        self.freed = False

    @property
    def name(self) -> str:
        return self.buft.name

    def __repr__(self):
        return f"<ggml.Buffer {self.name} {self.size} bytes usage={self.usage.name}>"

    # REQUIRED
    @abstractmethod
    def set_tensor(self, tensor: Tensor, data, offset: int, size: int) -> None:
        """Write `size` bytes of `data` (a flat uint8 torch tensor) at tensor.data + offset."""

    @abstractmethod
    def get_tensor(self, tensor: Tensor, out, offset: int, size: int) -> None:
        """Read `size` bytes at tensor.data + offset into `out` (a flat uint8 torch tensor)."""

    @abstractmethod
    def clear(self, value: int) -> None:
        """Set every byte of the buffer to `value`."""

    # OPTIONAL, None: memset_tensor(tensor, value, offset, size); backend_tensor_memset raises
    memset_tensor = None

    # OPTIONAL, None: 2-D copies. set_tensor_2d(tensor, data, offset, size, n_copies,
    # stride_tensor, stride_data) writes n_copies rows of `size` bytes, row i from
    # data[i*stride_data:] to tensor.data + offset + i*stride_tensor (get_tensor_2d reads them
    # into `out`); without them backend_tensor_set_2d / _get_2d loop over set/get_tensor
    set_tensor_2d = None
    get_tensor_2d = None

    # OPTIONAL, default given
    def get_base(self) -> int:
        return self.base

    def free(self) -> None:
        """Give the memory back. Any later set/get/memset/copy/compute of a tensor in this
        buffer raises BufferFreedError; freeing twice is allowed."""
        self.freed = True

    def init_tensor(self, tensor: Tensor) -> Status:
        return Status.SUCCESS

    def cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        """Copy src into dst (dst lives in this buffer) without a host round trip; False if unable."""
        return False

    def reset(self) -> None:
        pass

    def set_usage(self, usage: BufferUsage) -> None:
        self.usage = BufferUsage(usage)

    def is_multi_buffer(self) -> bool:
        return False

    # OPTIONAL, default given: whether the bytes are ggml's tensor layout. False for buffers of
    # an ExtraBufferType (repacked weights): their tensors are never viewed or copied as ggml data.
    ggml_layout = True


class ExtraBufferType(BufferType):
    """An extra buffer type (ggml's ggml::cpu::extra_buffer_type, listed by the device's
    ggml_backend_dev_get_extra_bufts, e.g. the CPU's CPU_REPACK): memory that holds weights in
    a layout of its own, made for the device's products. A weight is written whole and
    converted as it is written; its buffers' bytes are not ggml's (`ggml_layout` False), so a
    tensor here is read only by the nodes `reads_as_weight` accepts, through the products it
    binds. A model loader offers each matrix weight to the device's extra buffer types in
    order and places it in the first whose `supports_weight` accepts it."""

    # REQUIRED
    @abstractmethod
    def supports_weight(self, qtype, ne) -> bool:
        """Whether a weight of this type and shape (ne, innermost first) can be stored here:
        what a loader asks before placing it."""

    @abstractmethod
    def supports_tensor(self, t: Tensor) -> bool:
        """Whether this tensor (type, shape, strides, not a view) is stored in the layout here."""

    @abstractmethod
    def reads_as_weight(self, node: Tensor, t: Tensor) -> bool:
        """Whether `node` may read t (stored here) as its weight (src0): ggml's
        extra_buffer_type::supports_op."""

    @abstractmethod
    def bind_product(self, t: Tensor, separate_rows: bool = False):
        """fn(rows [R, K] float, out [R, N] float32): out = rows @ t^T, for a 2-D weight t stored
        here (ggml's tensor_traits::compute_forward for MUL_MAT). separate_rows: the rows are
        separate sequences' tokens (ops.mul_mat_set_separate_rows): a layout may multiply each as
        it multiplies one row alone."""

    # OPTIONAL, None: bind_expert_product(t, separate_rows=False) -> fn(acts [R, K], pair_rows [P], pair_experts [P],
    # out [P, N]) for MUL_MAT_ID's experts (devices.kernels.matmul.bind_mul_mat_id);
    # without it, reads_as_weight must refuse MUL_MAT_ID
    bind_expert_product = None


# ---------------------------------------------------------------- backends

class Backend(ABC):
    """ggml_backend_i: a stream of work on one device."""

    def __init__(self, device, name: str | None = None):
        self.device = device
        self.name = name or device.name
        self.guid = uuid.uuid5(uuid.NAMESPACE_OID, f"torchggml.{type(self).__name__}").bytes

    def __repr__(self):
        return f"<ggml.Backend {self.name}>"

    # REQUIRED
    @abstractmethod
    def graph_compute(self, graph) -> Status:
        """Run the graph (asynchronously where the backend can); return a Status."""

    # OPTIONAL, None: set_tensor_async(tensor, data, offset, size) and
    # get_tensor_async(tensor, out, offset, size) queue a copy on the stream; without them
    # backend_tensor_set_async / _get_async copy synchronously
    set_tensor_async = None
    get_tensor_async = None

    # OPTIONAL, None: set_tensor_2d_async / get_tensor_2d_async, the 2-D copies (Buffer's
    # set_tensor_2d) queued on the stream; without them the _2d_async functions loop over
    # set/get_tensor_async
    set_tensor_2d_async = None
    get_tensor_2d_async = None

    # OPTIONAL, None: graph_optimize(graph, params) may reorder the nodes of a split's graph
    # (the scheduler calls it per split, before allocation, and keeps the new order) and call
    # params.add_alloc_dep(tensor, until) to keep a tensor allocated until node `until` ran
    graph_optimize = None

    # OPTIONAL, None: graph plans. graph_plan_create(graph) -> plan, graph_plan_update(plan,
    # graph), graph_plan_compute(plan) -> Status. Without them a plan is the graph itself,
    # computed by graph_compute
    graph_plan_create = None
    graph_plan_update = None
    graph_plan_compute = None

    # OPTIONAL, None: event_record(event) marks the work queued so far, event_wait(event)
    # makes later work wait for it; without them backend_event_record / _wait raise
    event_record = None
    event_wait = None

    # OPTIONAL, default given
    def get_name(self) -> str:
        return self.name

    def free(self) -> None:
        pass

    def cpy_tensor_async(self, backend_src: "Backend", src, dst) -> bool:
        """Copy src (on backend_src) into dst (on this backend) asynchronously; False if unable."""
        return False

    def synchronize(self) -> None:
        pass

    def graph_plan_free(self, plan) -> None:
        pass

    # not in ggml's table: delegation to the device, and the one ownership check
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

    def owns(self, t) -> bool:
        """Whether this backend's stream may read and write t's memory: a buffer of its own
        device (device or host memory) or of a buffer type its device supports. The one
        ownership check (async data movement asks it)."""
        buffer = memory_buffer(t)
        if buffer is None:
            return False
        owner = buffer.buft.get_device()
        return owner is None or owner is self.device or self.device.supports_buft(buffer.buft)


# ---------------------------------------------------------------- devices, regs, events

class Event:
    """ggml_backend_event: a marker recorded on a backend's stream (`handle`: the device's)."""

    def __init__(self, device, handle=None):
        self.device = device
        self.handle = handle


class Device(ABC):
    """ggml_backend_device_i."""

    def __init__(self, name: str, description: str, type: DeviceType, reg=None):
        self.name = name
        self.description = description
        self.type = DeviceType(type)
        self.reg = reg

    def __repr__(self):
        return f"<ggml.Device {self.name} ({self.type.name})>"

    # REQUIRED
    @abstractmethod
    def get_memory(self) -> tuple[int, int]:
        """(free, total) bytes."""

    @abstractmethod
    def init_backend(self, params: str | None = None):
        """A new backend (stream) on this device."""

    @abstractmethod
    def get_buffer_type(self):
        """The device's own memory."""

    @abstractmethod
    def supports_op(self, op) -> bool:
        """Whether a backend of this device can compute `op` (its types and shapes)."""

    # OPTIONAL, None: get_host_buffer_type() -> pinned host memory; buffer_from_host_ptr(data,
    # size, max_tensor_size) -> a buffer over host memory without copying. Without them the
    # mirrored functions return None
    get_host_buffer_type = None
    buffer_from_host_ptr = None

    # OPTIONAL, None: events. event_new() -> Event, event_synchronize(event). Without them
    # backend_event_new returns None and backend_event_synchronize raises
    event_new = None
    event_synchronize = None

    # OPTIONAL, default given
    def get_name(self) -> str:
        return self.name

    def get_description(self) -> str:
        return self.description

    def get_type(self) -> DeviceType:
        return self.type

    def get_device_id(self) -> str | None:
        return None

    def get_caps(self) -> DeviceCaps:
        return DeviceCaps()

    def get_props(self) -> DeviceProps:
        free, total = self.get_memory()
        return DeviceProps(self.name, self.description, free, total, self.type, self.get_device_id(), self.get_caps())

    def supports_buft(self, buft) -> bool:
        return buft.get_device() is self

    def offload_op(self, op) -> bool:
        return False

    def event_free(self, event) -> None:
        pass


class Reg(ABC):
    """ggml_backend_reg_i: a family of devices (CPU, CUDA, SIM, a plugin...). Its extension
    functions (proc addresses) are methods named `proc_<name>`."""

    api_version = 2

    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return f"<ggml.Reg {self.name}>"

    # REQUIRED
    @abstractmethod
    def get_devices(self) -> list[Device]:
        """The reg's devices."""

    # OPTIONAL, default given
    def get_name(self) -> str:
        return self.name

    def get_proc_address(self, name: str):
        """A named extension function, or None (ggml_backend_reg_get_proc_address)."""
        short = name.removeprefix("ggml_backend_")
        short = short.removeprefix("ggml_") if short == name else short  # ggml_threadpool_new -> threadpool_new
        return getattr(self, "proc_" + short, None)
