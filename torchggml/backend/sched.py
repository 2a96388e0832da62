"""The scheduler (ggml_backend_sched): assigns graph nodes to backends, cuts the graph into
splits, copies split inputs between backends, and runs the splits on the backends' streams,
ordered by events. Pass by pass as upstream ggml-backend.cpp does it (see docs/architecture.md).

Unlike upstream, the caller's graph is only borrowed: a node whose source is copied to another
backend reads the copy only while the scheduler plans or runs the graph (the rewritten sources
are recorded and put back when it is done: after alloc/reserve, and after compute once the
backends are synchronized), and tensors an earlier plan placed in the scheduler's own buffers
are planned afresh. So the same graph can be reserved, allocated, reset and allocated again,
or split by another scheduler, and still computes correctly."""
from __future__ import annotations

import contextlib
import logging

from .. import config
from ..context import Context, new_tensor_impl, view_tensor
from ..enums import Op, Status, TensorFlag, VIEW_OPS
from ..graph import CGraph, graph_view, DEFAULT_GRAPH_SIZE
from ..profiler import split_range
from ..tensor import Tensor, MAX_SRC, format_name, memory_buffer, set_input, set_output, nbytes
from .backend import backend_graph_plan_create, backend_graph_plan_compute, backend_graph_plan_free
from .buffer import BufferUsage
from .event import backend_event_record, backend_event_synchronize, backend_event_wait
from .device import DeviceType

log = logging.getLogger("torchggml.sched")

MAX_BACKENDS = 16
MAX_SPLIT_INPUTS = 30
MAX_COPIES = 4


class Split:
    """A run of consecutive graph nodes on one backend, with the inputs copied to it."""

    __slots__ = ("backend_id", "i_start", "i_end", "inputs", "graph", "inputs_capacity", "plan")

    def __init__(self, backend_id: int, i_start: int):
        self.backend_id = backend_id
        self.i_start = i_start
        self.i_end = i_start
        self.inputs: list[Tensor] = []
        self.inputs_capacity = MAX_SPLIT_INPUTS
        self.graph: CGraph | None = None
        self.plan = None  # the backend's graph plan, made on the first compute of this split

    def add_input(self, t: Tensor) -> None:
        if len(self.inputs) >= self.inputs_capacity:
            log.warning("increasing split inputs capacity from %d to %d", self.inputs_capacity, 2 * self.inputs_capacity)
            self.inputs_capacity *= 2
        self.inputs.append(t)


class GraphOptimizeParams:
    """ggml_backend_graph_optimize_params: what graph_optimize may ask of the scheduler."""

    def __init__(self, keep: dict):
        self._keep = keep

    def add_alloc_dep(self, tensor: Tensor, until: Tensor) -> None:
        """Keep `tensor` allocated at least until node `until` (of the same graph) is computed;
        asking again for the same tensor keeps the longest lifetime."""
        kept = self._keep.setdefault(id(until), [])
        if all(t is not tensor for t in kept):
            kept.append(tensor)


