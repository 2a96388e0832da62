"""Memory planning: tallocr (linear), gallocr (graph planner) and context tensor allocation.

gallocr follows upstream ggml-alloc.c. `reserve` walks a graph in execution order and plans
every tensor an offset inside one virtual buffer per buffer type (a dynamic allocator with
best-fit over free blocks); tensors are freed when their last consumer has run, element-wise
ops reuse a dying parent's memory (in place), and the high-water mark of each allocator
becomes the size of its buffer. `alloc_graph` then hands out the planned addresses by graph
position. A buffer type with a max size gets several buffers ("chunks") instead of one.
"""
from __future__ import annotations

import bisect
import logging
import sys
from typing import NamedTuple

from .enums import Op, Status, TensorFlag
from .tensor import Tensor, round_up

log = logging.getLogger("torchggml.alloc")

_INPUT = int(TensorFlag.INPUT)
_OUTPUT = int(TensorFlag.OUTPUT)

# ops whose kernels may write their result over a source (upstream ggml_op_can_inplace);
# FILL is in upstream's list too, and joins as soon as the Op enum has it
_INPLACE_OP_NAMES = ("FILL", "SCALE", "DIAG_MASK_ZERO", "DIAG_MASK_INF", "ADD", "ADD_ID", "ADD1",
                     "SUB", "MUL", "DIV", "SQR", "SQRT", "LOG", "UNARY", "ROPE", "ROPE_BACK",
                     "SILU_BACK", "RMS_NORM", "RMS_NORM_BACK", "SOFT_MAX", "SOFT_MAX_BACK")
_INPLACE_OPS = frozenset(Op[name] for name in _INPLACE_OP_NAMES if name in Op.__members__)


def op_can_inplace(op: Op) -> bool:
    """Whether gallocr may give a node of `op` the memory of one of its sources."""
    return op in _INPLACE_OPS


def _aligned_offset(base: int, offset: int, alignment: int) -> int:
    """The first offset >= `offset` whose address base + offset is a multiple of `alignment`."""
    return offset + (-(base + offset)) % alignment


def _check_alignment(alignment: int, owner) -> int:
    alignment = int(alignment)
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"{owner}: alignment {alignment} is not a power of two")
    return alignment


# ---------------------------------------------------------------- placing single tensors

def backend_tensor_alloc(buffer, tensor: Tensor, addr: int) -> Status:
    """Place tensor at address addr inside buffer (ggml_backend_tensor_alloc)."""
    if tensor.buffer is not None or tensor.data is not None:
        raise ValueError(f"backend_tensor_alloc: {tensor.describe()} is already allocated")
    if tensor.view_src is not None:
        raise ValueError(f"backend_tensor_alloc: {tensor.describe()} is a view; use backend_view_init")
    base = buffer.get_base()
    size = buffer.buft.get_alloc_size(tensor)
    if addr < base or addr + size > base + buffer.size:
        raise MemoryError(f"backend_tensor_alloc: {tensor.describe()} ({size} bytes at offset {addr - base}) "
                          f"does not fit in buffer {buffer.name} of {buffer.size} bytes")
    tensor.buffer = buffer
    tensor.data = addr
    return buffer.init_tensor(tensor)


def backend_view_init(tensor: Tensor) -> Status:
    """Give a view the address of its source (ggml_backend_view_init)."""
    src = tensor.view_src
    if src is None or src.buffer is None or src.data is None:
        raise ValueError(f"backend_view_init: the source of {tensor.describe()} is not allocated")
    tensor.buffer = src.buffer
    tensor.data = src.data + tensor.view_offs
    return src.buffer.init_tensor(tensor)


# ---------------------------------------------------------------- tallocr: linear allocation in one buffer

class Tallocr:
    """ggml_tallocr: hands out consecutive aligned addresses of one buffer."""

    __slots__ = ("buffer", "base", "alignment", "offset")

    def __init__(self, buffer, base: int, alignment: int, offset: int):
        self.buffer = buffer
        self.base = base
        self.alignment = alignment
        self.offset = offset

    def __repr__(self):
        return f"<ggml.Tallocr {self.buffer.name} {self.offset}/{self.buffer.size} bytes used>"


