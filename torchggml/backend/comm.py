"""Collective communication for the meta device: every reg's `comm_init`,
`comm_allreduce_tensor` and `comm_free` proc addresses.

    comm = comm_init(backends, group=None)
    comm_allreduce_tensor(comm, tensors)   # tensors[j] on backends[j]: each becomes the sum
    comm_free(comm)

In one process the sum is a butterfly of asynchronous copies and in-place ADDs on the
backends' own streams (any devices, SIM included): with p the largest power of two <= n,
devices p..n-1 first fold into devices 0..n-p-1, devices 0..p-1 exchange and add in log2(p)
steps, and the folded devices get the result back. With a torch.distributed process group the
local devices are summed that way, then the group all-reduces (gloo on CPU memory, NCCL on
CUDA) and the local devices get the result.
"""
from __future__ import annotations

import torch

from ..enums import Op, TensorFlag
from ..graph import CGraph
from ..tensor import Tensor, nbytes, is_contiguous
from .backend import backend_tensor_copy_async, backend_synchronize
from .event import backend_event_new, backend_event_record, backend_event_wait


class Comm:
    """The backends taking part, a scratch buffer per backend and counters (for reports)."""

    def __init__(self, backends, group=None):
        self.backends = list(backends)
        self.group = group
        self.scratch = [None] * len(self.backends)
        self.events = [backend_event_new(b.get_device()) for b in self.backends]
        self.n_allreduce = 0
        self.bytes_allreduce = 0  # bytes of the tensors reduced (one device's copy each)

    def free(self) -> None:
        for buf in self.scratch:
            if buf is not None:
                buf.free()
        self.scratch = [None] * len(self.backends)


def comm_init(backends, group=None) -> Comm:
    return Comm(backends, group)


def comm_free(comm: Comm | None) -> None:
    if comm is not None:
        comm.free()


def _scratch_like(comm: Comm, k: int, t: Tensor) -> Tensor:
    """A tensor shaped like t in backend k's scratch buffer (grown as needed)."""
    size = nbytes(t)
    buf = comm.scratch[k]
    if buf is None or buf.size < size:
        if buf is not None:
            backend_synchronize(comm.backends[k])  # queued adds may still read the old scratch
            buf.free()
        buf = comm.scratch[k] = comm.backends[k].get_default_buffer_type().alloc_buffer(size)
    tmp = Tensor(None, t.type, list(t.ne), list(t.nb))
    tmp.name = f"comm_tmp#{t.name}"
    tmp.buffer, tmp.data = buf, buf.get_base()
    return tmp


def _after(comm: Comm, waiting: int, other: int) -> None:
    """Work queued next on backend `waiting` starts after the work queued so far on `other`."""
    event = comm.events[other]
    if event is None:
        backend_synchronize(comm.backends[other])
        return
    backend_event_record(event, comm.backends[other])
    backend_event_wait(comm.backends[waiting], event)


def _add_into(comm: Comm, k: int, t: Tensor, other: Tensor) -> None:
    """t += other on backend k, as an in-place ADD node."""
    node = Tensor(None, t.type, list(t.ne), list(t.nb), t.view_src or t, t.view_offs if t.view_src else 0)
    node.op = Op.ADD
    node.src[0], node.src[1] = t, other
    node.flags = int(TensorFlag.COMPUTE)
    node.name = f"allreduce#{t.name}"
    node.buffer, node.data = t.buffer, t.data
    graph = CGraph(1)
    graph.nodes.append(node)
    comm.backends[k].graph_compute(graph)


def _send_add(comm: Comm, tensors, src: int, dst: int) -> None:
    """tensors[dst] += tensors[src] (copy into dst's scratch, then add on dst)."""
    tmp = _scratch_like(comm, dst, tensors[src])
    _after(comm, src, dst)  # dst no longer reads its scratch
    backend_tensor_copy_async(comm.backends[src], comm.backends[dst], tensors[src], tmp)
    _add_into(comm, dst, tensors[dst], tmp)


def _exchange_add(comm: Comm, tensors, a: int, b: int) -> None:
    """Both tensors[a] and tensors[b] become their sum."""
    tmp_a, tmp_b = _scratch_like(comm, a, tensors[b]), _scratch_like(comm, b, tensors[a])
    _after(comm, a, b)
    _after(comm, b, a)
    backend_tensor_copy_async(comm.backends[a], comm.backends[b], tensors[a], tmp_b)
    backend_tensor_copy_async(comm.backends[b], comm.backends[a], tensors[b], tmp_a)
    _add_into(comm, a, tensors[a], tmp_a)
    _add_into(comm, b, tensors[b], tmp_b)


def butterfly_allreduce(comm: Comm, tensors) -> None:
    n = len(tensors)
    p = 1 << (n.bit_length() - 1)
    for j in range(p, n):
        _send_add(comm, tensors, j, j - p)
    step = 1
    while step < p:
        for a in range(p):
            b = a ^ step
            if a < b:
                _exchange_add(comm, tensors, a, b)
        step *= 2
    for j in range(p, n):
        _after(comm, j - p, j)
        backend_tensor_copy_async(comm.backends[j - p], comm.backends[j], tensors[j - p], tensors[j])


def comm_allreduce_tensor(comm: Comm, tensors) -> bool:
    """Every tensors[j] (on comm.backends[j]) becomes the sum of all of them, across the
    process group too when the comm has one. True when done."""
    tensors = list(tensors)
    if len(tensors) != len(comm.backends):
        raise ValueError(f"comm_allreduce_tensor: {len(tensors)} tensors for {len(comm.backends)} backends")
    for t in tensors:
        if not is_contiguous(t) or t.type.name != "F32":
            raise ValueError(f"comm_allreduce_tensor: {t.describe()} must be contiguous F32")
    comm.n_allreduce += 1
    comm.bytes_allreduce += nbytes(tensors[0])
    if len(tensors) > 1:
        butterfly_allreduce(comm, tensors)
    if comm.group is not None:
        _group_allreduce(comm, tensors)
    return True


def _group_allreduce(comm: Comm, tensors) -> None:
    import torch.distributed as dist
    from ..storage import tensor_view
    backend_synchronize(comm.backends[0])
    view = tensor_view(tensors[0])
    flat = view.reshape(-1) if view.is_contiguous() else view.contiguous().reshape(-1)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=comm.group)
    if flat.data_ptr() != view.data_ptr():
        view.copy_(flat.view_as(view))
    for j in range(1, len(tensors)):
        backend_synchronize(comm.backends[j])
        tensor_view(tensors[j]).copy_(view)


def group_sum_bytes(data: torch.Tensor, group) -> None:
    """Sum a uint8 CPU tensor over the group in place (each byte has one non-zero contributor)."""
    import torch.distributed as dist
    dist.all_reduce(data, op=dist.ReduceOp.SUM, group=group)
