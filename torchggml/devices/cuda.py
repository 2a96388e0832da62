"""CUDA devices: one per torch cuda device (NVIDIA, and AMD through ROCm's torch), with a
pinned host buffer type, host memory wrapped without copying, and CUDA-graph capture.

Imports without CUDA (the policy functions are tested on any machine); backend_reg() is None
there.
"""
from __future__ import annotations

import torch

from ..backend.impl import DeviceCaps
from ..storage import TorchBuffer, TorchBufferType, buffer_from_torch
from .accelerator import AcceleratorDevice, AcceleratorReg
from .plan import GraphCapture

REG_ORDER = 10  # the registry lists CUDA first


class CudaBuffer(TorchBuffer):
    def free(self) -> None:
        # like cudaFree, wait for queued work: the caching allocator would otherwise hand this
        # memory to a new allocation while a backend stream still uses it
        if self.storage is not None:
            torch.cuda.synchronize(self.storage.device)
        super().free()


class CudaBufferType(TorchBufferType):
    buffer_class = CudaBuffer

    def get_max_size(self) -> int:
        return torch.cuda.get_device_properties(self.torch_device).total_memory


def _pci_bus_id(props) -> str | None:
    bus = getattr(props, "pci_bus_id", None)
    if bus is None:
        return None
    return f"{getattr(props, 'pci_domain_id', 0):04x}:{bus:02x}:{getattr(props, 'pci_device_id', 0):02x}.0"


# CUDA graphs: graph plans capture their calls once and replay them
CUDA_GRAPHS = GraphCapture(new_graph=lambda: torch.cuda.CUDAGraph(),
                           capturing=lambda graph, stream: torch.cuda.graph(graph, stream=stream))


class CudaDevice(AcceleratorDevice):
    torch_type = "cuda"
    graph_capture = CUDA_GRAPHS

    def __init__(self, index: int, reg=None):
        super().__init__(index, reg, f"CUDA{index}", torch.cuda.get_device_name(index))
        self.buffer_type = CudaBufferType(self.name, self, self.torch_device, host=False, alignment=128)
        # pinned host memory: CPU code reads it, and copies to/from the GPU are truly asynchronous
        self.host_buffer_type = TorchBufferType("CUDA_Host", self, "cpu", host=True, pinned=True, alignment=32)
        # host memory wrapped without copying (buffer_from_host_ptr): CPU code computes on it
        self.host_ptr_buffer_type = TorchBufferType(f"{self.name}_HostPtr", self, "cpu", host=True)

    def get_device_id(self):
        return _pci_bus_id(torch.cuda.get_device_properties(self.index))

    def get_caps(self) -> DeviceCaps:
        return DeviceCaps(async_=True, host_buffer=True, buffer_from_host_ptr=True, events=True)

    def buffer_from_host_ptr(self, data, size=None, max_tensor_size=None):
        return buffer_from_torch(self.host_ptr_buffer_type, data)


class CudaReg(AcceleratorReg):
    def proc_get_features(self):
        return {"TORCH": torch.__version__, "CUDA": str(torch.version.cuda), "DEVICES": str(len(self.devices))}


_REG = []


def backend_reg() -> CudaReg | None:
    """The CUDA reg (the same object every call), or None without CUDA devices."""
    if not _REG:
        _REG.append(CudaReg.of_available("CUDA", CudaDevice))
    return _REG[0]


def backend_cuda_init(device: int = 0, stream=None):
    """A CUDA backend for device `device`; `stream` (e.g. torch.cuda.current_stream()) makes it
    run on that stream, so ggml graphs and torch code on it interleave without synchronizing."""
    reg = backend_reg()
    devices = reg.get_devices() if reg is not None else []
    if not 0 <= device < len(devices):
        raise ValueError(f"backend_cuda_init: no CUDA device {device} ({len(devices)} available)")
    return devices[device].init_backend(stream=stream)
