"""The backend system implemented on torch devices (CPU, CUDA, MPS, SIM)."""
from __future__ import annotations

import torch


def buffer_type_for_torch_device(device: torch.device):
    """The ggml buffer type whose memory is on `device` (used to wrap foreign torch tensors)."""
    device = torch.device(device)
    if device.type == "cpu":
        from .cpu import cpu_buffer_type
        return cpu_buffer_type()
    from ..backend.registry import backend_dev_for_torch_device
    return backend_dev_for_torch_device(device).get_buffer_type()