def tallocr_new(buffer) -> Tallocr:
    base = buffer.get_base()
    alignment = _check_alignment(buffer.buft.get_alignment(), f"tallocr_new({buffer.name})")
    return Tallocr(buffer, base, alignment, _aligned_offset(base, 0, alignment))


def tallocr_alloc(talloc: Tallocr, tensor: Tensor) -> Status:
    """Place `tensor` at the next aligned address; MemoryError when the buffer is full."""
    buffer = talloc.buffer
    size = round_up(buffer.buft.get_alloc_size(tensor), talloc.alignment)
    if talloc.offset + size > buffer.size:
        raise MemoryError(
            f"tallocr_alloc: not enough space in buffer {buffer.name} ({buffer.size} bytes) for "
            f"{tensor.describe()}: needs {size} bytes, {buffer.size - talloc.offset} available "
            f"at offset {talloc.offset}")
    addr = talloc.base + talloc.offset
    talloc.offset += size
    return backend_tensor_alloc(buffer, tensor, addr)


# ---------------------------------------------------------------- the dynamic allocator (planning only)

MAX_CHUNKS = 16              # upstream GGML_VBUFFER_MAX_CHUNKS
_UNBOUNDED = sys.maxsize // 2  # upstream SIZE_MAX/2: "virtually endless" free space


class _Chunk:
    """One future buffer: free blocks [offset, size] sorted by offset, and the high-water mark."""

    __slots__ = ("blocks", "max_size")

    def __init__(self, size: int):
        self.blocks = [[0, size]]
        self.max_size = 0


class _DynAlloc:
    """ggml_dyn_tallocr: plans offsets (chunk, offset) with best-fit over free blocks.

    The last free block of a chunk is its unbounded tail; it is used only when no other block
    fits, and then in the chunk where the tensor grows the buffer least (or wastes least)."""

    def __init__(self, alignment: int, max_chunk_size: int):
        self.alignment = alignment
        self.max_chunk_size = min(max_chunk_size, _UNBOUNDED)
        self.chunks: list[_Chunk] = []

    def reset(self) -> None:
        self.chunks = []

    def max_size(self, chunk: int) -> int:
        return self.chunks[chunk].max_size if chunk < len(self.chunks) else 0

    def _new_chunk(self, min_size: int) -> int:
        if len(self.chunks) >= MAX_CHUNKS:
            return -1
        # a chunk holds max_chunk_size bytes, more if one tensor needs it; the last one is unbounded
        size = _UNBOUNDED if len(self.chunks) == MAX_CHUNKS - 1 else max(min_size, self.max_chunk_size)
        self.chunks.append(_Chunk(size))
        return len(self.chunks) - 1

    def _best_fit(self, size: int) -> tuple[int, int]:
        """(chunk, block) of the smallest free block that fits, last blocks excluded."""
        best_chunk, best_block = -1, -1
        for c, chunk in enumerate(self.chunks):
            best_size = _UNBOUNDED * 2
            blocks = chunk.blocks
            for i in range(len(blocks) - 1):
                block_size = blocks[i][1]
                if size <= block_size <= best_size:
                    best_chunk, best_block, best_size = c, i, block_size
        return best_chunk, best_block

    def _best_tail(self, size: int) -> tuple[int, int]:
        """(chunk, last block) that grows its chunk least, or if none must grow, wastes least."""
        best_chunk, best_block, best_reuse = -1, -1, None
        for c, chunk in enumerate(self.chunks):
            if not chunk.blocks:
                continue
            offset, block_size = chunk.blocks[-1]
            reuse = chunk.max_size - offset - size  # < 0: bytes the chunk grows; > 0: bytes left unused
            better = best_reuse is None or (best_reuse < 0 and reuse > best_reuse) or (0 <= reuse < best_reuse)
            if block_size >= size and better:
                best_chunk, best_block, best_reuse = c, len(chunk.blocks) - 1, reuse
        return best_chunk, best_block

    def alloc(self, size: int, tensor: Tensor) -> tuple[int, int]:
        size = round_up(size, self.alignment)
        c, i = self._best_fit(size)
        if i < 0:
            c, i = self._best_tail(size)
        if i < 0:
            c, i = self._new_chunk(size), 0
        if c < 0:
            raise MemoryError(f"gallocr: no room for {tensor.describe()} ({size} bytes) in {MAX_CHUNKS} chunks")
        chunk = self.chunks[c]
        block = chunk.blocks[i]
        offset = block[0]
        block[0] += size
        block[1] -= size
        if block[1] == 0:
            del chunk.blocks[i]
        chunk.max_size = max(chunk.max_size, offset + size)
        return c, offset

    def free(self, addr: tuple[int, int], size: int) -> None:
        """Return bytes to the free list, merging with the neighbouring blocks."""
        size = round_up(size, self.alignment)
        c, offset = addr
        blocks = self.chunks[c].blocks
        for i, block in enumerate(blocks):
            if block[0] + block[1] == offset:  # right after this block
                block[1] += size
                if i + 1 < len(blocks) and block[0] + block[1] == blocks[i + 1][0]:
                    block[1] += blocks[i + 1][1]
                    del blocks[i + 1]
                return
            if offset + size == block[0]:  # right before this block
                block[0] = offset
                block[1] += size
                if i > 0 and blocks[i - 1][0] + blocks[i - 1][1] == offset:
                    blocks[i - 1][1] += block[1]
                    del blocks[i]
                return
        blocks.insert(bisect.bisect_left(blocks, offset, key=lambda b: b[0]), [offset, size])


