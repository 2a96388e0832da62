"""The CPU device: host storages and its CPU_REPACK extra buffer types (layouts/), synchronous
compute with the CPU kernel table (kernels.py), and the CPU functions of the C API
(backend_cpu_init...)."""
from __future__ import annotations

import functools
import os
import platform

import torch

from ...backend_impl import Backend, Device, DeviceCaps, DeviceType, Reg
from ...enums import Status
from ...memory import TorchBufferType, buffer_from_torch
from ...profiler import profiling, run_calls_profiled
from ..kernels import run_calls
from ..plan import CompiledPlan, compile_graph
from .features import cpu_features, cpu_path, fastest_gemm_dtype
from .jit.loader import numba_available, set_numba_threads
from .kernels import CPU_KERNELS
from .layouts.base import RepackBufferType, check_repacked_reads, reads_repacked_only_as_weight
from .layouts.fused import FusedBufferType
from .layouts.int4 import Int4BufferType

REG_ORDER = 100  # the CPU comes last, as upstream's registry and scheduler want it


def _cpu_description() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def host_memory() -> tuple[int, int]:
    """(free, total) bytes of host memory as the OS reports them."""
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page
    except (ValueError, OSError, AttributeError):
        return 0, 0




class CPUBackend(Backend):
    def __init__(self, device: "CPUDevice"):
        super().__init__(device, "CPU")
        self.n_threads = torch.get_num_threads()
        self.abort_callback = None

    def set_n_threads(self, n_threads: int) -> None:
        self.n_threads = int(n_threads)
        if numba_available():  # first: numba's OpenMP layer resets the shared OpenMP count
            set_numba_threads(self.n_threads)
        torch.set_num_threads(self.n_threads)

    def set_abort_callback(self, callback) -> None:
        self.abort_callback = callback

    def _compile(self, graph):
        check_repacked_reads(graph.nodes, self.name)  # no kernel may read repacked bytes as ggml blocks
        return compile_graph(graph, CPU_KERNELS, self)

    def graph_plan_create(self, graph):
        return CompiledPlan(graph, self._compile(graph))

    def graph_plan_update(self, plan, graph):
        plan.update(graph, self._compile(graph))

    def graph_plan_compute(self, plan) -> Status:
        plan.check_alive(self.name)
        return self._run(plan.calls)

    def graph_compute(self, graph) -> Status:
        return self._run(self._compile(graph))

    def event_wait(self, event) -> None:
        # the CPU computes on the calling thread: waiting for an event means the host waits
        event.device.event_synchronize(event)

    def _run(self, calls) -> Status:
        if self.abort_callback is None:
            (run_calls_profiled if profiling() else run_calls)(calls)
            return Status.SUCCESS
        for fn, node in calls:
            if self.abort_callback():
                return Status.ABORTED
            fn(node)
        return Status.SUCCESS


class CPUDevice(Device):
    torch_device = torch.device("cpu")

    def __init__(self, reg=None):
        super().__init__("CPU", _cpu_description(), DeviceType.CPU, reg)
        self.buffer_type = TorchBufferType("CPU", self, "cpu", host=True)
        # one repack layout per product path (features.py); "dequant" repacks nothing
        self.repack_buffer_types = {"int4": Int4BufferType(self), "fused": FusedBufferType(self)}

    def get_memory(self):
        return host_memory()

    def get_caps(self) -> DeviceCaps:
        return DeviceCaps(async_=False, host_buffer=False, buffer_from_host_ptr=True, events=False,
                          mmap_support=True)

    def init_backend(self, params=None) -> CPUBackend:
        return CPUBackend(self)

    def get_buffer_type(self):
        return self.buffer_type

    def buffer_from_host_ptr(self, data, size=None, max_tensor_size=None):
        return buffer_from_torch(self.buffer_type, data)

    def supports_op(self, op) -> bool:
        # a repacked weight (CPU_REPACK buffer) is readable only as a MUL_MAT's src0
        return CPU_KERNELS.supports(op) and reads_repacked_only_as_weight(op)

    def supports_buft(self, buft) -> bool:
        return buft.is_host() or isinstance(buft, RepackBufferType)


class CPUReg(Reg):
    def __init__(self):
        super().__init__("CPU")
        self.devices = [CPUDevice(self)]

    def get_devices(self):
        return self.devices

    # proc addresses (get_proc_address looks these up by name)
    def proc_set_n_threads(self, backend, n_threads):
        backend.set_n_threads(n_threads)

    def proc_set_abort_callback(self, backend, callback):
        backend.set_abort_callback(callback)

    def proc_dev_get_extra_bufts(self, device):
        buft = device.repack_buffer_types.get(cpu_path())  # none for "dequant"
        return [buft] if buft is not None else []

    def proc_get_features(self):
        return {**cpu_features(), "CPU_PATH": cpu_path(), "GEMM": str(fastest_gemm_dtype()).split(".")[-1],
                "TORCH": torch.__version__, "THREADS": str(torch.get_num_threads())}


@functools.lru_cache(maxsize=None)
def cpu_reg() -> CPUReg:
    return CPUReg()


backend_reg = cpu_reg


def cpu_device() -> CPUDevice:
    return cpu_reg().devices[0]


def cpu_buffer_type() -> TorchBufferType:
    return cpu_device().buffer_type


def repack_buffer_type(path: str | None = None):
    """The CPU's CPU_REPACK buffer type (upstream's ggml_backend_cpu_repack_buffer_type) for a
    product path (default: TORCHGGML_CPU_PATH or this CPU's default): (q, scale, bias) for
    `fused`, torch's int4 layout for `int4`, None for `dequant`."""
    return cpu_device().repack_buffer_types.get(path or cpu_path())


# ---------------------------------------------------------------- the C API's CPU functions

def backend_cpu_init() -> CPUBackend:
    """A new CPU backend."""
    return cpu_device().init_backend()


def backend_cpu_buffer_type() -> TorchBufferType:
    return cpu_buffer_type()


def backend_cpu_buffer_from_ptr(data, size: int | None = None):
    """A CPU buffer over existing host memory (numpy array, mmap, CPU tensor, bytes-like), no copy."""
    return cpu_device().buffer_from_host_ptr(data, size, size)


def backend_cpu_set_n_threads(backend, n_threads: int) -> None:
    backend.set_n_threads(n_threads)


def backend_is_cpu(backend) -> bool:
    return isinstance(backend, CPUBackend)
