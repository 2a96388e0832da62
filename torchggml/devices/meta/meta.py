"""The meta device (upstream's ggml-backend-meta): one device made of several simple devices,
for tensor parallelism.

    dev = ggml.backend_meta_device([sim0, sim1], get_split_state)
    buffers, graphs and backends of `dev` work as any device's

Each tensor of a meta buffer has one simple tensor per simple device (`t.extra`, a
MetaTensor): a slice along its split axis, a full copy (MIRRORED), or a full-shape partial sum
(PARTIAL). Weights and caches get their split state from `get_split_state(tensor)` (None or
no callback: MIRRORED); compute tensors derive theirs from their sources (meta_split.py).
A compute buffer gives every simple device the meta buffer's whole size and places simple
tensors at the meta tensor's offset; `alloc_ctx_tensors` (weights) gives each simple device
only its slices.

The meta backend runs a graph piece by piece: a piece ends after each PARTIAL node, whose
partial sums are all-reduced through the simple devices' reg (`comm_allreduce_tensor`)
before the next piece runs. Within a piece the simple backends run concurrently on their own
streams.

With a torch.distributed process group, the meta device spans every rank: each rank gives its
own devices, split states count devices over all ranks (rank-major), and each rank holds,
loads and computes only its own devices' slices.
"""
from __future__ import annotations

import itertools
from array import array

import torch

from ...enums import Op, Status
from ...graph import CGraph
from ...tensor import Tensor, contiguous_strides, is_contiguous, nbytes, round_up
from ...backend.backend import Backend, backend_graph_plan_create, backend_graph_plan_compute, backend_graph_plan_free
from ...backend.buffer import Buffer, BufferType, BufferUsage
from ...backend.device import Device, DeviceCaps, DeviceType
from .split import (MIRRORED, MAX_DEVICES, MetaSplitState, SplitAxis, decompose,
                         derive_split_state, resolve)


class MetaTensor:
    """What a meta tensor is on the simple devices: its split state (PARTIAL kept as computed)
    and one simple tensor per local device."""
    __slots__ = ("state", "simples")

    def __init__(self, state: MetaSplitState, simples: list):
        self.state = state
        self.simples = simples


def meta_info(t: Tensor) -> MetaTensor | None:
    return t.extra if isinstance(t.extra, MetaTensor) else None


def ensure_meta(t: Tensor) -> MetaTensor | None:
    """t's meta info, made now for a view that got its address when it was created (a view of
    an allocated tensor never passes through an allocator's init)."""
    info = meta_info(t)
    if info is None and isinstance(t.buffer, MetaBuffer):
        t.buffer.init_tensor(t)
        info = meta_info(t)
    return info


def synced(state: MetaSplitState) -> MetaSplitState:
    """How readers see a tensor: PARTIAL sums are all-reduced before anyone reads them."""
    return MIRRORED if state.axis == SplitAxis.PARTIAL else state


def get_split_state(t: Tensor, assume_sync: bool = True) -> MetaSplitState:
    """The split state of a tensor of a meta buffer (MIRRORED for other tensors)."""
    info = meta_info(t)
    if info is None:
        return MIRRORED
    return synced(info.state) if assume_sync else info.state


# ---------------------------------------------------------------- device