# ---------------------------------------------------------------- virtual buffers: one backend buffer per chunk

class _VBuffer:
    """The buffers of one buffer type, one per planned chunk."""

    def __init__(self, buft, dyn: _DynAlloc, usage):
        self.chunks = []
        try:
            for chunk in dyn.chunks:
                # straight to the buffer type: a chunk may exceed max_size when one tensor does
                buffer = buft.alloc_buffer(chunk.max_size)
                buffer.set_usage(usage)
                self.chunks.append(buffer)
        except MemoryError:
            self.free()
            raise

    def chunk_size(self, c: int) -> int:
        return self.chunks[c].size if c < len(self.chunks) else 0

    def size(self) -> int:
        return sum(b.size for b in self.chunks)

    def free(self) -> None:
        for b in self.chunks:
            b.free()
        self.chunks = []

    def reset(self) -> None:
        for b in self.chunks:
            b.reset()

    def tensor_alloc(self, tensor: Tensor, addr: tuple[int, int]) -> None:
        buffer = self.chunks[addr[0]]
        backend_tensor_alloc(buffer, tensor, buffer.get_base() + addr[1])


# ---------------------------------------------------------------- gallocr

class _HashNode:
    """Planning state of one tensor."""

    __slots__ = ("n_children", "n_views", "buffer_id", "addr", "size", "allocated")

    def __init__(self):
        self.n_children = 0    # consumers that have not run yet
        self.n_views = 0       # view nodes of this tensor whose consumers have not all run
        self.buffer_id = 0
        self.addr = (0, 0)     # (chunk, offset)
        self.size = 0          # alloc size in buffer_id's buffer type, once planned
        self.allocated = False  # memory planned here and not yet freed (or handed to a child)


class _TensorAlloc(NamedTuple):
    """The reserved placement of one graph position."""
    buffer_id: int              # -1: pre-allocated, a view, or no tensor at reserve time
    addr: tuple | None          # (chunk, offset)
    size_max: int               # bytes reserved (0 when buffer_id is -1)


_NO_ALLOC = _TensorAlloc(-1, None, 0)


class Gallocr:
    """ggml_gallocr: plans graphs over one dynamic allocator per buffer type."""

    def __init__(self, bufts):
        self.bufts = list(bufts)
        if not self.bufts:
            raise ValueError("gallocr_new_n: at least one buffer type is needed")
        self.allocs: list[_DynAlloc] = []
        for i, buft in enumerate(self.bufts):
            # a buffer type listed twice shares one allocator (and later one buffer)
            shared = next((self.allocs[j] for j in range(i) if self.bufts[j] is buft), None)
            if shared is None:
                alignment = _check_alignment(buft.get_alignment(), f"gallocr: buffer type {buft.get_name()}")
                shared = _DynAlloc(alignment, buft.get_max_size())
            self.allocs.append(shared)
        self.buffers: list[_VBuffer | None] = [None] * len(self.bufts)
        self.node_allocs: list[tuple[_TensorAlloc, tuple[_TensorAlloc, ...]]] = []
        self.leaf_allocs: list[_TensorAlloc] = []

    def __repr__(self):
        sizes = [gallocr_get_buffer_size(self, i) for i in range(len(self.bufts))]
        return f"<ggml.Gallocr {[b.get_name() for b in self.bufts]} sizes={sizes}>"

    def alloc_size(self, buffer_id: int, t: Tensor) -> int:
        return self.bufts[buffer_id].get_alloc_size(t)