class Sched:
    """ggml_backend_sched. Backends are in priority order; the last one must be the CPU."""

    def __init__(self, backends, bufts=None, graph_size: int = DEFAULT_GRAPH_SIZE, parallel: bool = False,
                 op_offload: bool = True):
        from ..alloc import gallocr_new_n
        from .event import backend_event_new
        backends = list(backends)
        if not 0 < len(backends) <= MAX_BACKENDS:
            raise ValueError(f"backend_sched_new: need 1 to {MAX_BACKENDS} backends, got {len(backends)}")
        if backends[-1].get_device().get_type() != DeviceType.CPU:
            raise ValueError(f"backend_sched_new: the last backend must be the CPU, got {backends[-1].name}")
        self.backends = backends
        self.bufts = list(bufts) if bufts is not None else [b.get_default_buffer_type() for b in backends]
        for b, buft in zip(self.backends, self.bufts):
            if not b.supports_buft(buft):
                raise ValueError(f"backend_sched_new: backend {b.name} does not support buffer type {buft.name}")
        self.graph_size = graph_size
        self.n_copies = MAX_COPIES if parallel else 1
        self.cur_copy = 0
        self.next_copy = 0
        self.op_offload = op_offload
        self.events = [[backend_event_new(b.get_device()) if self.n_copies > 1 else None
                        for _ in range(self.n_copies)] for b in backends]
        self.galloc = gallocr_new_n(self.bufts)
        self.callback_eval = None
        self.debug = config.value("TORCHGGML_SCHED_DEBUG")
        self.splits: list[Split] = []
        self.graph_inputs: list[Tensor] = []
        self.graph = CGraph(0)
        self.node_backend_ids: list[int] = []
        self.leaf_backend_ids: list[int] = []
        self.prev_node_backend_ids: list[int] = []
        self.prev_leaf_backend_ids: list[int] = []
        self.ctx = Context(no_alloc=True)
        self.is_reset = False
        self.is_alloc = False
        self.backend_ids: dict[Tensor, int] = {}
        self.copies: dict[Tensor, list[list[Tensor | None]]] = {}
        self.causes: dict[Tensor, str] = {}
        # (node, src index, the caller's source, the copy the split reads): see the module doc
        self.rewrites: list[tuple[Tensor, int, Tensor, Tensor]] = []
        # queued work may still read the copies: restored at the next synchronize
        self.in_flight = False
        self.pending_restores: list[tuple[Tensor, int, Tensor, Tensor]] = []
        self.reset()

    # ------------------------------------------------------------ small helpers

    def backend_index(self, backend) -> int:
        for i, b in enumerate(self.backends):
            if b is backend:
                return i
        return -1

    def _id(self, t: Tensor | None) -> int:
        return -1 if t is None else self.backend_ids.get(t, -1)

    def _copy(self, t: Tensor, backend_id: int, c: int) -> Tensor | None:
        slots = self.copies.get(t)
        return None if slots is None else slots[backend_id][c]

    def _set_copy(self, t: Tensor, backend_id: int, c: int, cpy: Tensor) -> None:
        slots = self.copies.get(t)
        if slots is None:
            slots = self.copies[t] = [[None] * self.n_copies for _ in self.backends]
        slots[backend_id][c] = cpy

    def _backend_from_buffer(self, t: Tensor, op: Tensor) -> int:
        """Highest-priority backend that supports the tensor's buffer type and the op."""
        buffer = memory_buffer(t)
        if buffer is None:
            return -1
        for i, b in enumerate(self.backends):
            if b.supports_buft(buffer.buft) and b.supports_op(op):
                return i
        return -1

    def _buffer_supported(self, t: Tensor, backend_id: int) -> bool:
        buffer = memory_buffer(t)
        if buffer is not None:
            buft = buffer.buft
        else:
            b = self._id(t)
            if b == -1 and t.view_src is not None:
                b = self._id(t.view_src)
            if b == -1:
                return False
            buft = self.bufts[b]
        return self.backends[backend_id].supports_buft(buft)

    def _backend_id_from_cur(self, t: Tensor) -> int:
        """Pass 1: the backend a tensor must or should run on from where its data already is."""
        b = self._backend_from_buffer(t, t)
        if b != -1:
            self.causes[t] = "1.dst"
            return b
        if t.view_src is not None:
            b = self._backend_from_buffer(t.view_src, t)
            if b != -1:
                self.causes[t] = "1.vsrc"
                return b
        buffer = memory_buffer(t)
        if buffer is not None:
            raise RuntimeError(f"scheduler: pre-allocated {t.describe()} is in buffer {buffer.name}, "
                               f"and no backend that can use that buffer supports op {t.op.name}")
        if t.flags & TensorFlag.INPUT:
            self.causes[t] = "1.inp"
            return len(self.backends) - 1
        # ops with weights run where the weights are (not ROPE / FLASH_ATTN_EXT: their small
        # freq-factor / sinks tensors should not decide)
        if t.op in (Op.ROPE, Op.FLASH_ATTN_EXT):
            return -1
        for i, src in enumerate(t.src):
            if src is None or src.buffer is None or src.buffer.usage != BufferUsage.WEIGHTS:
                continue
            b = self._backend_from_buffer(src, t)
            if self.op_offload and b == len(self.backends) - 1 and src.buffer.buft.is_host():
                for hb in range(b):
                    if self.backends[hb].supports_op(t) and self.backends[hb].offload_op(t):
                        self.causes[t] = "1.off"
                        return hb
            self.causes[t] = f"1.wgt{i}"
            return b
        return -1

    def _set_if_supported(self, node: Tensor, backend_id: int) -> None:
        if self.backends[backend_id].supports_op(node):
            self.backend_ids[node] = backend_id
            self.causes[node] = "2.sup"

    # ------------------------------------------------------------ the split algorithm

    def _free_plans(self) -> None:
        for split in self.splits:
            if split.plan is not None:
                backend_graph_plan_free(self.backends[split.backend_id], split.plan)
                split.plan = None

    def split_graph(self, graph: CGraph) -> None:
        """Assign backends and cut `graph` into splits (the graph is left as the caller built it)."""
        self._split(graph)
        self._restore_sources()

    def _apply_copies(self) -> None:
        """Point the recorded nodes at their split-input copies (while planning or running)."""
        for node, j, _, cpy in self.rewrites:
            node.src[j] = cpy

    def _restore_sources(self) -> None:
        """Give the caller's graph its own sources back."""
        for node, j, src, _ in self.rewrites:
            node.src[j] = src

    def _retire_rewrites(self) -> None:
        """Forget the current graph's copies; while queued work may still read them, its
        sources are put back at the next synchronize instead of now."""
        if self.in_flight:
            self.pending_restores += self.rewrites
        else:
            self._restore_sources()
        self.rewrites = []

    @contextlib.contextmanager
    def copies_applied(self):
        """The graph as the splits run it (sources replaced by their copies), e.g. to draw it."""
        self._apply_copies()
        try:
            yield
        finally:
            if not self.in_flight:
                self._restore_sources()

    def _planned_tensors(self, graph: CGraph) -> list[Tensor]:
        """Tensors of `graph` that an earlier plan placed in this scheduler's compute buffers
        (or in buffers since freed). They are planned again: the allocator takes any tensor
        that has memory for pre-allocated, and would plan other tensors over their old places."""
        own = {id(b) for vb in self.galloc.buffers if vb is not None for b in vb.chunks}
        return [t for t in (*graph.nodes, *graph.leafs)
                if t.buffer is not None and (id(t.buffer) in own or t.buffer.freed)]

    def _split(self, graph: CGraph) -> None:
        """split_graph, leaving the copies applied (the allocator plans with them)."""
        self._free_plans()
        self._retire_rewrites()
        planned = self._planned_tensors(graph)
        if self.in_flight and (planned or not {id(n) for n, *_ in self.pending_restores}.isdisjoint(
                map(id, graph.nodes))):
            self.synchronize()  # this graph may still be running: wait (restoring its sources)
        for t in planned:  # plan them afresh, see _planned_tensors
            t.data = t.buffer = None
        self.splits = []
        self.graph_inputs = []
        self.is_reset = False
        self.ctx = Context(no_alloc=True)
        nodes = graph.nodes
        n_back = len(self.backends)
        cpu_id = n_back - 1
        ids = self.backend_ids

        # pass 1: pre-allocated tensors, inputs, weights (user assignments kept)
        for leaf in graph.leafs:
            if ids.get(leaf, -1) == -1:
                ids[leaf] = self._backend_id_from_cur(leaf)
        for node in nodes:
            if ids.get(node, -1) == -1:
                ids[node] = self._backend_id_from_cur(node)

        # pass 2: expand assignments to neighbours; GPU sweeps first and never spread the CPU
        compute = [n for n in nodes if n.op not in VIEW_OPS]
        for order, skip_cpu in ((compute, True), (compute[::-1], True), (compute, False), (compute[::-1], False)):
            cur = -1
            for node in order:
                b = ids.get(node, -1)
                if b != -1:
                    cur = -1 if skip_cpu and b == cpu_id else b
                elif cur != -1:
                    self._set_if_supported(node, cur)

        # pass 3: unassigned nodes go where most sources already are; assigned nodes move up to a
        # higher-priority backend with the same buffer type when all sources allow it
        for node in compute:
            b = ids.get(node, -1)
            if b == -1:
                best = -1
                for cand in range(n_back):
                    if not self.backends[cand].supports_op(node):
                        continue
                    n_ok = sum(1 for s in node.src if s is not None
                               and (self._id(s) != -1 or self._id(s.view_src) != -1)
                               and self._buffer_supported(s, cand))
                    if n_ok > best:
                        best = n_ok
                        ids[node] = cand
                        self.causes[node] = "3.best"
            else:
                for cand in range(b):
                    if (self.bufts[cand] is self.bufts[b] and self.backends[cand].supports_op(node)
                            and all(self._buffer_supported(s, cand) for s in node.src if s is not None)):
                        ids[node] = cand
                        self.causes[node] = "3.upg"
                        break

        # pass 4: views and sources take their view_src's or consumer's backend
        for node in nodes:
            if node.view_src is not None and ids.get(node, -1) == -1:
                ids[node] = self._id(node.view_src)
                self.causes[node] = "4.vsrc"
            cur = ids.get(node, -1)
            for src in node.src:
                if src is None or ids.get(src, -1) != -1:
                    continue
                if src.view_src is not None:
                    ids[src] = self._id(src.view_src)
                    self.causes[src] = "4.vsrc"
                else:
                    ids[src] = cur
                    self.causes[src] = "4.cur"
            for cand in range(n_back):
                if ids.get(node, -1) != -1:
                    break
                self._set_if_supported(node, cand)
            if ids.get(node, -1) == -1:
                raise RuntimeError(f"scheduler: no backend supports op {node.op.name} of {node.describe()}")

        # pass 5: cut into splits; copy foreign sources into the split's backend
        self._cut_splits(graph)
        if self.debug:
            self.print_assignments(graph)
        self._build_graph_copy(graph)

    def _cut_splits(self, graph: CGraph) -> None:
        nodes = graph.nodes
        ids = self.backend_ids
        i = 0
        while i < len(nodes) and nodes[i].op in VIEW_OPS:
            i += 1
        split = Split(ids[nodes[i]] if i < len(nodes) else len(self.backends) - 1, 0)
        self.splits = [split]
        cur = split.backend_id
        for i in range(i, len(nodes)):
            node = nodes[i]
            if node.op in VIEW_OPS:
                continue
            b = ids.get(node, -1)
            need_new = b == cur and split.inputs and self._needs_new_split(node, split, cur)
            if b != cur or need_new:
                split.i_end = i
                split = Split(b, i)
                self.splits.append(split)
                cur = b
            for j, src in enumerate(node.src):
                if src is None:
                    continue
                src_b = ids.get(src, -1)
                if src_b == -1:
                    raise RuntimeError(f"scheduler: source {src.describe()} of {node.describe()} has no backend")
                if src.flags & TensorFlag.INPUT and self.n_copies > 1 and self._copy(src, src_b, 0) is None:
                    # graph inputs get n_copies slots on their own backend, rotated per alloc_graph
                    for c in range(self.n_copies):
                        if c == self.cur_copy:
                            cpy = src
                        else:
                            cpy = self._dup_layout(src, self.backends[src_b], c)
                        set_input(cpy)
                        set_output(cpy)  # never overwritten by the allocator
                        self._set_copy(src, src_b, c, cpy)
                    self.graph_inputs.append(src)
                if src_b != cur and not self._buffer_supported(src, cur):
                    if self._copy(src, cur, 0) is None:
                        for c in range(self.n_copies):
                            cpy = self._dup_layout(src, self.backends[cur], c)
                            if self.n_copies > 1:
                                set_input(cpy)
                                set_output(cpy)
                            self._set_copy(src, cur, c, cpy)
                        split.add_input(src)
                    self.rewrites.append((node, j, src, self._copy(src, cur, self.cur_copy)))
        split.i_end = len(nodes)
        self._apply_copies()

    def _needs_new_split(self, node: Tensor, split: Split, cur: int) -> bool:
        for src in node.src:
            if src is None:
                continue
            # a weight on an incompatible backend: a new split lets its copy's memory be reused
            if src.buffer is not None and src.buffer.usage == BufferUsage.WEIGHTS:
                if self._id(src) != cur and not self._buffer_supported(src, cur):
                    return True
            if len(split.inputs) >= split.inputs_capacity:
                if (self._id(src) != cur and self._copy(src, cur, 0) is None
                        and not self._buffer_supported(src, cur)):
                    return True
        return False

    def _dup_layout(self, src: Tensor, backend, c: int) -> Tensor:
        t = new_tensor_impl(self.ctx, src.type, src.ne, nb=src.nb)
        format_name(t, "%s#%s#%d", backend.get_name(), src.name, c)
        self.backend_ids[t] = self.backend_index(backend)
        self.causes[t] = "4.cpy"
        return t

    def _optimize_splits(self, graph: CGraph) -> dict[int, list[list[Tensor]]]:
        """Each split's graph; its backend's graph_optimize (where it has one) may reorder the
        split's nodes, kept in `graph`, and ask to keep tensors allocated until a later node
        (upstream's ggml_backend_graph_optimize_params.add_alloc_dep). Returns, per node id, the
        kept tensors in groups of MAX_SRC (one dependency node per group)."""
        keep: dict[int, list[Tensor]] = {}
        params = GraphOptimizeParams(keep)
        for split in self.splits:
            split.graph = graph_view(graph, split.i_start, split.i_end)
            optimize = self.backends[split.backend_id].graph_optimize
            if optimize is None:
                continue
            before = {id(n) for n in split.graph.nodes}
            optimize(split.graph, params)
            if len(split.graph.nodes) != len(before) or {id(n) for n in split.graph.nodes} != before:
                raise RuntimeError(f"graph_optimize of backend {self.backends[split.backend_id].name} changed the "
                                   f"split's set of nodes: it may only reorder them")
            graph.nodes[split.i_start:split.i_end] = split.graph.nodes
        return {k: [v[i:i + MAX_SRC] for i in range(0, len(v), MAX_SRC)] for k, v in keep.items()}

    def _alloc_dep(self, kept: list[Tensor]) -> Tensor:
        """An op-less node reading `kept`, so the allocator keeps them until it."""
        dep = view_tensor(self.ctx, kept[0])
        dep.src[:len(kept)] = kept
        return dep

    def _build_graph_copy(self, graph: CGraph) -> None:
        """The graph the allocator plans: each split's input copies, then its nodes; leafs last."""
        self.prev_node_backend_ids, self.node_backend_ids = self.node_backend_ids, []
        self.prev_leaf_backend_ids, self.leaf_backend_ids = self.leaf_backend_ids, []
        total_inputs = len(self.graph_inputs) + sum(len(s.inputs) for s in self.splits)
        gc = CGraph(max(len(graph.nodes), len(graph.leafs)) + total_inputs * 2 * self.n_copies)
        ids = self.backend_ids
        deps = self._optimize_splits(graph)
        for split in self.splits:
            for inp in split.inputs:
                cpy = self._copy(inp, split.backend_id, self.cur_copy)
                # keep the source alive until the copy is done
                dep = view_tensor(self.ctx, inp)
                dep.src[0] = inp
                gc.nodes.append(dep)
                self.node_backend_ids.append(ids[inp])
                # the copy is allocated at the start of the split
                gc.nodes.append(cpy)
                self.node_backend_ids.append(split.backend_id)
            for node in graph.nodes[split.i_start:split.i_end]:
                gc.nodes.append(node)
                self.node_backend_ids.append(ids[node])
                for kept in deps.get(id(node), ()):  # tensors graph_optimize keeps alive until here
                    gc.nodes.append(self._alloc_dep(kept))
                    self.node_backend_ids.append(ids[node])
        if self.n_copies > 1:
            # input copies first among leafs so they are allocated before anything else
            for inp in self.graph_inputs:
                b = ids[inp]
                for c in range(self.n_copies):
                    gc.leafs.append(self._copy(inp, b, c))
                    self.leaf_backend_ids.append(b)
            for split in self.splits:
                for inp in split.inputs:
                    for c in range(self.n_copies):
                        gc.leafs.append(self._copy(inp, split.backend_id, c))
                        self.leaf_backend_ids.append(split.backend_id)
        for leaf in graph.leafs:
            gc.leafs.append(leaf)
            self.leaf_backend_ids.append(ids[leaf])
        gc.visited = {id(t) for t in gc.nodes} | {id(t) for t in gc.leafs}
        self.graph = gc

    # ------------------------------------------------------------ allocation

    def _alloc_splits(self) -> bool:
        from ..alloc import gallocr_alloc_graph, gallocr_reserve_n
        changed = self._buft_changed(self.node_backend_ids, self.prev_node_backend_ids) or \
            self._buft_changed(self.leaf_backend_ids, self.prev_leaf_backend_ids)
        if changed or not gallocr_alloc_graph(self.galloc, self.graph):
            # re-planning may move split inputs: wait for queued work first (keeping cur_copy)
            for b in self.backends:
                b.synchronize()
            if not gallocr_reserve_n(self.galloc, self.graph, self.node_backend_ids, self.leaf_backend_ids):
                return False
            if not gallocr_alloc_graph(self.galloc, self.graph):
                log.error("scheduler: failed to allocate the graph")
                return False
        return True

    def _buft_changed(self, now: list[int], prev: list[int]) -> bool:
        if len(now) != len(prev):
            return True
        bufts = self.bufts
        return any(a != b and bufts[a] is not bufts[b] for a, b in zip(now, prev))

    def reserve(self, measure_graph: CGraph) -> bool:
        from ..alloc import gallocr_reserve_n
        self.synchronize()
        self._split(measure_graph)
        try:
            if not gallocr_reserve_n(self.galloc, self.graph, self.node_backend_ids, self.leaf_backend_ids):
                return False
        finally:
            self._restore_sources()
        self.reset()
        return True

    def reserve_size(self, measure_graph: CGraph) -> list[int]:
        """Per-backend buffer sizes the graph needs, without allocating."""
        from ..alloc import gallocr_reserve_n_size
        self.reset()
        self.synchronize()
        self._split(measure_graph)
        try:
            return gallocr_reserve_n_size(self.galloc, self.graph, self.node_backend_ids, self.leaf_backend_ids)
        finally:
            self._restore_sources()

    def alloc_graph(self, graph: CGraph) -> bool:
        if self.is_alloc:
            raise RuntimeError("backend_sched_alloc_graph: a graph is already allocated: compute it, or call "
                               "backend_sched_reset before allocating a graph (the same one included) again")
        self.cur_copy = self.next_copy
        self.next_copy = (self.next_copy + 1) % self.n_copies
        self._split(graph)
        try:
            if not self._alloc_splits():
                return False
        finally:
            self._restore_sources()
        self.is_alloc = True
        return True

    def reset(self) -> None:
        self._retire_rewrites()
        if not self.is_reset:
            self.backend_ids = {}
            self.copies = {}
            self.causes = {}
            self.is_reset = True
        self.is_alloc = False

    # ------------------------------------------------------------ compute

    def graph_compute_async(self, graph: CGraph) -> Status:
        if not self.is_reset and not self.is_alloc:
            self.reset()
        if not self.is_alloc and not self.alloc_graph(graph):
            return Status.ALLOC_FAILED
        return self._compute_splits()

    def graph_compute(self, graph: CGraph) -> Status:
        status = self.graph_compute_async(graph)
        self.synchronize()
        return status

    def synchronize(self) -> None:
        for b in self.backends:
            b.synchronize()
        self.in_flight = False
        for node, j, src, _ in self.pending_restores:  # the work that read the copies is done
            node.src[j] = src
        self.pending_restores = []
        self._restore_sources()
        if not self.is_alloc:
            # after a synchronization always start from copy 0, so repeated graphs stay identical
            self.next_copy = 0

    def _wait_split_free(self, backend_id: int, blocking: bool) -> None:
        """Wait until the split backend finished using this copy slot's inputs."""
        ev = self.events[backend_id][self.cur_copy]
        backend = self.backends[backend_id]
        if ev is None:
            backend.synchronize()
        elif blocking:
            backend_event_synchronize(ev)
        else:
            backend_event_wait(backend, ev)

    def _compute_splits(self) -> Status:
        self._apply_copies()  # put back by synchronize (graph_compute does it)
        self.in_flight = True
        prev_id = -1
        for i_split, split in enumerate(self.splits):
            b_id = split.backend_id
            backend = self.backends[b_id]
            if not split.inputs and prev_id >= 0 and prev_id != b_id:
                # the allocator may reuse memory across splits: the previous split must be done
                ev = self.events[prev_id][self.cur_copy]
                if ev is not None:
                    backend_event_synchronize(ev)
                else:
                    self.backends[prev_id].synchronize()
            for inp in split.inputs:
                from .tensor_io import backend_tensor_copy
                in_backend = self.backends[self.backend_ids[inp]]
                cpy = self._copy(inp, b_id, self.cur_copy)
                if inp.flags & TensorFlag.INPUT:
                    # user inputs are copied now, so the user may overwrite them right after
                    self._wait_split_free(b_id, blocking=True)
                    backend_tensor_copy(inp, cpy)
                else:
                    self._wait_split_free(b_id, blocking=False)
                    if not backend.cpy_tensor_async(in_backend, inp, cpy):
                        in_backend.synchronize()
                        self._wait_split_free(b_id, blocking=True)
                        backend_tensor_copy(inp, cpy)
            with split_range(backend.name, i_split):
                status = self._run_split(split, backend)
            if status != Status.SUCCESS:
                return status
            ev = self.events[b_id][self.cur_copy]
            if ev is not None:
                backend_event_record(ev, backend)
            prev_id = b_id
        return Status.SUCCESS

    def _run_split(self, split: Split, backend) -> Status:
        if self.callback_eval is None:
            # a split is computed again while its graph stays allocated (a model's decode steps):
            # the backend's plan (compiled calls, a CUDA graph) is made once and replayed
            if split.plan is None:
                split.plan = backend_graph_plan_create(backend, split.graph)
            return backend_graph_plan_compute(backend, split.plan)
        # run node ranges up to each node the callback wants to observe
        nodes = split.graph.nodes
        j0 = 0
        while j0 < len(nodes):
            j1 = j0
            need = self.callback_eval(nodes[j1], True)
            while not need and j1 < len(nodes) - 1:
                j1 += 1
                need = self.callback_eval(nodes[j1], True)
            status = backend.graph_compute(graph_view(split.graph, j0, j1 + 1))
            if status != Status.SUCCESS:
                return status
            backend.synchronize()
            if need and not self.callback_eval(nodes[j1], False):
                break
            j0 = j1 + 1
        return Status.SUCCESS

    # ------------------------------------------------------------ debugging

    def print_assignments(self, graph: CGraph, file=None) -> None:
        """Upstream's GGML_SCHED_DEBUG table: splits with their inputs, then node, op, size,
        backend and why it was chosen, with each source's backend."""
        import sys
        out = file or sys.stderr
        starts = {s.i_start: (k, s) for k, s in enumerate(self.splits)}
        for i, node in enumerate(graph.nodes):
            if i in starts:
                k, s = starts[i]
                inputs = " ".join(f"[{t.name} ({_fmt_size(nbytes(t))})]" for t in s.inputs)
                print(f"\n## SPLIT #{k}: {self.backends[s.backend_id].name} # {len(s.inputs)} inputs"
                      + (f": {inputs}" if inputs else ""), file=out)
            if node.op in VIEW_OPS:
                continue
            b = self.get_tensor_backend(node)
            line = (f"node #{i:3d} ({node.op.name[:10]:>10}): {node.name[:20]:>20} ({_fmt_size(nbytes(node)):>5}) "
                    f"[{b.name if b else 'NULL':>5} {self.causes.get(node, ''):>8}]")
            for src in node.src:
                if src is None:
                    continue
                sb = self.get_tensor_backend(src)
                line += (f" {src.name[:20]:>20} ({_fmt_size(nbytes(src)):>5}) "
                         f"[{sb.name if sb else 'NULL':>5} {self.causes.get(src, ''):>8}]")
            print(line, file=out)

    def get_tensor_backend(self, t: Tensor):
        b = self._id(t)
        return None if b == -1 else self.backends[b]


