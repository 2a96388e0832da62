"""The MPS device (Apple GPU): type IGPU (an integrated GPU on unified host memory, as upstream
names Metal's device). torch exposes one MPS command stream, so a backend queues its work on
it, synchronize waits for the device, and events are torch.mps events."""
from __future__ import annotations

import functools

import torch

from ..backend.device import DeviceCaps, DeviceType, Reg
from .buffer import TorchBufferType
from .cpu import host_memory
from .device import AcceleratorDevice
from .kernels.gpu import GPU_KERNELS
from .stream import Stream, StreamBackend


def mps_available() -> bool:
    return bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()


class MPSStream(Stream):
    """torch's MPS command queue: work is encoded at once and runs in order on the GPU."""

    def __init__(self, name: str):
        self.name = name

    def submit(self, fn, what: str, always: bool = False) -> None:
        fn()

    def synchronize(self) -> None:
        torch.mps.synchronize()

    def new_event(self):
        return torch.mps.event.Event()

    def record(self, handle) -> None:
        handle.record()

    def wait(self, handle) -> None:
        if isinstance(handle, torch.mps.event.Event):
            handle.wait()
        else:
            handle.synchronize()


class MPSBackend(StreamBackend):
    def __init__(self, device: "MPSDevice"):
        super().__init__(device, MPSStream(device.name), GPU_KERNELS)


class MPSDevice(AcceleratorDevice):
    backend_class = MPSBackend

    def __init__(self, reg=None):
        super().__init__("MPS", "Apple GPU (Metal Performance Shaders)", DeviceType.IGPU, reg)
        self.buffer_type = TorchBufferType("MPS", self, "mps", host=False, alignment=32)

    def get_memory(self):
        total = torch.mps.recommended_max_memory() if hasattr(torch.mps, "recommended_max_memory") else host_memory()[1]
        used = torch.mps.driver_allocated_memory() if hasattr(torch.mps, "driver_allocated_memory") else 0
        return max(total - used, 0), total

    def get_caps(self) -> DeviceCaps:
        return DeviceCaps(async_=True, host_buffer=False, buffer_from_host_ptr=False, events=True)

    def new_event_handle(self):
        return torch.mps.event.Event()


class MPSReg(Reg):
    def __init__(self):
        super().__init__("MPS")
        self.devices = [MPSDevice(self)] if mps_available() else []

    def get_devices(self):
        return self.devices

    def proc_get_features(self):
        return {"TORCH": torch.__version__}


@functools.lru_cache(maxsize=None)
def mps_reg() -> MPSReg:
    return MPSReg()
