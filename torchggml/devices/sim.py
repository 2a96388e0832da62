"""A simulated accelerator for machines without a GPU (`TORCHGGML_SIM_DEVICES=N`: SIM0..).

It behaves as a discrete GPU so that every multi-device path runs in CI:
- type GPU; its buffers are CPU storages that report is_host() False, so generic code treats
  them as device memory (the CPU backend refuses them, copies go through buffer calls);
- capacity-limited memory (`TORCHGGML_SIM_MEMORY` bytes per device, K/M/G suffixes allowed;
  default: the host's total memory), so running out of it is a MemoryError;
- each backend's stream is a worker thread: tensor_set/get/copy_async and graph_compute queue
  work and return at once; synchronize waits and re-raises the first failure with its op;
- events are real (worker-stream marks); the op table is the GPU one (Triton kernels where
  they run: under TRITON_INTERPRET=1).

Async contract (upstream's): data passed to tensor_set_async must not be modified until the
backend is synchronized (the backend keeps it alive); data read by tensor_get_async is valid
only after synchronize. Tensor addresses of a queued graph are read when the worker runs it:
do not move a queued graph's tensors to other addresses before synchronizing.
"""
from __future__ import annotations

import functools
import os
import threading
import weakref

import torch

from .. import config
from ..storage import TorchBuffer, TorchBufferType
from .cpu import host_memory
from .accelerator import AcceleratorDevice, AcceleratorReg
from .stream import ThreadEvent, WorkerStream

REG_ORDER = 90  # after real accelerators, before the CPU

SIM_DEVICES_ENV = "TORCHGGML_SIM_DEVICES"
SIM_MEMORY_ENV = "TORCHGGML_SIM_MEMORY"

_SUFFIXES = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def sim_device_count() -> int:
    """N from TORCHGGML_SIM_DEVICES (0 when unset or empty)."""
    value = config.text(SIM_DEVICES_ENV).strip()
    if not value:
        return 0
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"{SIM_DEVICES_ENV}={value!r}: expected a number of devices (0 or more)")
    return n


def sim_memory_capacity() -> int:
    """Bytes per SIM device from TORCHGGML_SIM_MEMORY (e.g. 1073741824, 512M, 2G)."""
    value = config.text(SIM_MEMORY_ENV).strip().upper().removesuffix("B")
    if not value:
        return host_memory()[1] or 2**34
    scale = _SUFFIXES.get(value[-1], 1)
    try:
        size = int(float(value[:-1] if scale > 1 else value) * scale)
    except ValueError:
        size = -1
    if size <= 0:
        raise ValueError(f"{SIM_MEMORY_ENV}={config.text(SIM_MEMORY_ENV)!r}: expected a positive size such as 512M or 2G")
    return size


class SimBuffer(TorchBuffer):
    def __init__(self, buft: "SimBufferType", storage, size: int):
        super().__init__(buft, storage, size)
        self._release = weakref.finalize(self, buft.release, size)

    def free(self) -> None:
        super().free()
        self._release()


class SimBufferType(TorchBufferType):
    """SIM device memory: non-host CPU storages within the device's capacity."""

    def __init__(self, device: "SimDevice", capacity: int):
        super().__init__(device.name, device, "cpu", host=False, alignment=128)
        self.capacity = capacity
        self.allocated = 0
        self._lock = threading.Lock()

    def get_max_size(self) -> int:
        return self.capacity

    buffer_class = SimBuffer

    def alloc_buffer(self, size: int) -> SimBuffer:
        """A buffer within the device's simulated capacity (the SimBuffer gives it back when freed)."""
        size = int(size)
        with self._lock:
            if self.allocated + max(size, 0) > self.capacity:
                raise MemoryError(f"{self.name}: out of device memory: {size} bytes requested, "
                                  f"{self.capacity - self.allocated} of {self.capacity} free")
            self.allocated += max(size, 0)
        try:
            return super().alloc_buffer(size)
        except (MemoryError, ValueError):
            self.release(max(size, 0))
            raise

    def release(self, size: int) -> None:
        with self._lock:
            self.allocated -= size


# Triton's interpreter is not thread-safe: SIM streams (one thread each) run graphs one at a time
_INTERPRETER_LOCK = threading.Lock()


class SimDevice(AcceleratorDevice):
    """A GPU whose memory is CPU storage and whose stream is a worker thread."""

    compute_lock = _INTERPRETER_LOCK

    def __init__(self, index: int, capacity: int, reg=None):
        self.torch_device = torch.device("cpu")  # where its (non-host) memory lives
        super().__init__(index, reg, f"SIM{index}", f"simulated GPU {index} (CPU memory, worker-thread stream)")
        self.buffer_type = SimBufferType(self, capacity)
        # host memory that CPU code can read, as a GPU's pinned host buffer type
        self.host_buffer_type = TorchBufferType(f"{self.name}_Host", self, "cpu", host=True)

    def new_stream(self, stream=None):
        if stream is None:
            return WorkerStream(self.name)
        if not isinstance(stream, WorkerStream):
            raise ValueError(f"{self.name}: the stream must be a WorkerStream (a SIM device's stream), got {stream!r}")
        return stream

    def new_event_handle(self):
        return ThreadEvent()

    def get_memory(self):
        # simulated figures: the capacity and what this device's buffers take of it
        buft = self.buffer_type
        return buft.capacity - buft.allocated, buft.capacity


class SimReg(AcceleratorReg):
    def __init__(self, n_devices: int, capacity: int):
        super().__init__("SIM")
        self.devices = [SimDevice(i, capacity, self) for i in range(n_devices)]

    def proc_get_features(self):
        return {"SIM_DEVICES": str(len(self.devices)),
                "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "0")}


@functools.lru_cache(maxsize=None)
def _sim_reg(n_devices: int, capacity: int) -> SimReg:
    return SimReg(n_devices, capacity)


def backend_reg() -> SimReg | None:
    """The SIM reg for the current environment (the same object while the settings stay the
    same), or None when TORCHGGML_SIM_DEVICES is unset or 0."""
    n = sim_device_count()
    return _sim_reg(n, sim_memory_capacity()) if n else None


def backend_sim_init(device: int = 0, stream=None):
    """A SIM backend (TORCHGGML_SIM_DEVICES) for device `device`; `stream`: a WorkerStream to
    share (another SIM backend's `.stream`), the SIM counterpart of a caller's CUDA stream."""
    reg = backend_reg()
    devices = reg.get_devices() if reg is not None else []
    if not 0 <= device < len(devices):
        raise ValueError(f"backend_sim_init: no SIM device {device} ({len(devices)} available; "
                         f"set TORCHGGML_SIM_DEVICES)")
    return devices[device].init_backend(stream=stream)
