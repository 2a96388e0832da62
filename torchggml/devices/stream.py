"""Streams and events: the ordered work queues behind every asynchronous backend.

A `Stream` runs submitted work in submission order. Two kinds share one backend class:
- `WorkerStream`: a Python thread draining a queue of closures (the SIM device). Work really
  runs later, on another thread; errors are kept and raised at the next `synchronize`.
- `TorchStream`: a torch stream of any torch device type (CUDA, MPS, XPU...): the device
  module's Stream/Event (torch.cuda's, which are torch.Stream/torch.Event), or torch.Stream /
  torch.Event through torch.accelerator where the module has none (see stream_family). Submitting runs the closure now on the host with the stream current, so its
  kernels are queued on the device.

Events follow CUDA's rules: `record` marks the work submitted so far; a later `wait` (on any
stream) or `synchronize` waits for that mark; waiting on a never-recorded event does nothing.

`StreamBackend` implements ggml's asynchronous backend entries once for every stream kind:
tensor_set/get/copy_async, graph_compute (compiled calls submitted to the stream), plans and
events.
"""
from __future__ import annotations

import contextlib
import queue
import threading
import weakref
from abc import ABC, abstractmethod
from typing import Callable

import torch

from ..backend.impl import Backend, Event
from ..enums import Status
from ..storage import TorchBuffer, data_rows, strided_rows, tensor_bytes
from ..profiler import profiling
from .plan import CapturedPlan, CompiledPlan, compile_graph, run_calls_named


class StreamError(RuntimeError):
    """Work submitted to a stream failed; raised by the next synchronize."""


class Stream(ABC):
    """An ordered queue of work on one device."""

    name: str

    @abstractmethod
    def submit(self, fn: Callable[[], None], what: str) -> None:
        """Run `fn` after everything submitted before; `what` names it in error messages."""

    @abstractmethod
    def synchronize(self) -> None:
        """Block until all submitted work is done; raise StreamError if any of it failed."""

    @abstractmethod
    def record(self, handle) -> None:
        """Mark the work submitted so far on `handle`."""

    @abstractmethod
    def wait(self, handle) -> None:
        """Make work submitted after this call wait for `handle`'s latest record."""

    def close(self) -> None:
        pass


# ---------------------------------------------------------------- worker-thread streams

class ThreadEvent:
    """An event of worker streams. `flag` is the threading.Event of the latest record: a wait
    captures the flag current when it is issued, exactly as cudaStreamWaitEvent does."""

    __slots__ = ("flag",)

    def __init__(self):
        self.flag: threading.Event | None = None

    def synchronize(self) -> None:
        flag = self.flag
        if flag is not None:
            flag.wait()

    def query(self) -> bool:
        flag = self.flag
        return flag is None or flag.is_set()


_STOP = object()


class _WorkerState:
    __slots__ = ("error",)

    def __init__(self):
        self.error: tuple[str, BaseException] | None = None


def _drain(work: queue.SimpleQueue, state: _WorkerState) -> None:
    """The worker thread's loop. After a failure, ordinary work is skipped until synchronize
    reports it; event marks (`always`) still run so that other streams never deadlock."""
    while True:
        item = work.get()
        if item is _STOP:
            return
        fn, what, always = item
        if state.error is not None and not always:
            continue
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported at synchronize
            if state.error is None:
                state.error = (what, e)


