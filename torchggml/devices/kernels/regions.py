"""ACC and SET (into a strided byte view of a copy of a), CUMSUM, DIAG, TRI, FILL."""
from __future__ import annotations

import torch

from ...enums import Op, TriType
from ...tensor import get_op_params_f32
from ...types import is_quantized, type_size
from .table import KernelTable
from .common import view, as_float, write, all_float

KERNELS = KernelTable("regions")


def _plain(node) -> bool:
    return all(not is_quantized(t.type) for t in [node, *node.src] if t is not None)


def _region(node):
    """The node's memory viewed with the source b's shape, strides nb1..nb3 and byte offset
    from op params (nb0 is the element size), as ggml's ACC and SET view it (the builders
    checked that the region lies inside the tensor)."""
    b = node.src[1]
    esize = type_size(node.type)
    nb1, nb2, nb3, offset = (node.op_params[i] for i in range(4))
    flat = view(node).reshape(-1)
    return flat.as_strided(tuple(reversed(b.ne)), (nb3 // esize, nb2 // esize, nb1 // esize, 1),
                           flat.storage_offset() + offset // esize)


def _start_from_a(node) -> None:
    """dst = a unless the node is a's memory (the _inplace builders)."""
    a = node.src[0]
    if node.data != a.data:
        view(node).copy_(view(a))


@KERNELS.register(Op.ACC, supports=lambda n: all_float(n, 2))
def acc(node):
    _start_from_a(node)
    region = _region(node)
    region.copy_(region.float() + as_float(node.src[1]))


@KERNELS.register(Op.SET, supports=_plain)
def set_(node):
    _start_from_a(node)
    _region(node).copy_(view(node.src[1]))


@KERNELS.register(Op.CUMSUM, supports=lambda n: all_float(n, 1))
def cumsum(node):
    write(node, torch.cumsum(as_float(node.src[0]), dim=-1))


@KERNELS.register(Op.DIAG, supports=_plain)
def diag(node):
    """Row [n] -> n x n matrix with the row on its diagonal."""
    view(node).copy_(torch.diag_embed(view(node.src[0])[:, :, 0, :]))


# torch's tril/triu diagonal offset for each TriType: element (row i1, column i0) is kept when
# LOWER: i0 < i1, LOWER_DIAG: i0 <= i1, UPPER: i0 > i1, UPPER_DIAG: i0 >= i1
_TRI = {TriType.LOWER: (torch.tril, -1), TriType.LOWER_DIAG: (torch.tril, 0),
        TriType.UPPER: (torch.triu, 1), TriType.UPPER_DIAG: (torch.triu, 0)}


@KERNELS.register(Op.TRI, supports=lambda n: all_float(n, 1))
def tri(node):
    fn, diagonal = _TRI[TriType(node.op_params[0])]
    view(node).copy_(fn(view(node.src[0]), diagonal))


@KERNELS.register(Op.FILL, supports=lambda n: all_float(n, 1))
def fill(node):
    view(node).fill_(get_op_params_f32(node, 0))