class MetaDevice(Device):
    def __init__(self, devs, get_split_state=None, group=None):
        devs = list(devs)
        if not devs:
            raise ValueError("backend_meta_device: no devices given")
        if len({id(d) for d in devs}) != len(devs):
            raise ValueError(f"backend_meta_device: a device is listed twice in {[d.get_name() for d in devs]}")
        self.devs = devs
        self.get_split_state_fn = get_split_state
        self.group = group
        if group is not None:
            import torch.distributed as dist
            self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        else:
            self.rank, self.world = 0, 1
        self.n_slots = len(devs) * self.world            # devices over all ranks
        self.local_slots = [self.rank * len(devs) + j for j in range(len(devs))]
        if self.n_slots > MAX_DEVICES:
            raise ValueError(f"backend_meta_device: {self.n_slots} devices, at most {MAX_DEVICES}")
        names = ",".join(d.get_name() for d in devs)
        name = f"Meta({names})" if group is None else f"Meta({names}@rank{self.rank}/{self.world})"
        desc = "Meta(" + ",".join(d.get_description() for d in devs) + ")"
        super().__init__(name, desc, DeviceType.META, None)
        self.buffer_type = MetaBufferType(self)

    def get_memory(self):
        mems = [d.get_memory() for d in self.devs]
        return sum(m[0] for m in mems), sum(m[1] for m in mems)

    def get_caps(self) -> DeviceCaps:
        caps = [d.get_caps() for d in self.devs]
        return DeviceCaps(async_=all(c.async_ for c in caps))

    def init_backend(self, params=None) -> "MetaBackend":
        return MetaBackend(self, params)

    def get_buffer_type(self):
        return self.buffer_type

    def supports_op(self, op) -> bool:
        return all(d.supports_op(op) for d in self.devs)

    def supports_buft(self, buft) -> bool:
        return isinstance(buft, MetaBufferType) and buft.device.devs == self.devs

    # --- split states
    def split_state(self, t: Tensor) -> MetaSplitState:
        """The state of a tensor being placed in a meta buffer of this device."""
        for s in (t.view_src, *t.src):
            if s is not None and s is not t:
                ensure_meta(s)
        if t.view_src is None and t.op == Op.NONE:
            fn = self.get_split_state_fn
            return resolve(fn(t) if fn is not None else None, t, self.n_slots)
        src_states = [get_split_state(s) if s is not None else None for s in t.src]
        root = get_split_state(t.view_src) if t.view_src is not None else None
        return derive_split_state(t, src_states, self.n_slots, root)

    def simple_tensors(self, t: Tensor, state: MetaSplitState) -> list[Tensor]:
        """t's simple tensor on every local device (memory not yet assigned for roots)."""
        out = []
        root = t.view_src
        for k, slot in enumerate(self.local_slots):
            ne = list(t.ne)
            if state.is_split:
                ne[state.axis] = state.device_ne(slot, self.n_slots)
            if root is None:
                s = Tensor(None, t.type, ne, contiguous_strides(t.type, ne))
            else:
                rinfo = meta_info(root)
                if rinfo is None:
                    raise ValueError(f"meta: the view source {root.describe()} of {t.describe()} is not a meta tensor")
                rs = rinfo.simples[k]
                if rinfo.state.is_split:  # strides and offset re-expressed in the slice's layout
                    nb = list(t.nb)
                    for d in range(4):
                        nb[d] = _translate(t.nb[d], root, rs) if t.ne[d] > 1 else (nb[d - 1] * ne[d - 1] if d else nb[0])
                    offs = _translate(t.view_offs, root, rs)
                else:
                    nb, offs = list(t.nb), t.view_offs
                s = Tensor(None, t.type, ne, nb, rs, offs)
                s.buffer = rs.buffer
                s.data = rs.data + offs if rs.data is not None else None
            s.op = t.op
            s.op_params = array("i", t.op_params)
            s.flags = t.flags
            s.name = t.name
            for i, src in enumerate(t.src):
                if src is not None:
                    info = meta_info(src)
                    s.src[i] = s if src is t else (info.simples[k] if info is not None else src)
            out.append(s)
        return out


def _translate(x: int, root: Tensor, simple_root: Tensor) -> int:
    """A byte offset/stride of the root in the simple root's layout."""
    coords = decompose(x, root)
    return sum(c * nb for c, nb in zip(coords, simple_root.nb))


_meta_devices: dict = {}