class _Planner:
    """One planning run: the hash of tensor states (keyed by id(tensor)) and the rules that
    allocate and free tensors in the gallocr's dynamic allocators."""

    def __init__(self, galloc: Gallocr):
        self.galloc = galloc
        self.nodes: dict[int, _HashNode] = {}

    def get(self, t: Tensor) -> _HashNode:
        hn = self.nodes.get(id(t))
        if hn is None:
            hn = self.nodes[id(t)] = _HashNode()
        return hn

    def is_own(self, t: Tensor) -> bool:
        hn = self.nodes.get(id(t))
        return hn is not None and hn.allocated

    def allocate(self, node: Tensor, buffer_id: int) -> None:
        """Plan memory for `node` unless it has some (data, a buffer, a plan) or is a view."""
        hn = self.get(node)
        if hn.allocated or node.data is not None or node.buffer is not None or node.view_src is not None:
            return
        hn.allocated = True
        if node.op in _INPLACE_OPS:
            parent = self.reusable_parent(node)
            if parent is not None:
                p_hn = self.nodes[id(parent)]
                hn.buffer_id, hn.addr = p_hn.buffer_id, p_hn.addr
                hn.size = self.galloc.alloc_size(hn.buffer_id, node)
                p_hn.allocated = False  # the memory is the node's now: freeing the parent must not free it
                self.free_extra_space(hn, p_hn)
                return
        hn.buffer_id = buffer_id
        hn.size = self.galloc.alloc_size(buffer_id, node)
        hn.addr = self.galloc.allocs[buffer_id].alloc(hn.size, node)

    def reusable_parent(self, node: Tensor) -> Tensor | None:
        """The first source whose memory the node may take over: planned here (so not a view,
        a weight or a user buffer), not an output, the same layout, and this node its last use."""
        for parent in node.src:
            if parent is None or not self.is_own(parent):
                continue
            # upstream also has a branch for view parents; it cannot trigger since views are never own
            if int(parent.flags) & _OUTPUT:
                continue
            if parent.type != node.type or parent.ne != node.ne or parent.nb != node.nb:
                continue
            p_hn = self.nodes[id(parent)]
            if p_hn.n_children == 1 and p_hn.n_views == 0:
                return parent
        return None

    def free_extra_space(self, hn: _HashNode, p_hn: _HashNode) -> None:
        """A node smaller than the parent it reuses gives back the parent's tail."""
        dyn = self.galloc.allocs[p_hn.buffer_id]
        parent_size = round_up(p_hn.size, dyn.alignment)
        node_size = round_up(hn.size, dyn.alignment)
        if parent_size > node_size:
            chunk, offset = p_hn.addr
            dyn.free((chunk, offset + node_size), parent_size - node_size)

    def free(self, t: Tensor) -> None:
        if int(t.flags) & _OUTPUT:  # outputs are never freed, so never overwritten
            return
        hn = self.nodes[id(t)]
        self.galloc.allocs[hn.buffer_id].free(hn.addr, hn.size)
        hn.allocated = False


def _buffer_id(ids, i: int) -> int:
    return ids[i] if ids is not None else 0


# the three planning passes (upstream ggml_gallocr_alloc_graph_impl)

def _allocate_leafs(p: _Planner, graph, leaf_ids) -> None:
    """Leafs first: the application may use them even when no node does."""
    for i, leaf in enumerate(graph.leafs):
        p.allocate(leaf, _buffer_id(leaf_ids, i))


