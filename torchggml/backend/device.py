"""Devices (ggml_backend_device_i), registries (ggml_backend_reg_i) and events."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import IntEnum


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


class Event:
    """ggml_backend_event: a marker recorded on a backend's stream."""

    def __init__(self, device, handle=None):
        self.device = device
        self.handle = handle


class Device(ABC):
    """ggml_backend_device. Subclasses implement the abstract methods; the rest default as in ggml."""

    def __init__(self, name: str, description: str, type: DeviceType, reg=None):
        self.name = name
        self.description = description
        self.type = DeviceType(type)
        self.reg = reg

    def __repr__(self):
        return f"<ggml.Device {self.name} ({self.type.name})>"

    def get_name(self) -> str:
        return self.name

    def get_description(self) -> str:
        return self.description

    def get_type(self) -> DeviceType:
        return self.type

    @abstractmethod
    def get_memory(self) -> tuple[int, int]:
        """(free, total) bytes."""

    def get_device_id(self) -> str | None:
        return None

    def get_caps(self) -> DeviceCaps:
        return DeviceCaps()

    def get_props(self) -> DeviceProps:
        free, total = self.get_memory()
        return DeviceProps(self.name, self.description, free, total, self.type, self.get_device_id(), self.get_caps())

    @abstractmethod
    def init_backend(self, params: str | None = None):
        """A new backend (stream) on this device."""

    @abstractmethod
    def get_buffer_type(self):
        ...

    def get_host_buffer_type(self):
        return None

    def buffer_from_host_ptr(self, data, size: int, max_tensor_size: int):
        return None

    @abstractmethod
    def supports_op(self, op) -> bool:
        ...

    def supports_buft(self, buft) -> bool:
        return buft.get_device() is self

    def offload_op(self, op) -> bool:
        return False

    def event_new(self):
        return None

    def event_free(self, event) -> None:
        pass

    def event_synchronize(self, event) -> None:
        raise NotImplementedError(f"device {self.name} has no events")


class Reg(ABC):
    """ggml_backend_reg: a family of devices (CPU, CUDA, SIM, a plugin...)."""

    api_version = 2

    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return f"<ggml.Reg {self.name}>"

    def get_name(self) -> str:
        return self.name

    @abstractmethod
    def get_devices(self) -> list[Device]:
        ...

    def get_proc_address(self, name: str):
        """A named extension function, or None (ggml_backend_reg_get_proc_address)."""
        fn = getattr(self, "proc_" + name.removeprefix("ggml_backend_"), None)
        return fn

    # collectives for the meta device's all-reduce; a reg with its own (NCCL, ...) overrides them
    def proc_comm_init(self, backends, group=None):
        from .comm import comm_init
        return comm_init(backends, group)

    def proc_comm_allreduce_tensor(self, comm, tensors) -> bool:
        from .comm import comm_allreduce_tensor
        return comm_allreduce_tensor(comm, tensors)

    def proc_comm_free(self, comm) -> None:
        from .comm import comm_free
        comm_free(comm)


# ---------------------------------------------------------------- mirrored functions (devices)

def backend_dev_name(device: Device) -> str:
    return device.get_name()


def backend_dev_description(device: Device) -> str:
    return device.get_description()


def backend_dev_memory(device: Device) -> tuple[int, int]:
    """(free, total) bytes."""
    return device.get_memory()


def backend_dev_type(device: Device) -> DeviceType:
    return device.get_type()


def backend_dev_get_props(device: Device) -> DeviceProps:
    return device.get_props()


def backend_dev_backend_reg(device: Device):
    return device.reg


def backend_dev_init(device: Device, params: str | None = None):
    """A new backend (stream) on the device."""
    return device.init_backend(params)


def backend_dev_buffer_type(device: Device):
    return device.get_buffer_type()


def backend_dev_host_buffer_type(device: Device):
    """The device's pinned host buffer type, or None where it has none."""
    return device.get_host_buffer_type()


def backend_dev_buffer_from_host_ptr(device: Device, data, size: int | None = None,
                                     max_tensor_size: int | None = None):
    """A buffer over existing host memory (numpy array, mmap, CPU tensor) without copying, or
    None where the device cannot (caps.buffer_from_host_ptr False). The buffer keeps `data` alive."""
    return device.buffer_from_host_ptr(data, size, max_tensor_size)


def backend_dev_supports_op(device: Device, op) -> bool:
    return device.supports_op(op)


def backend_dev_supports_buft(device: Device, buft) -> bool:
    return device.supports_buft(buft)


def backend_dev_offload_op(device: Device, op) -> bool:
    return device.offload_op(op)


# ---------------------------------------------------------------- mirrored functions (regs)

def backend_reg_name(reg: Reg) -> str:
    return reg.get_name()


def backend_reg_dev_count(reg: Reg) -> int:
    return len(reg.get_devices())


def backend_reg_dev_get(reg: Reg, index: int) -> Device:
    devices = reg.get_devices()
    if not 0 <= index < len(devices):
        raise IndexError(f"backend_reg_dev_get: reg {reg.get_name()} has {len(devices)} devices, no index {index}")
    return devices[index]


def backend_reg_get_proc_address(reg: Reg, name: str):
    """The reg's extension function `name` (with or without the ggml_backend_ prefix), or None."""
    return reg.get_proc_address(name)
