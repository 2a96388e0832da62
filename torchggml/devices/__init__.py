"""The devices: one device file (or package) per torch device (cpu/, cuda.py, mps.py, sim.py), found
by the registry; the shared pieces beside them (SHARED: accelerator.py, stream.py, plan.py, the op
tables in kernels/, the Triton kernels in triton/); the remote and composite devices (rpc/, meta/),
which their own entry points add. See docs/architecture.md."""
from __future__ import annotations

import torch

# modules here that are not device files: the registry does not scan them
SHARED = ("accelerator", "kernels", "meta", "plan", "rpc", "stream", "triton")


def buffer_type_for_torch_device(device: torch.device):
    """The ggml buffer type whose memory is `device` (used to wrap foreign torch tensors)."""
    from ..backend.registry import backend_dev_for_torch_device
    return backend_dev_for_torch_device(device).get_buffer_type()