def _fmt_size(size: int) -> str:
    return f"{size // 2**20}M" if size >= 2**20 else f"{size // 1024}K"


# ---------------------------------------------------------------- mirrored functions

def backend_sched_new(backends, bufts=None, graph_size: int = DEFAULT_GRAPH_SIZE, parallel: bool = False,
                      op_offload: bool = True) -> Sched:
    return Sched(backends, bufts, graph_size, parallel, op_offload)


def backend_sched_free(sched: Sched | None) -> None:
    if sched is not None:
        sched.synchronize()
        sched._free_plans()
        from .event import backend_event_free
        for row in sched.events:
            for ev in row:
                if ev is not None:
                    backend_event_free(ev)


def backend_sched_reserve(sched: Sched, measure_graph: CGraph) -> bool:
    return sched.reserve(measure_graph)


def backend_sched_reserve_size(sched: Sched, measure_graph: CGraph) -> list[int]:
    return sched.reserve_size(measure_graph)


def backend_sched_get_n_backends(sched: Sched) -> int:
    return len(sched.backends)


def backend_sched_get_backend(sched: Sched, i: int):
    if not 0 <= i < len(sched.backends):
        raise IndexError(f"backend_sched_get_backend: index {i} out of range")
    return sched.backends[i]


def backend_sched_get_n_splits(sched: Sched) -> int:
    return len(sched.splits)


