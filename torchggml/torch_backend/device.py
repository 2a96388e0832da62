"""What every accelerator device on torch shares (CUDA, MPS, SIM): the GPU op table, one device
buffer type, upstream CUDA's offload policy, and events whose handle can synchronize. A device
file (cuda.py, mps.py, sim.py) sets its buffer types, its backend class and its event handle."""
from __future__ import annotations

import os

from ..backend.device import Device, Event
from ..enums import Op
from ..tensor import nrows
from .kernels.gpu import GPU_KERNELS

# upstream CUDA: ops with a batch of at least this many rows are worth moving weights for;
# GGML_OP_OFFLOAD_MIN_BATCH's counterpart is TORCHGGML_OP_OFFLOAD_MIN_BATCH
OFFLOAD_MIN_BATCH = int(os.environ.get("TORCHGGML_OP_OFFLOAD_MIN_BATCH", "32"))


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
    """Subclasses set `buffer_type` (and `host_buffer_type` where they have pinned host memory),
    `backend_class`, and implement `new_event_handle()` and `get_memory()`."""

    backend_class = None
    buffer_type = None
    host_buffer_type = None

    def new_event_handle(self):
        raise NotImplementedError

    def init_backend(self, params=None, stream=None):
        """A new backend; `stream`: run it on that stream (the device's stream kind) instead of a new one."""
        return self.backend_class(self) if stream is None else self.backend_class(self, stream)

    def get_buffer_type(self):
        return self.buffer_type

    def get_host_buffer_type(self):
        return self.host_buffer_type

    def supports_op(self, op) -> bool:
        return GPU_KERNELS.supports(op)

    def supports_buft(self, buft) -> bool:
        return buft is self.buffer_type

    def offload_op(self, op) -> bool:
        return gpu_offload_op(op)

    def event_new(self) -> Event:
        return Event(self, self.new_event_handle())

    def event_synchronize(self, event) -> None:
        event.handle.synchronize()
