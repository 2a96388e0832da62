"""Graph plans: a graph pre-compiled into bound kernel calls (every device), and on devices
with the graph-capture capability (CUDA) the same calls captured into a device graph and
replayed.

A compiled plan removes the per-op table lookup and checks from compute; a captured plan
also removes the per-op Python dispatch and kernel launches: one replay runs the whole graph.
"""
from __future__ import annotations

import warnings

import torch

from ..backend.impl import check_not_freed
from ..profiler import node_range_name, profiling
from ..tensor import memory_buffer
from .kernels import compiled_nodes, member_calls
from .kernels.registered import device_type_name, generation


def check_graph_buffers(calls, backend) -> None:
    """Every node and source of the compiled calls lives in memory `backend` can use: a clear
    ValueError (naming tensor, buffer and device) instead of computing on foreign memory."""
    device = backend.get_device()
    usable = set()
    for _, node in calls:
        for t in (node, *node.src):
            if t is None:
                continue
            buf = memory_buffer(t)
            if buf is None:
                raise ValueError(f"{backend.name}: {t.describe()} has no memory: allocate the graph first")
            check_not_freed(buf, f"{backend.name}: graph compute", t)
            buft = buf.buft
            if id(buft) in usable:
                continue
            if not device.supports_buft(buft):
                owner = buft.get_device()
                raise ValueError(f"{backend.name}: {t.describe()} lives in buffer {buf.name} of device "
                                 f"{owner.name if owner is not None else '?'}, which backend {backend.name} "
                                 f"cannot use (copy it first, or use the scheduler)")
            usable.add(id(buft))


def compile_graph(graph, kernels, backend) -> list:
    """The graph as bound kernel calls for `backend`: UnsupportedOpError for an op or types the
    table lacks, ValueError for a tensor in memory the backend cannot use."""
    calls = compiled_nodes(graph.nodes, kernels, backend.name, device_type_name(backend.get_device()))
    check_graph_buffers(calls, backend)
    return calls


def run_calls_named(calls, device_name: str, profiled: bool | None = None) -> None:
    """Run compiled calls; a failure names the device, the op and the node. `profiled`: record a
    profiler range per node (default: whether profiling is on in this thread; a worker stream
    passes what its submitting thread saw, as torch reports the profiler per thread)."""
    node = None
    try:
        if profiling() if profiled is None else profiled:  # a range per node, named like the profiler module's
            for fn, node in calls:
                with torch.profiler.record_function(node_range_name(node)):
                    fn(node)
        else:
            for fn, node in calls:
                fn(node)
    except Exception as e:
        where = f"op {node.op.name} on {node.describe()}" if node is not None else "graph"
        raise RuntimeError(f"{device_name}: {where} failed: {type(e).__name__}: {e}") from e


class CompiledPlan:
    """A graph as a list of (kernel, node) calls, looked up and checked once."""

    def __init__(self, graph, calls):
        self.graph = graph
        self.calls = calls
        self._buffers = (None, [])  # (the calls they were collected for, distinct buffers)
        self.generation = generation()  # of the registered kernels the calls were looked up with

    def stale(self) -> bool:
        """A kernel was registered or removed since the calls were looked up: the backend
        recompiles before computing (graph_plan_update), so a removed kernel never runs."""
        return self.generation != generation()

    def check_alive(self, backend_name: str) -> None:
        """BufferFreedError when a buffer the plan reads or writes was freed since it was made
        (kernels bound at plan time would otherwise run on memory their views keep alive)."""
        if self._buffers[0] is not self.calls:
            seen = {}
            for _, node in member_calls(self.calls):  # every node a native run stands for too
                for t in (node, *node.src):
                    buf = None if t is None else memory_buffer(t)
                    if buf is not None:
                        seen[id(buf)] = (buf, t)
            self._buffers = (self.calls, list(seen.values()))
        for buf, t in self._buffers[1]:
            check_not_freed(buf, f"{backend_name}: graph plan compute", t)

    def __repr__(self):
        return f"<{type(self).__name__} {len(self.calls)} calls>"

    def update(self, graph, calls) -> None:
        self.graph, self.calls, self.generation = graph, calls, generation()


class GraphCapture:
    """A device capability: record a stream's work once as a device graph and replay it
    (CUDA graphs; any torch device type whose module offers graph capture). `new_graph()`
    makes an empty graph, `capturing(graph, stream)` is the context that records into it."""

    def __init__(self, new_graph, capturing):
        self.new_graph = new_graph
        self.capturing = capturing


class CapturedPlan(CompiledPlan):
    """Compiled calls captured into a device graph (a device's GraphCapture capability).

    The first compute runs the calls eagerly: kernels initialise lazily (cuBLAS handles, Triton
    compilation and autotuning), which cannot happen inside a capture. The second compute
    captures the calls and replays them; later computes only replay. Buffers are static
    storages, so a replay reads and writes exactly the addresses the graph was planned for.
    A graph whose kernels cannot be captured (one syncs the host, e.g. with .item()) keeps
    running eagerly; `capture_error` says why.
    """

    WARMUP_RUNS = 1

    def __init__(self, graph, calls, stream, device_name: str, capture: GraphCapture):
        super().__init__(graph, calls)
        self.stream = stream            # a TorchStream
        self.device_name = device_name
        self.capture = capture
        self.device_graph = None
        self.capture_error: str | None = None
        self.runs = 0

    def update(self, graph, calls) -> None:
        super().update(graph, calls)
        self.device_graph, self.capture_error, self.runs = None, None, 0

    def compute(self) -> None:
        """Queue one execution of the graph on the plan's stream."""
        self.stream.submit(self._compute, "graph_plan_compute")
        self.runs += 1

    def _compute(self) -> None:
        if self.device_graph is None and (self.runs < self.WARMUP_RUNS or self.capture_error):
            run_calls_named(self.calls, self.device_name)
            return
        if self.device_graph is None:
            self._capture()
        if self.device_graph is not None:
            self.device_graph.replay()
        else:
            run_calls_named(self.calls, self.device_name)

    def _capture(self) -> None:
        graph = self.capture.new_graph()
        try:
            with self.capture.capturing(graph, self.stream.stream):
                run_calls_named(self.calls, self.device_name)
        except Exception as e:  # a kernel that cannot be captured: stay eager
            self.capture_error = f"{type(e).__name__}: {e}"
            warnings.warn(f"{self.device_name}: device graph capture failed, the plan runs eagerly: "
                          f"{self.capture_error}", RuntimeWarning, stacklevel=4)
            return
        self.device_graph = graph
