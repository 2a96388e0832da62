"""The backend system implemented on torch devices: one device file (or package) per device (cpu/,
cuda.py, mps.py, sim.py), found by the registry; the shared pieces beside them (buffer.py,
stream.py, device.py, plan.py, views.py, kernels/). See docs/architecture.md."""
from __future__ import annotations

import torch


def buffer_type_for_torch_device(device: torch.device):
    """The ggml buffer type whose memory is `device` (used to wrap foreign torch tensors)."""
    from ..backend.registry import backend_dev_for_torch_device
    return backend_dev_for_torch_device(device).get_buffer_type()