class WorkerStream(Stream):
    """A stream whose work runs on its own Python thread, in submission order."""

    def __init__(self, name: str):
        self.name = name
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._state = _WorkerState()
        self._closed = False
        # the thread references only the queue and the state, so an unused stream is collected
        self._thread = threading.Thread(target=_drain, args=(self._work, self._state),
                                        name=f"torchggml-{name}", daemon=True)
        self._thread.start()
        self._finalizer = weakref.finalize(self, self._work.put, _STOP)

    def __repr__(self):
        return f"<WorkerStream {self.name}>"

    def submit(self, fn: Callable[[], None], what: str, always: bool = False) -> None:
        if self._closed:
            raise RuntimeError(f"{self.name}: the backend was freed; no more work can be submitted")
        self._work.put((fn, what, always))

    def synchronize(self) -> None:
        if threading.current_thread() is self._thread:
            raise RuntimeError(f"{self.name}: synchronize called from the stream's own worker thread")
        done = threading.Event()
        self.submit(done.set, "synchronize", always=True)
        done.wait()
        self._raise_pending()

    def _raise_pending(self) -> None:
        error, self._state.error = self._state.error, None
        if error is not None:
            what, exc = error
            raise StreamError(f"{self.name}: {what} failed: {type(exc).__name__}: {exc}") from exc

    def record(self, handle) -> None:
        if not isinstance(handle, ThreadEvent):
            raise TypeError(f"{self.name}: cannot record a {type(handle).__name__} on a worker stream")
        flag = threading.Event()
        handle.flag = flag
        self.submit(flag.set, "event record", always=True)

    def wait(self, handle) -> None:
        if isinstance(handle, ThreadEvent):
            flag = handle.flag
            if flag is not None and not flag.is_set():
                self.submit(flag.wait, "event wait", always=True)
        else:  # another stream kind's event: the worker blocks on it
            self.submit(handle.synchronize, "event wait", always=True)

    def close(self) -> None:
        """Finish the queued work, then stop the thread (pending errors are dropped)."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()
        if threading.current_thread() is not self._thread:
            self._thread.join()


# ---------------------------------------------------------------- torch streams

def device_module(device: torch.device):
    """torch.cuda, torch.mps, torch.xpu...: the module of a torch device type."""
    return torch.get_device_module(device.type)


def _uses_generic_api(device: torch.device) -> bool:
    """torch's generic torch.Stream / torch.Event serve `device`: the installed torch has
    torch.accelerator (2.6+) and the device is its accelerator."""
    try:
        current = torch.accelerator.current_accelerator()
    except AttributeError:
        return False
    return current is not None and current.type == device.type


def stream_family(device: torch.device) -> str:
    """Which classes a device's streams and events are, one family so that events record on
    and streams wait for each other: "module" (the device module's Stream and Event:
    torch.cuda's, torch.xpu's, torch.cpu's), "generic" (torch.Stream and torch.Event, for an
    accelerator whose module has no Stream class), or "queue" (no stream object: one implicit
    queue and the module's events, as MPS on older torch)."""
    mod = device_module(device)
    if hasattr(mod, "Stream") and hasattr(mod, "Event"):
        return "module"
    if _uses_generic_api(device):
        return "generic"
    return "queue"


def _new_torch_stream(device: torch.device):
    """A new stream on `device` of its family (None for "queue")."""
    family = stream_family(device)
    if family == "module":
        mod = device_module(device)
        try:
            return mod.Stream(device=device)
        except TypeError:  # torch.cpu.Stream takes no device
            return mod.Stream()
    if family == "generic":
        return torch.Stream(device=device)
    return None


def new_torch_event(device: torch.device):
    """An event handle for `device`, of its stream family: .record(), .wait(), .synchronize()."""
    family = stream_family(device)
    mod = device_module(device)
    if family == "module":
        return mod.Event()
    if family == "generic":
        return torch.Event(device=device)
    event_class = getattr(getattr(mod, "event", None), "Event", None) or getattr(mod, "Event", None)
    if event_class is None:
        raise RuntimeError(f"torch has no events for device type {device.type!r}")
    return event_class()


def _stream_device(stream) -> torch.device | None:
    device = getattr(stream, "device", None)
    if device is None:
        return None
    device = torch.device(device)
    return torch.device(device.type, device.index or 0)


class TorchStream(Stream):
    """A torch stream of one device (CUDA, MPS, XPU, ...), of the device's stream_family.
    Submitting runs the closure now on the host with the stream current, so its kernels queue
    on the device (errors surface immediately or at synchronize, as the device reports them).
    `stream` wraps an existing torch stream (e.g. the caller's) instead of creating one."""

    def __init__(self, name: str, device: torch.device, stream=None):
        self.name = name
        self.device = torch.device(device)
        if stream is not None and _stream_device(stream) not in (None, self.device):
            raise ValueError(f"{name}: the stream must be a torch stream of {self.device}, got {stream!r}")
        self.stream = stream if stream is not None else _new_torch_stream(self.device)

    def __repr__(self):
        return f"<TorchStream {self.name}>"

    def _current(self):
        """A context manager making this stream current (a null context without one)."""
        if self.stream is None:
            return contextlib.nullcontext()
        if hasattr(self.stream, "__enter__"):
            return self.stream
        return device_module(self.device).stream(self.stream)

    def submit(self, fn: Callable[[], None], what: str, always: bool = False) -> None:
        with self._current():
            fn()

    def synchronize(self) -> None:
        if self.stream is None:
            device_module(self.device).synchronize()
            return
        # an event marks the work queued so far: on a shared stream (the caller's), later work
        # queued by other code is not waited for, and nothing device-wide happens
        event = new_torch_event(self.device)
        self.record(event)
        event.synchronize()

    def record(self, handle) -> None:
        if self.stream is None:
            handle.record()
        else:
            handle.record(self.stream)

    def wait(self, handle) -> None:
        if isinstance(handle, ThreadEvent):  # another stream kind's event: the host waits
            handle.synchronize()
        elif self.stream is None:
            handle.wait()
        else:
            handle.wait(self.stream)

    def close(self) -> None:
        self.synchronize()


# ---------------------------------------------------------------- the backend

class StreamBackend(Backend):
    """A backend whose work is ordered on one Stream: every accelerator device's backend."""

    def __init__(self, device, stream: Stream, kernels, name: str | None = None, owns_stream: bool = True):
        super().__init__(device, name)
        self.stream = stream
        self.kernels = kernels
        self.owns_stream = owns_stream
        self._copy_event = None

    def free(self) -> None:
        if self.owns_stream:
            self.stream.close()
        else:  # a shared stream outlives this backend: only wait for what was queued
            self.stream.synchronize()

    # --- async data movement. Source and destination memory is resolved now (as the C API
    # takes pointers now); the copy runs when the stream gets to it.
    def set_tensor_async(self, tensor, data: torch.Tensor, offset: int, size: int):
        dst = tensor_bytes(tensor, offset, size)
        src = data[:size]  # kept alive by the closure until the copy has run
        self.stream.submit(lambda: dst.copy_(src, non_blocking=True),
                           f"tensor_set_async into {tensor.describe()}")
        return None

    def get_tensor_async(self, tensor, out: torch.Tensor, offset: int, size: int):
        src = tensor_bytes(tensor, offset, size)
        dst = out[:size]
        self.stream.submit(lambda: dst.copy_(src, non_blocking=True),
                           f"tensor_get_async from {tensor.describe()}")
        return None

    def set_tensor_2d_async(self, tensor, data: torch.Tensor, offset, size, n_copies, stride_tensor, stride_data):
        dst = strided_rows(tensor, offset, size, n_copies, stride_tensor)
        src = data_rows(data, size, n_copies, stride_data)
        self.stream.submit(lambda: dst.copy_(src, non_blocking=True),
                           f"tensor_set_2d_async into {tensor.describe()}")

    def get_tensor_2d_async(self, tensor, out: torch.Tensor, offset, size, n_copies, stride_tensor, stride_data):
        src = strided_rows(tensor, offset, size, n_copies, stride_tensor)
        dst = data_rows(out, size, n_copies, stride_data)
        self.stream.submit(lambda: dst.copy_(src, non_blocking=True),
                           f"tensor_get_2d_async from {tensor.describe()}")

    def cpy_tensor_async(self, backend_src: Backend, src, dst) -> bool:
        """Copy on backend_src's stream after its queued work; this stream waits for the copy
        (upstream CUDA's rule). False when the tensors are not both stream-device memory."""
        if not (isinstance(backend_src, StreamBackend) and type(backend_src.stream) is type(self.stream)
                and isinstance(src.buffer, TorchBuffer) and isinstance(dst.buffer, TorchBuffer)
                and backend_src.owns(src) and self.owns(dst)):
            return False
        s, d = tensor_bytes(src), tensor_bytes(dst)
        backend_src.stream.submit(lambda: d.copy_(s, non_blocking=True),
                                  f"tensor_copy_async {src.describe()} -> {dst.describe()}")
        if backend_src is not self:
            if backend_src._copy_event is None:
                backend_src._copy_event = backend_src.device.new_event_handle()
            backend_src.stream.record(backend_src._copy_event)
            self.stream.wait(backend_src._copy_event)
        return True

    def synchronize(self) -> None:
        self.stream.synchronize()

    # --- compute: the graph is compiled (and checked) on the caller's thread, then submitted
    def graph_compute(self, graph) -> Status:
        self._submit_calls(compile_graph(graph, self.kernels, self))
        return Status.SUCCESS

    def _submit_calls(self, calls) -> None:
        if not calls:
            return
        name, profiled = self.name, profiling()
        lock = getattr(self.device, "compute_lock", None)
        if lock is None:
            self.stream.submit(lambda: run_calls_named(calls, name, profiled), "graph_compute")
        else:
            def run():
                with lock:
                    run_calls_named(calls, name, profiled)
            self.stream.submit(run, "graph_compute")

    def graph_plan_create(self, graph):
        """Compiled calls; captured into a device graph where the device can capture."""
        calls = compile_graph(graph, self.kernels, self)
        capture = self.device.graph_capture
        if capture is None:
            return CompiledPlan(graph, calls)
        return CapturedPlan(graph, calls, self.stream, self.name, capture)

    def graph_plan_update(self, plan, graph):
        plan.update(graph, compile_graph(graph, self.kernels, self))

    def graph_plan_compute(self, plan) -> Status:
        plan.check_alive(self.name)
        if plan.stale():
            self.graph_plan_update(plan, plan.graph)
        if isinstance(plan, CapturedPlan):
            plan.compute()
        else:
            self._submit_calls(plan.calls)
        return Status.SUCCESS

    # --- events
    def event_record(self, event: Event):
        if event.device is not self.device:
            raise ValueError(f"event_record: the event belongs to device {event.device.name}, "
                             f"not to backend {self.name}'s device {self.device.name}")
        self.stream.record(event.handle)

    def event_wait(self, event: Event):
        self.stream.wait(event.handle)
