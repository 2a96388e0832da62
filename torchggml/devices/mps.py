"""The MPS device (Apple GPU): type IGPU (an integrated GPU on unified host memory, as upstream
names Metal's device). torch exposes one MPS command queue: backends queue their work on it
through the generic TorchStream, and events are torch's MPS events."""
from __future__ import annotations

import torch

from ..backend.impl import DeviceType
from .cpu import host_memory
from .accelerator import AcceleratorDevice, AcceleratorReg

REG_ORDER = 20


class MPSDevice(AcceleratorDevice):
    torch_type = "mps"
    device_type = DeviceType.IGPU
    alignment = 32

    def __init__(self, index: int = 0, reg=None):
        super().__init__(index, reg, "MPS", "Apple GPU (Metal Performance Shaders)")

    def get_memory(self):
        total = torch.mps.recommended_max_memory() if hasattr(torch.mps, "recommended_max_memory") else host_memory()[1]
        used = torch.mps.driver_allocated_memory() if hasattr(torch.mps, "driver_allocated_memory") else 0
        return max(total - used, 0), total


_REG = []


def backend_reg() -> AcceleratorReg | None:
    """The MPS reg (the same object every call), or None without MPS."""
    if not _REG:
        _REG.append(AcceleratorReg.of_available("MPS", MPSDevice))
    return _REG[0]
