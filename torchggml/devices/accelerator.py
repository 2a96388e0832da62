"""What every accelerator device on torch shares (CUDA, MPS, SIM, any torch device type): the
GPU op table, one device buffer type, upstream CUDA's offload policy, a TorchStream per backend
and its events, and the graph-capture capability where the device has one.

A device file (cuda.py, mps.py, sim.py, or a new one) subclasses AcceleratorDevice, overrides
only what differs for its device type, and defines `backend_reg()`; the registry finds it.
For a torch device type that needs nothing special, the whole file is:

    from .accelerator import AcceleratorDevice, AcceleratorReg

    class XPUDevice(AcceleratorDevice):
        torch_type = "xpu"

    def backend_reg():
        return AcceleratorReg.of_available("XPU", XPUDevice)

See docs/architecture.md, "Adding a device".
"""
from __future__ import annotations


import torch

from .. import config
from ..backend.impl import Device, DeviceCaps, DeviceType, Event, Reg
from ..enums import Op
from ..storage import TorchBufferType
from ..tensor import nrows
from .kernels.gpu import GPU_KERNELS
from .kernels.registered import device_type_name
from .stream import StreamBackend, TorchStream, device_module, new_torch_event

# upstream CUDA: ops with a batch of at least this many rows are worth moving weights for;
# GGML_OP_OFFLOAD_MIN_BATCH's counterpart is TORCHGGML_OP_OFFLOAD_MIN_BATCH
OFFLOAD_MIN_BATCH = config.value("TORCHGGML_OP_OFFLOAD_MIN_BATCH")


def op_batch_size(op) -> int:
    """The batch an op processes, as upstream CUDA measures it for offloading."""
    if op.op == Op.GET_ROWS:
        return 0  # gathering rows of host weights is never worth a weight upload
    if op.op == Op.MUL_MAT:
        return op.ne[1]
    if op.op in (Op.MUL_MAT_ID, Op.ROPE, Op.ROPE_BACK):
        return op.ne[2]
    return nrows(op)


def gpu_offload_op(op, min_batch: int | None = None) -> bool:
    """Upstream CUDA's offload_op: run an op whose weights sit in host memory on the GPU when
    its batch is large enough to amortise copying the weights over."""
    return op_batch_size(op) >= (OFFLOAD_MIN_BATCH if min_batch is None else min_batch)


class AcceleratorDevice(Device):
    """A ggml device on one torch device (`torch_type`, index `index`).

    Class attributes a device file may override, with their defaults:
    - `torch_type`: the torch device type (required unless the device sets `torch_device`);
    - `device_type`: DeviceType.GPU;
    - `kernels`: the op table, GPU_KERNELS (Triton where it runs, the torch reference else);
    - `alignment`: 128, the device buffer type's alignment;
    - `graph_capture`: None, or a plan.GraphCapture: graph plans then capture and replay;
    - `compute_lock`: None, or a lock every graph of the device's backends runs under.
    Methods with defaults: `new_stream()` (a TorchStream), `new_event_handle()` (a torch event
    of the device), `get_memory()` (the device module's mem_get_info), `get_caps()`.
    """

    torch_type: str | None = None
    device_type = DeviceType.GPU
    kernels = GPU_KERNELS
    alignment = 128
    graph_capture = None
    compute_lock = None
    backend_class = StreamBackend

    def __init__(self, index: int = 0, reg=None, name: str | None = None, description: str | None = None):
        self.index = index
        if self.torch_type is not None:
            self.torch_device = torch.device(self.torch_type, index)
        name = name or f"{reg.get_name() if reg is not None else self.torch_type.upper()}{index}"
        super().__init__(name, description or f"{name} ({self.torch_device})", self.device_type, reg)
        self.buffer_type = TorchBufferType(self.name, self, self.torch_device, host=False,
                                           alignment=self.alignment)
        self.host_buffer_type = None

    # --- streams and events: one implementation for every torch device type
    def new_stream(self, stream=None):
        """The ordered queue a new backend runs on (`stream`: an existing torch stream to use)."""
        return TorchStream(self.name, self.torch_device, stream)

    def new_event_handle(self):
        return new_torch_event(self.torch_device)

    def init_backend(self, params=None, stream=None):
        """A new backend on its own stream, or on `stream` (the device's kind: a torch stream of
        the device, e.g. the caller's current one; a SIM backend's WorkerStream), which it then
        shares: torch work and ggml graphs on it are ordered without synchronizing."""
        return self.backend_class(self, self.new_stream(stream), self.kernels, owns_stream=stream is None)

    def event_new(self) -> Event:
        return Event(self, self.new_event_handle())

    def event_synchronize(self, event) -> None:
        event.handle.synchronize()

    # --- memory and capabilities
    def get_memory(self):
        try:
            return device_module(self.torch_device).mem_get_info(self.index)
        except (AttributeError, RuntimeError):
            return 0, 0

    def get_caps(self) -> DeviceCaps:
        return DeviceCaps(async_=True, host_buffer=self.host_buffer_type is not None,
                          buffer_from_host_ptr=False, events=True)

    def get_buffer_type(self):
        return self.buffer_type

    def get_host_buffer_type(self):
        return self.host_buffer_type

    def supports_op(self, op) -> bool:
        return self.kernels.supports(op, device_type_name(self))

    def supports_buft(self, buft) -> bool:
        return buft is self.buffer_type

    def offload_op(self, op) -> bool:
        return gpu_offload_op(op)