def _count_uses(p: _Planner, graph, node_ids) -> None:
    """Count each tensor's consumers and views; allocate INPUT tensors before any node runs, so
    that no node's memory overlaps an input that the application writes before compute."""
    for i, node in enumerate(graph.nodes):
        # a view with op NONE only adds dependencies (the scheduler's trick), it is not a use
        if node.view_src is not None and node.op != Op.NONE:
            p.get(node.view_src).n_views += 1
        if int(node.flags) & _INPUT:
            p.allocate(node, _buffer_id(node_ids, i))
        for src in node.src:
            if src is None:
                continue
            p.get(src).n_children += 1
            if int(src.flags) & _INPUT:
                p.allocate(src, _buffer_id(node_ids, i))


def _allocate_nodes(p: _Planner, graph, node_ids) -> None:
    """Walk the nodes in order: allocate the sources and the node, then free every source (or
    the source of a view) whose last consumer this node was."""
    nodes = p.nodes
    for i, node in enumerate(graph.nodes):
        buffer_id = _buffer_id(node_ids, i)
        srcs = [s for s in node.src if s is not None]
        for parent in srcs:
            p.allocate(parent, buffer_id)
        p.allocate(node, buffer_id)
        for parent in srcs:
            p_hn = nodes[id(parent)]
            p_hn.n_children -= 1
            if p_hn.n_children != 0 or p_hn.n_views != 0:
                continue
            view_src = parent.view_src
            if view_src is not None:
                vs_hn = p.get(view_src)
                vs_hn.n_views -= 1
                if vs_hn.n_views == 0 and vs_hn.n_children == 0 and vs_hn.allocated:
                    p.free(view_src)
            elif p_hn.allocated:
                p.free(parent)


def _check_ids(ids, n: int, n_buffers: int, what: str):
    if ids is None:
        return None
    ids = list(ids)
    if len(ids) != n:
        raise ValueError(f"gallocr_reserve_n: {what} has {len(ids)} entries for {n} tensors")
    for i, b in enumerate(ids):
        if not 0 <= b < n_buffers:
            raise ValueError(f"gallocr_reserve_n: {what}[{i}] = {b} is not a buffer id (0..{n_buffers - 1})")
    return ids


def _reserve_impl(galloc: Gallocr, graph, node_buffer_ids, leaf_buffer_ids, no_alloc: bool) -> bool:
    n = len(galloc.bufts)
    node_ids = _check_ids(node_buffer_ids, len(graph.nodes), n, "node_buffer_ids")
    leaf_ids = _check_ids(leaf_buffer_ids, len(graph.leafs), n, "leaf_buffer_ids")
    for dyn in galloc.allocs:
        dyn.reset()

    p = _Planner(galloc)
    _allocate_leafs(p, graph, leaf_ids)
    _count_uses(p, graph, node_ids)
    _allocate_nodes(p, graph, node_ids)

    plans: dict[int, _TensorAlloc] = {}

    def planned(t: Tensor) -> _TensorAlloc:
        if t is None or t.view_src is not None or t.data is not None:
            return _NO_ALLOC
        ta = plans.get(id(t))
        if ta is None:
            hn = p.nodes[id(t)]
            # (a tensor with a buffer but no data was never planned: its size is computed here)
            ta = plans[id(t)] = _TensorAlloc(hn.buffer_id, hn.addr, hn.size or galloc.alloc_size(hn.buffer_id, t))
        return ta

    galloc.node_allocs = [(planned(node), tuple(planned(s) for s in node.src)) for node in graph.nodes]
    galloc.leaf_allocs = [planned(leaf) for leaf in graph.leafs]
    return _realloc_buffers(galloc, no_alloc)


