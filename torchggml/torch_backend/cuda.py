"""CUDA devices: one per torch cuda device, its memory as torch storages, a torch.cuda.Stream
per backend, torch.cuda.Event events, CUDA-graph plans, a pinned host buffer type.

Imports without CUDA (the policy functions are tested on any machine); the reg has no devices
there.
"""
from __future__ import annotations

import functools

import torch

from ..backend.device import DeviceCaps, DeviceType, Reg
from ..enums import Status
from .buffer import TorchBuffer, TorchBufferType, buffer_from_torch
from .device import AcceleratorDevice
from .kernels.gpu import GPU_KERNELS
from .plan import CudaGraphPlan, compile_graph
from .stream import CudaStream, StreamBackend

class CudaBuffer(TorchBuffer):
    def free(self) -> None:
        # like cudaFree, wait for queued work: the caching allocator would otherwise hand this
        # memory to a new allocation while a backend stream still uses it
        if self.storage is not None:
            torch.cuda.synchronize(self.storage.device)
        super().free()


class CudaBufferType(TorchBufferType):
    def __init__(self, device: "CudaDevice"):
        super().__init__(device.name, device, f"cuda:{device.index}", host=False, alignment=128)

    def get_max_size(self) -> int:
        return torch.cuda.get_device_properties(self.torch_device).total_memory

    buffer_class = CudaBuffer


class CudaHostBufferType(TorchBufferType):
    """Pinned host memory: CPU code reads it, and copies to/from the GPU are truly asynchronous."""

    def __init__(self, device: "CudaDevice"):
        super().__init__("CUDA_Host", device, "cpu", host=True, pinned=True, alignment=32)


class CudaBackend(StreamBackend):
    """A backend on its own torch.cuda.Stream, or on a given one (e.g. the caller's current
    stream: then torch code and ggml graphs on it are ordered without any synchronization)."""

    def __init__(self, device: "CudaDevice", stream: torch.cuda.Stream | None = None):
        super().__init__(device, CudaStream(device.name, device.index, stream), GPU_KERNELS)

    def free(self) -> None:
        self.stream.synchronize()

    def graph_plan_create(self, graph) -> CudaGraphPlan:
        return CudaGraphPlan(graph, compile_graph(graph, self.kernels, self), self.stream.stream, self.name)

    def graph_plan_update(self, plan, graph):
        plan.reset(graph, compile_graph(graph, self.kernels, self))

    def graph_plan_compute(self, plan) -> Status:
        plan.check_alive(self.name)
        plan.compute()
        return Status.SUCCESS


def _pci_bus_id(props) -> str | None:
    bus = getattr(props, "pci_bus_id", None)
    if bus is None:
        return None
    return f"{getattr(props, 'pci_domain_id', 0):04x}:{bus:02x}:{getattr(props, 'pci_device_id', 0):02x}.0"


class CudaDevice(AcceleratorDevice):
    backend_class = CudaBackend

    def __init__(self, index: int, reg=None):
        super().__init__(f"CUDA{index}", torch.cuda.get_device_name(index), DeviceType.GPU, reg)
        self.index = index
        self.torch_device = torch.device("cuda", index)
        self.buffer_type = CudaBufferType(self)
        self.host_buffer_type = CudaHostBufferType(self)
        # host memory wrapped without copying (buffer_from_host_ptr): CPU code computes on it
        self.host_ptr_buffer_type = TorchBufferType(f"{self.name}_HostPtr", self, "cpu", host=True)

    def get_memory(self):
        return torch.cuda.mem_get_info(self.index)

    def get_device_id(self):
        return _pci_bus_id(torch.cuda.get_device_properties(self.index))

    def get_caps(self) -> DeviceCaps:
        return DeviceCaps(async_=True, host_buffer=True, buffer_from_host_ptr=True, events=True)

    def buffer_from_host_ptr(self, data, size=None, max_tensor_size=None):
        return buffer_from_torch(self.host_ptr_buffer_type, data)

    def new_event_handle(self):
        return torch.cuda.Event()


class CudaReg(Reg):
    def __init__(self):
        super().__init__("CUDA")
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        self.devices = [CudaDevice(i, self) for i in range(n)]

    def get_devices(self):
        return self.devices

    def proc_get_features(self):
        return {"TORCH": torch.__version__, "CUDA": str(torch.version.cuda), "DEVICES": str(len(self.devices))}

    def proc_dev_get_extra_bufts(self, device):
        return []


@functools.lru_cache(maxsize=None)
def cuda_reg() -> CudaReg:
    return CudaReg()
