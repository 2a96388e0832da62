"""The CPU device: host storages and its CPU_REPACK extra buffer types (layouts/), synchronous
compute with the CPU kernel table (kernels.py), and the CPU functions of the C API
(backend_cpu_init...)."""
from __future__ import annotations

import functools
import os
import platform
import time

import torch

from ...backend.impl import Backend, Device, DeviceCaps, DeviceType, Reg
from ...enums import Status
from ...storage import TorchBufferType, buffer_from_torch
from ...profiler import profiling, run_calls_profiled
from ..kernels import TORCH_KERNELS, member_calls, run_calls
from ..plan import CompiledPlan, compile_graph
from .fast_ops import fast_ops_enabled
from .features import cpu_features, cpu_path, fastest_gemm_dtype, int8_gemm
from .fusion import fuse
from .jit.code_pages import release as release_code_pages
from .jit.loader import numba_available, set_numba_threads
from .kernels import CPU_KERNELS
from .native_plan import native_runs, native_runs_enabled
from .threads import ThreadTuner, adaptive as adaptive_threads
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




class Threadpool:
    """ggml_threadpool: torch computes on its one intra-op pool, so a threadpool is the thread
    count a CPU backend uses while it is set (ggml_backend_cpu_set_threadpool)."""

    def __init__(self, n_threads: int):
        if int(n_threads) < 1:
            raise ValueError(f"threadpool_new: n_threads must be at least 1, got {n_threads}")
        self.n_threads = int(n_threads)
        self.paused = False
        self.freed = False


def threadpool_new(params) -> Threadpool:
    """A threadpool of `params` threads (an int, or an object with n_threads)."""
    return Threadpool(getattr(params, "n_threads", params))


def threadpool_free(threadpool: Threadpool | None) -> None:
    if threadpool is not None:
        threadpool.freed = True


def threadpool_get_n_threads(threadpool: Threadpool) -> int:
    return threadpool.n_threads


def threadpool_pause(threadpool: Threadpool) -> None:
    threadpool.paused = True


def threadpool_resume(threadpool: Threadpool) -> None:
    threadpool.paused = False


class CPUBackend(Backend):
    def __init__(self, device: "CPUDevice"):
        super().__init__(device, "CPU")
        self.n_threads = self.active_threads = torch.get_num_threads()
        self.tuner = ThreadTuner(self.n_threads) if adaptive_threads() else None
        self.abort_callback = None
        self.use_ref = False       # ggml_backend_cpu_set_use_ref: the reference kernels only
        self.threadpool = None

    def set_use_ref(self, use_ref: bool) -> None:
        self.use_ref = bool(use_ref)

    def set_threadpool(self, threadpool: Threadpool | None) -> None:
        if threadpool is not None:
            if threadpool.freed:
                raise ValueError("backend_cpu_set_threadpool: the threadpool was freed")
            self.set_n_threads(threadpool.n_threads)
        self.threadpool = threadpool

    def set_n_threads(self, n_threads: int) -> None:
        self.n_threads = int(n_threads)
        self.tuner = ThreadTuner(self.n_threads) if adaptive_threads() else None
        self._use_threads(self.n_threads)

    def _use_threads(self, n: int) -> None:
        self.active_threads = n
        if numba_available():  # first: numba's OpenMP layer resets the shared OpenMP count
            set_numba_threads(n)
        torch.set_num_threads(n)

    def set_abort_callback(self, callback) -> None:
        self.abort_callback = callback

    def _compile(self, graph):
        check_repacked_reads(graph.nodes, self.name)  # no kernel may read repacked bytes as ggml blocks
        calls = compile_graph(graph, TORCH_KERNELS if self.use_ref else CPU_KERNELS, self)
        return calls if self.use_ref or not fast_ops_enabled() else fuse(calls, graph)

    def graph_plan_create(self, graph):
        return CompiledPlan(graph, self._plan_calls(graph))

    def _plan_calls(self, graph):
        """A plan's calls: compiled, with runs of bound numba kernels in one native call each
        (native_plan.py; worth it for a plan, computed many times, not for one compute)."""
        calls = self._compile(graph)
        return native_runs(calls) if not self.use_ref and fast_ops_enabled() and native_runs_enabled() else calls

    def graph_plan_update(self, plan, graph):
        plan.update(graph, self._plan_calls(graph))

    def graph_plan_compute(self, plan) -> Status:
        plan.check_alive(self.name)
        if plan.stale():
            self.graph_plan_update(plan, plan.graph)
        if self.tuner is None:
            return self._run(plan.calls)
        n = self.tuner.choose(id(plan))  # threads.py: the fastest count on this machine now
        if n != self.active_threads:
            self._use_threads(n)
        start = time.perf_counter()
        status = self._run(plan.calls)
        self.tuner.record(id(plan), n, time.perf_counter() - start)
        return status

    def graph_compute(self, graph) -> Status:
        return self._run(self._compile(graph))

    def event_wait(self, event) -> None:
        # the CPU computes on the calling thread: waiting for an event means the host waits
        event.device.event_synchronize(event)

    def _run(self, calls) -> Status:
        if self.abort_callback is None:
            (run_calls_profiled if profiling() else run_calls)(calls)
        else:
            for fn, node in member_calls(calls):  # a native run's calls one by one: abort between any two nodes
                if self.abort_callback():
                    return Status.ABORTED
                fn(node)
        release_code_pages()  # LLVM's, once the kernels it loaded run (jit/code_pages.py)
        return Status.SUCCESS


class CPUDevice(Device):
    torch_device = torch.device("cpu")

    def __init__(self, reg=None):
        super().__init__("CPU", _cpu_description(), DeviceType.CPU, reg)
        self.buffer_type = TorchBufferType("CPU", self, "cpu", host=True, huge_pages=True)
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
        return CPU_KERNELS.supports(op, "CPU") and reads_repacked_only_as_weight(op)

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

    def proc_cpu_set_use_ref(self, backend, use_ref):
        backend.set_use_ref(use_ref)

    def proc_cpu_numa_init(self, strategy=None):
        pass  # torch places threads itself

    def proc_cpu_is_numa(self):
        return False

    def proc_threadpool_new(self, params):
        return threadpool_new(params)

    def proc_threadpool_free(self, threadpool):
        threadpool_free(threadpool)

    def proc_cpu_set_threadpool(self, backend, threadpool):
        backend.set_threadpool(threadpool)

    def proc_get_features(self):
        return {**cpu_features(), "CPU_PATH": cpu_path(), "GEMM": str(fastest_gemm_dtype()).split(".")[-1],
                "INT8_GEMM": "1" if int8_gemm() else "0",
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


def backend_cpu_set_threadpool(backend, threadpool) -> None:
    backend.set_threadpool(threadpool)


def backend_cpu_set_use_ref(backend, use_ref: bool) -> None:
    """Compute with the reference (torch) kernels only, as upstream's reference CPU paths."""
    backend.set_use_ref(use_ref)