def _realloc_buffers(galloc: Gallocr, no_alloc: bool) -> bool:
    """(Re)allocate each buffer whose planned chunks outgrew it; smaller plans keep the buffer."""
    from .backend.impl import BufferUsage
    for i, dyn in enumerate(galloc.allocs):
        shared = next((j for j in range(i) if galloc.allocs[j] is dyn), None)
        if shared is not None:
            galloc.buffers[i] = galloc.buffers[shared]
        current = galloc.buffers[i]
        # a buffer is allocated even when empty: views need it to be initialized
        grow = current is None or any(dyn.max_size(c) > current.chunk_size(c) for c in range(len(dyn.chunks)))
        if not grow:
            continue
        new_size = sum(ch.max_size for ch in dyn.chunks)
        if current is not None:
            log.debug("gallocr: reallocating %s buffer from %d to %d bytes",
                      galloc.bufts[i].get_name(), current.size(), new_size)
            current.free()
        galloc.buffers[i] = None
        if not no_alloc:
            try:
                galloc.buffers[i] = _VBuffer(galloc.bufts[i], dyn, BufferUsage.COMPUTE)
            except MemoryError as e:
                log.error("gallocr: failed to allocate %s buffer of %d bytes: %s",
                          galloc.bufts[i].get_name(), new_size, e)
                return False
    return True


# ---------------------------------------------------------------- alloc_graph: addresses by graph position

def _needs_realloc(galloc: Gallocr, graph) -> bool:
    """Whether the graph no longer fits the reservation: other node or leaf counts, or a tensor
    that needs memory where none, or less, was reserved. Also when a buffer is missing (a
    failed reserve), where upstream would crash."""
    if any(buf is None for buf in galloc.buffers):
        log.debug("gallocr: buffers are not allocated")
        return True
    if len(galloc.node_allocs) != len(graph.nodes):
        log.debug("gallocr: graph has a different number of nodes")
        return True
    if len(galloc.leaf_allocs) != len(graph.leafs):
        log.debug("gallocr: graph has a different number of leafs")
        return True
    sizes: dict[tuple[int, int], int] = {}  # sources repeat earlier nodes: size each tensor once

    def fits(t: Tensor, ta: _TensorAlloc) -> bool:
        if t.data is not None or t.view_src is not None:
            return True
        if ta.buffer_id < 0:  # it had memory (or was a view) when reserved, and now needs some
            return False
        key = (id(t), ta.buffer_id)
        size = sizes.get(key)
        if size is None:
            size = sizes[key] = galloc.alloc_size(ta.buffer_id, t)
        return ta.size_max >= size

    for node, (dst, srcs) in zip(graph.nodes, galloc.node_allocs):
        if not fits(node, dst):
            log.debug("gallocr: node %s does not fit its reservation", node.name)
            return True
        for src, ta in zip(node.src, srcs):
            if src is not None and not fits(src, ta):
                log.debug("gallocr: src %s of node %s does not fit its reservation", src.name, node.name)
                return True
    # upstream does not check leafs here (it would assert later); re-planning is the kinder answer
    for leaf, ta in zip(graph.leafs, galloc.leaf_allocs):
        if not fits(leaf, ta):
            log.debug("gallocr: leaf %s does not fit its reservation", leaf.name)
            return True
    return False


def _init_tensor(galloc: Gallocr, t: Tensor, ta: _TensorAlloc) -> None:
    if t.view_src is not None:
        # views take their source's address; sources allocated without ggml-backend stay as they are
        if t.buffer is None and t.view_src.buffer is not None:
            backend_view_init(t)
    elif t.data is None:
        galloc.buffers[ta.buffer_id].tensor_alloc(t, ta.addr)


# ---------------------------------------------------------------- mirrored functions

def gallocr_new_n(bufts) -> Gallocr:
    return Gallocr(bufts)


def gallocr_new(buft) -> Gallocr:
    return Gallocr([buft])


def gallocr_free(galloc: Gallocr | None) -> None:
    if galloc is None:
        return
    freed = set()
    for buf in galloc.buffers:
        if buf is not None and id(buf) not in freed:
            freed.add(id(buf))
            buf.free()
    galloc.buffers = [None] * len(galloc.bufts)
    galloc.node_allocs = []
    galloc.leaf_allocs = []


def gallocr_reserve_n(galloc: Gallocr, graph, node_buffer_ids=None, leaf_buffer_ids=None) -> bool:
    """Plan `graph` (a worst case) and grow the buffers to fit it. node_buffer_ids[i] /
    leaf_buffer_ids[i] choose the buffer (index into the gallocr's buffer types) of node i /
    leaf i (all 0 when None). The graph's tensors are not modified. False when a buffer
    could not be allocated."""
    return _reserve_impl(galloc, graph, node_buffer_ids, leaf_buffer_ids, no_alloc=False)