def backend_meta_device(devs, get_split_state=None, group=None) -> MetaDevice:
    """A meta device over `devs` (Device objects or names). `get_split_state(tensor)` returns a
    MetaSplitState (or None for MIRRORED) for tensors placed directly in its buffers (weights,
    caches, inputs). The same arguments give the same device. With a torch.distributed
    `group`, `devs` are this rank's devices of a meta device over all ranks."""
    from ...backend.registry import backend_dev_by_name
    resolved = []
    for d in devs:
        dev = backend_dev_by_name(d) if isinstance(d, str) else d
        if dev is None:
            raise ValueError(f"backend_meta_device: no device named {d!r}")
        if isinstance(dev, MetaDevice):
            raise ValueError(f"backend_meta_device: {dev.get_name()} is already a meta device")
        resolved.append(dev)
    key = (tuple(id(d) for d in resolved), id(get_split_state), id(group))
    dev = _meta_devices.get(key)
    if dev is None or dev.devs != resolved or dev.get_split_state_fn is not get_split_state:
        dev = _meta_devices[key] = MetaDevice(resolved, get_split_state, group)
    return dev


def backend_dev_is_meta(dev) -> bool:
    return isinstance(dev, MetaDevice)


# ---------------------------------------------------------------- buffers

_fake_bases = itertools.count(1)


def _fake_base() -> int:
    """Meta buffers have no memory of their own: a unique made-up address keeps tensor.data an
    address (base + offset) as the allocators expect."""
    return (1 << 60) + next(_fake_bases) * (1 << 44)


class MetaBufferType(BufferType):
    def __init__(self, device: MetaDevice):
        self.simple_bufts = [d.get_buffer_type() for d in device.devs]
        super().__init__("Meta(" + ",".join(b.get_name() for b in self.simple_bufts) + ")", device)

    def alloc_buffer(self, size: int) -> "MetaBuffer":
        return MetaBuffer(self, [b.alloc_buffer(size) for b in self.simple_bufts], int(size))

    def get_alignment(self) -> int:
        return max(b.get_alignment() for b in self.simple_bufts)

    def get_max_size(self) -> int:
        return min(b.get_max_size() for b in self.simple_bufts)

    def get_alloc_size(self, tensor: Tensor) -> int:
        return max(b.get_alloc_size(tensor) for b in self.simple_bufts)

    def alloc_ctx_tensors(self, ctx) -> "MetaBuffer | None":
        """Allocate ctx's tensors with each simple device holding only its slices (weights).
        Tensors are taken in creation order, so a tensor's sources (views too) come first."""
        todo = _sources_first([t for t in ctx.tensors if t.data is None])
        if not any(t.view_src is None for t in todo):
            return None
        dev = self.device
        align = self.get_alignment()
        meta_buf = MetaBuffer(self, [None] * len(self.simple_bufts), 0)
        offset = 0
        for t in todo:
            if t.view_src is None:
                t.buffer, t.data = meta_buf, meta_buf.base + offset
                offset += round_up(max(nbytes(t), 1), align)
            else:
                t.buffer, t.data = t.view_src.buffer, t.view_src.data + t.view_offs
            state = dev.split_state(t)
            t.extra = MetaTensor(state, dev.simple_tensors(t, state))
        meta_buf.size = offset
        for k, buft in enumerate(self.simple_bufts):
            simples = [meta_info(t).simples[k] for t in todo]
            a = buft.get_alignment()
            sizes = [round_up(buft.get_alloc_size(s), a) if s.view_src is None else 0 for s in simples]
            buf = meta_buf.simple_buffers[k] = buft.alloc_buffer(sum(sizes))
            addr = buf.get_base()
            for s, size in zip(simples, sizes):
                if s.view_src is None:
                    s.buffer, s.data = buf, addr
                    addr += size
                else:  # views were made before their roots had memory
                    s.buffer, s.data = s.view_src.buffer, s.view_src.data + s.view_offs
                s.buffer.init_tensor(s)
        return meta_buf


def _sources_first(tensors: list) -> list:
    """The tensors ordered so that sources and view sources come before their users (creation
    order mostly is, but e.g. attention sinks are attached to a node after it was made)."""
    pending = {id(t): t for t in tensors}
    order = []

    def visit(t):
        stack = [(t, False)]
        while stack:
            x, done = stack.pop()
            if done:
                order.append(x)
                continue
            if pending.pop(id(x), None) is None:
                continue
            stack.append((x, True))
            for s in (x.view_src, *x.src):
                if s is not None and id(s) in pending:
                    stack.append((s, False))
    for t in tensors:
        visit(t)
    return order