def torch_device_count(torch_type: str) -> int:
    """How many devices of a torch device type this process has (0 where torch has none)."""
    try:
        module = torch.get_device_module(torch_type)
    except (AttributeError, RuntimeError, ValueError):
        return 0
    # torch.mps before 2.5 has no is_available/device_count: torch.backends.mps says
    is_available = getattr(module, "is_available", None) or \
        getattr(getattr(torch.backends, torch_type, None), "is_available", None)
    try:
        if is_available is None or not is_available():
            return 0
        count = getattr(module, "device_count", None)
        return int(count()) if count is not None else 1
    except RuntimeError:
        return 0


class AcceleratorReg(Reg):
    """A reg of accelerator devices; `proc_*` methods are its proc addresses."""

    def __init__(self, name: str, devices=()):
        super().__init__(name)
        self.devices = list(devices)

    @classmethod
    def of_available(cls, name: str, device_class) -> "AcceleratorReg | None":
        """A reg with one device per torch device of `device_class.torch_type`, or None when
        torch has none (the device type is not built in or not present)."""
        count = torch_device_count(device_class.torch_type)
        if not count:
            return None
        reg = cls(name)
        reg.devices = [device_class(i, reg) for i in range(count)]
        return reg

    def get_devices(self):
        return self.devices

    def proc_get_features(self):
        return {"TORCH": torch.__version__, "DEVICES": str(len(self.devices))}

    def proc_dev_get_extra_bufts(self, device):
        return []

    def proc_split_buffer_type(self, main_device: int, tensor_split=None):
        """ggml_backend_split_buffer_type (CUDA's proc address): weight matrices split by rows
        (ne[1]) over the reg's devices in proportion to tensor_split (default: evenly), the
        other tensors whole on each; here the buffer type of a meta device over the devices."""
        from .meta.meta import backend_meta_device
        from .meta.split import MetaSplitState, SplitAxis
        if not 0 <= int(main_device) < len(self.devices):
            raise ValueError(f"split_buffer_type: main_device {main_device} out of range ({len(self.devices)} devices)")
        shares = list(tensor_split or [])[:len(self.devices)]
        shares = shares + [0.0] * (len(self.devices) - len(shares)) if any(shares) else [1.0] * len(self.devices)
        devices = [d for d, w in zip(self.devices, shares) if w > 0]

        def rows(t):
            if t.ne[2] * t.ne[3] != 1 or t.ne[1] < len(devices):
                return None  # not a matrix to split: whole on each device
            total, weights = t.ne[1], [w for w in shares if w > 0]
            cut = [round(total * sum(weights[:i]) / sum(weights)) for i in range(len(weights) + 1)]
            return MetaSplitState(SplitAxis.AXIS_1, tuple(b - a for a, b in zip(cut, cut[1:])))

        return backend_meta_device(devices, rows).get_buffer_type()