def gallocr_reserve(galloc: Gallocr, graph) -> bool:
    return gallocr_reserve_n(galloc, graph)


def gallocr_reserve_n_size(galloc: Gallocr, graph, node_buffer_ids=None, leaf_buffer_ids=None) -> list[int]:
    """The buffer sizes gallocr_reserve_n would allocate, one per buffer type (nothing allocated)."""
    _reserve_impl(galloc, graph, node_buffer_ids, leaf_buffer_ids, no_alloc=True)
    return [sum(ch.max_size for ch in dyn.chunks) for dyn in galloc.allocs]


def gallocr_alloc_graph(galloc: Gallocr, graph) -> bool:
    """Give every tensor of `graph` its reserved address (node i and leaf i get what the
    reserved graph's node i and leaf i were planned). A graph that does not fit the reservation
    is re-reserved automatically with a single buffer type; with several, False (call
    gallocr_reserve_n first)."""
    if _needs_realloc(galloc, graph):
        if len(galloc.bufts) != 1:
            log.debug("gallocr: cannot reallocate a multi-buffer graph automatically, call reserve_n")
            return False
        log.debug("gallocr: reallocating buffers automatically")
        if not gallocr_reserve(galloc, graph):
            return False

    for buf in galloc.buffers:
        if buf is not None:
            buf.reset()
    for leaf, ta in zip(graph.leafs, galloc.leaf_allocs):
        _init_tensor(galloc, leaf, ta)
    for node, (dst, srcs) in zip(graph.nodes, galloc.node_allocs):
        for src, ta in zip(node.src, srcs):
            if src is not None:
                _init_tensor(galloc, src, ta)
        _init_tensor(galloc, node, dst)
    return True


def gallocr_get_buffer_size(galloc: Gallocr, buffer_id: int) -> int:
    """Bytes of buffer `buffer_id` (0 when not allocated, or when an earlier id shares it)."""
    if not 0 <= buffer_id < len(galloc.bufts):
        raise IndexError(f"gallocr_get_buffer_size: buffer id {buffer_id} out of range (0..{len(galloc.bufts) - 1})")
    buf = galloc.buffers[buffer_id]
    if buf is None or any(galloc.buffers[j] is buf for j in range(buffer_id)):
        return 0
    return buf.size()


# ---------------------------------------------------------------- context tensors in one buffer

def _ctx_tensors_to_place(ctx) -> list[Tensor]:
    return [t for t in ctx.tensors if t.data is None and t.view_src is None]


def backend_alloc_ctx_tensors_from_buft_size(ctx, buft) -> int:
    """Bytes backend_alloc_ctx_tensors_from_buft would allocate for ctx's unallocated tensors."""
    alignment = buft.get_alignment()
    return sum(round_up(buft.get_alloc_size(t), alignment) for t in _ctx_tensors_to_place(ctx))


def backend_alloc_ctx_tensors_from_buft(ctx, buft):
    """Allocate every unallocated tensor of ctx in one buffer of buft; views get their source's
    address. Returns the buffer, or None when there was nothing to allocate. A buffer type
    that places tensors its own way (the meta device's: slices per device) does it itself."""
    own_way = getattr(buft, "alloc_ctx_tensors", None)
    if own_way is not None:
        return own_way(ctx)
    buffer = backend_alloc_tensors_from_buft(_ctx_tensors_to_place(ctx), buft)
    if buffer is None:
        return None
    for t in ctx.tensors:
        if t.view_src is not None and t.buffer is None:
            backend_view_init(t)
    return buffer


def backend_alloc_tensors_from_buft(tensors, buft):
    """Allocate `tensors` (unallocated, not views) one after the other in one new buffer of buft;
    None when there is nothing to allocate."""
    alignment = buft.get_alignment()
    size = sum(round_up(buft.get_alloc_size(t), alignment) for t in tensors)
    if size == 0:
        return None
    buffer = buft.alloc_buffer(size)
    talloc = tallocr_new(buffer)
    for t in tensors:
        tallocr_alloc(talloc, t)
    return buffer


def backend_alloc_ctx_tensors(ctx, backend):
    return backend_alloc_ctx_tensors_from_buft(ctx, backend.get_default_buffer_type())