class MetaBuffer(Buffer):
    """One simple buffer per local device."""

    def __init__(self, buft: MetaBufferType, simple_buffers: list, size: int):
        super().__init__(buft, size, _fake_base())
        self.simple_buffers = simple_buffers
        self.device = buft.device

    def free(self) -> None:
        super().free()
        for b in self.simple_buffers:
            if b is not None:
                b.free()

    def set_usage(self, usage: BufferUsage) -> None:
        super().set_usage(usage)
        for b in self.simple_buffers:
            if b is not None:
                b.set_usage(usage)

    def reset(self) -> None:
        for b in self.simple_buffers:
            if b is not None:
                b.reset()

    def clear(self, value: int) -> None:
        for b in self.simple_buffers:
            if b is not None and b.size:
                b.clear(value)

    def init_tensor(self, t: Tensor) -> Status:
        state = self.device.split_state(t)
        simples = self.device.simple_tensors(t, state)
        if t.view_src is None:
            offset = t.data - self.base
            for s, buf in zip(simples, self.simple_buffers):
                s.buffer, s.data = buf, buf.get_base() + offset
                buf.init_tensor(s)
        else:
            for s in simples:
                s.buffer.init_tensor(s)
        t.extra = MetaTensor(state, simples)
        return Status.SUCCESS

    # --- data in and out, split as the tensor is
    def set_tensor(self, t: Tensor, data: torch.Tensor, offset: int, size: int) -> None:
        scatter(self.device, t, data, offset, size, lambda k, s, d, o, n: s.buffer.set_tensor(s, d, o, n))

    def get_tensor(self, t: Tensor, out: torch.Tensor, offset: int, size: int) -> None:
        gather(self.device, t, out, offset, size, lambda k, s, d, o, n: s.buffer.get_tensor(s, d, o, n),
               lambda: None)

    def memset_tensor(self, t: Tensor, value: int, offset: int, size: int) -> None:
        if get_split_state(t, False).is_split:
            data = torch.full((size,), value, dtype=torch.uint8)
            self.set_tensor(t, data, offset, size)
        else:
            for s in meta_info(t).simples:
                s.buffer.memset_tensor(s, value, offset, size)


def _columns(dev: MetaDevice, t: Tensor, state: MetaSplitState):
    """Byte ranges of one chunk (one index of the axis above the split axis) that each slot
    holds, as [(slot, start, length)], in the chunk's order."""
    from ...types import blck_size
    n, a = dev.n_slots, int(state.axis)
    per_element = t.nb[a] / (blck_size(t.type) if a == 0 else 1)  # bytes per element along the axis
    cols, start = [], 0
    for s in range(state.n_segments):
        for _ in range(state.repeats(s)):
            for j in range(n):
                length = int(state.ne[s * n + j] * per_element)
                cols.append((j, start, length))
                start += length
    return cols


def _chunk_size(t: Tensor, a: int) -> int:
    return t.nb[a + 1] if a + 1 < 4 else nbytes(t)


def _split_io_check(t: Tensor, offset: int, size: int, chunk: int, what: str) -> None:
    if not is_contiguous(t):
        raise ValueError(f"{what}: {t.describe()} is split across devices and not contiguous")
    if offset % chunk or size % chunk:
        raise ValueError(f"{what}: {t.describe()} is split across devices: offset {offset} and size {size} "
                         f"must be whole multiples of {chunk} bytes (ne[axis+1] steps)")