def backend_sched_get_n_copies(sched: Sched) -> int:
    return sched.n_copies


def _index_of(sched: Sched, backend) -> int:
    i = sched.backend_index(backend)
    if i < 0:
        raise ValueError(f"backend {backend.name} is not one of the scheduler's backends")
    return i


def backend_sched_get_buffer_type(sched: Sched, backend):
    return sched.bufts[_index_of(sched, backend)]


def backend_sched_get_buffer_size(sched: Sched, backend) -> int:
    from ..alloc import gallocr_get_buffer_size
    return gallocr_get_buffer_size(sched.galloc, _index_of(sched, backend))


def backend_sched_set_tensor_backend(sched: Sched, node: Tensor, backend) -> None:
    sched.backend_ids[node] = _index_of(sched, backend)
    sched.causes[node] = "usr"
    sched.is_reset = False


def backend_sched_get_tensor_backend(sched: Sched, node: Tensor):
    return sched.get_tensor_backend(node)


def backend_sched_split_graph(sched: Sched, graph: CGraph) -> None:
    sched.split_graph(graph)


def backend_sched_alloc_graph(sched: Sched, graph: CGraph) -> bool:
    return sched.alloc_graph(graph)


def backend_sched_graph_compute(sched: Sched, graph: CGraph) -> Status:
    return sched.graph_compute(graph)


def backend_sched_graph_compute_async(sched: Sched, graph: CGraph) -> Status:
    return sched.graph_compute_async(graph)


def backend_sched_synchronize(sched: Sched) -> None:
    sched.synchronize()


def backend_sched_reset(sched: Sched) -> None:
    sched.reset()


def backend_sched_set_eval_callback(sched: Sched, callback) -> None:
    """callback(tensor, ask: bool) -> bool: with ask=True, whether the caller wants to see this
    node's data; with ask=False (data ready), whether to continue computing."""
    sched.callback_eval = callback
