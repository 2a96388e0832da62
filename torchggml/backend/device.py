"""Devices and regs: the mirrored functions (backend_dev_*, backend_reg_*) over the Device and
Reg interfaces of backend/impl.py."""
from __future__ import annotations

from .impl import Device, DeviceCaps, DeviceProps, DeviceType, Event, Reg

__all__ = ["Device", "DeviceCaps", "DeviceProps", "DeviceType", "Event", "Reg"]  # with the functions below

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
    get = device.get_host_buffer_type
    return get() if get is not None else None


def backend_dev_buffer_from_host_ptr(device: Device, data, size: int | None = None,
                                     max_tensor_size: int | None = None):
    """A buffer over existing host memory (numpy array, mmap, CPU tensor) without copying, or
    None where the device cannot (caps.buffer_from_host_ptr False). The buffer keeps `data` alive."""
    if device.buffer_from_host_ptr is None:
        return None
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


# the collectives every reg offers unless it has its own (NCCL...): the meta device all-reduces with them
DEFAULT_PROCS = ("comm_init", "comm_allreduce_tensor", "comm_free")


def backend_reg_get_proc_address(reg: Reg, name: str):
    """The reg's extension function `name` (with or without the ggml_backend_ prefix), or None;
    the collectives (DEFAULT_PROCS) default to backend/comm.py's."""
    fn = reg.get_proc_address(name)
    short = name.removeprefix("ggml_backend_")
    if fn is None and short in DEFAULT_PROCS:
        from . import comm
        fn = getattr(comm, short)
    return fn