def scatter(dev: MetaDevice, t: Tensor, data: torch.Tensor, offset: int, size: int, write) -> None:
    """Write bytes of the full tensor to its simple tensors: write(k, simple, bytes, offset, size)."""
    info = meta_info(t)
    state = info.state
    if state.axis == SplitAxis.MIRRORED:
        for k, s in enumerate(info.simples):
            write(k, s, data, offset, size)
        return
    if state.axis == SplitAxis.PARTIAL:
        if t.type.name != "F32" or offset % 4 or size % 4:
            raise ValueError(f"backend_tensor_set: PARTIAL {t.describe()} takes whole F32 values")
        share = (data[:size].view(torch.float32) / dev.n_slots).view(torch.uint8)
        for k, s in enumerate(info.simples):
            write(k, s, share, offset, size)
        return
    a = int(state.axis)
    chunk = _chunk_size(t, a)
    _split_io_check(t, offset, size, chunk, "backend_tensor_set")
    rows = data[:size].reshape(size // chunk, chunk)
    local = {slot: k for k, slot in enumerate(dev.local_slots)}
    parts = {k: [] for k in range(len(info.simples))}
    for slot, start, length in _columns(dev, t, state):
        if slot in local and length:
            parts[local[slot]].append(rows[:, start:start + length])
    for k, s in enumerate(info.simples):
        if parts[k]:
            block = torch.cat(parts[k], dim=1).contiguous().reshape(-1)
            sub = block.numel() // rows.shape[0]
            write(k, s, block, offset // chunk * sub, block.numel())


def gather(dev: MetaDevice, t: Tensor, out: torch.Tensor, offset: int, size: int, read, sync) -> None:
    """Read bytes of the full tensor from its simple tensors: read(k, simple, dst, offset, size);
    `sync()` waits for queued reads before the pieces are put together."""
    info = meta_info(t)
    state = info.state
    if not state.is_split:  # a PARTIAL node is all-reduced by the compute that wrote it
        read(0, info.simples[0], out, offset, size)
        return
    a = int(state.axis)
    chunk = _chunk_size(t, a)
    _split_io_check(t, offset, size, chunk, "backend_tensor_get")
    n_rows = size // chunk
    local = {slot: k for k, slot in enumerate(dev.local_slots)}
    cols = _columns(dev, t, state)
    blocks = {}
    for k, s in enumerate(info.simples):
        width = sum(length for slot, _, length in cols if local.get(slot) == k)
        if width:
            blocks[k] = torch.empty(n_rows * width, dtype=torch.uint8)
            read(k, s, blocks[k], offset // chunk * width, n_rows * width)
    sync()
    rows = out[:size].view(n_rows, chunk)
    if dev.group is not None:
        rows.zero_()
    used = {k: 0 for k in blocks}
    for slot, start, length in cols:
        k = local.get(slot)
        if k is None or not length:
            continue
        b = blocks[k].view(n_rows, -1)
        rows[:, start:start + length] = b[:, used[k]:used[k] + length]
        used[k] += length
    if dev.group is not None:  # every rank filled its own columns: summing the bytes gathers them
        from ...backend.comm import group_sum_bytes
        flat = out[:size].contiguous()
        group_sum_bytes(flat, dev.group)
        out[:size].copy_(flat)


# ---------------------------------------------------------------- backend

class MetaPlan:
    """A graph cut into pieces: per piece, a plan on every simple backend and, when the piece
    ends with a PARTIAL node, that node's simple tensors to all-reduce."""

    def __init__(self, graph, pieces):
        self.graph = graph
        self.pieces = pieces  # [(plans per backend, partial simple tensors or None)]


class MetaBackend(Backend):
    def __init__(self, device: MetaDevice, params=None):
        super().__init__(device, device.get_name())
        self.backends = [d.init_backend(params) for d in device.devs]
        reg = device.devs[0].reg
        fns = [reg.get_proc_address(f"comm_{x}") if reg is not None else None for x in ("init", "allreduce_tensor", "free")]
        if any(f is None for f in fns):
            from ...backend import comm
            fns = [comm.comm_init, comm.comm_allreduce_tensor, comm.comm_free]
        self._comm_init, self._comm_allreduce, self._comm_free = fns
        self.comm = self._comm_init(self.backends, device.group)

    def free(self) -> None:
        self._comm_free(self.comm)
        for b in self.backends:
            b.free()

    def synchronize(self) -> None:
        """Wait for every simple backend, then raise the first failure (none is left pending)."""
        error = None
        for b in self.backends:
            try:
                b.synchronize()
            except Exception as e:  # noqa: BLE001 - re-raised below after the others are waited for
                error = error or e
        if error is not None:
            raise error

    def set_tensor_async(self, t, data, offset: int, size: int):
        from ...backend.backend import backend_tensor_set_async
        scatter(self.device, t, data, offset, size,
                lambda k, s, d, o, n: backend_tensor_set_async(self.backends[k], s, d, o, n))
        return None

    def get_tensor_async(self, t, out, offset: int, size: int):
        from ...backend.backend import backend_tensor_get_async
        gather(self.device, t, out, offset, size,
               lambda k, s, d, o, n: backend_tensor_get_async(self.backends[k], s, d, o, n), self.synchronize)
        return None

    # --- compute
    def _pieces(self, graph):
        """Node index ranges: a piece ends after every PARTIAL node."""
        ranges, start = [], 0
        for i, node in enumerate(graph.nodes):
            info = ensure_meta(node)
            if info is None:
                raise ValueError(f"{self.name}: {node.describe()} is not in a meta buffer of {self.device.name}")
            if info.state.axis == SplitAxis.PARTIAL:
                ranges.append((start, i + 1, True))
                start = i + 1
        if start < len(graph.nodes):
            ranges.append((start, len(graph.nodes), False))
        return ranges

    def graph_plan_create(self, graph):
        pieces = []
        for start, stop, partial in self._pieces(graph):
            plans = []
            for k, b in enumerate(self.backends):
                g = CGraph(max(1, stop - start))
                g.nodes = [meta_info(node).simples[k] for node in graph.nodes[start:stop]]
                g.visited = {id(x) for x in g.nodes}
                plans.append(backend_graph_plan_create(b, g))
            last = [meta_info(graph.nodes[stop - 1]).simples[k] for k in range(len(self.backends))] if partial else None
            pieces.append((plans, last))
        return MetaPlan(graph, pieces)

    def graph_plan_free(self, plan) -> None:
        for plans, _ in plan.pieces:
            for b, p in zip(self.backends, plans):
                backend_graph_plan_free(b, p)

    def graph_plan_update(self, plan, graph):
        self.graph_plan_free(plan)
        new = self.graph_plan_create(graph)
        plan.graph, plan.pieces = new.graph, new.pieces

    def graph_plan_compute(self, plan) -> Status:
        for plans, partial in plan.pieces:
            for b, p in zip(self.backends, plans):
                status = backend_graph_plan_compute(b, p)
                if int(status) != 0:
                    return status
            if partial is not None and (len(partial) > 1 or self.device.group is not None):
                if not self._comm_allreduce(self.comm, partial):
                    raise RuntimeError(f"{self.name}: all-reduce of {partial[0].describe()} failed")
        return Status.SUCCESS

    def graph_compute(self, graph) -> Status:
        plan = self.graph_plan_create(graph)
        try:
            return self.graph_plan_compute(plan)
        finally:
            self.graph_plan_free(plan)


# ---------------------------------------------------------------- the impl header's meta helpers

def backend_is_meta(backend) -> bool:
    return isinstance(backend, MetaBackend)


def backend_buffer_is_meta(buffer) -> bool:
    return isinstance(buffer, MetaBuffer)


def backend_buft_is_meta(buft) -> bool:
    return isinstance(buft, MetaBufferType)


def _require_meta(backend, what: str) -> MetaBackend:
    if not backend_is_meta(backend):
        raise TypeError(f"{what}: backend {getattr(backend, 'name', backend)!r} is not a meta backend")
    return backend


def backend_meta_n_backends(meta_backend) -> int:
    """How many simple backends (one per device of this process) the meta backend drives."""
    return len(_require_meta(meta_backend, "backend_meta_n_backends").backends)


def backend_meta_simple_backend(meta_backend, index: int):
    """The index-th simple backend of a meta backend."""
    backends = _require_meta(meta_backend, "backend_meta_simple_backend").backends
    if not 0 <= index < len(backends):
        raise IndexError(f"backend_meta_simple_backend: index {index} out of range for {meta_backend.name}, "
                         f"which has {len(backends)} backends")
    return backends[index]
