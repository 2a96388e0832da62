"""Reductions and orderings: SUM, SUM_ROWS, MEAN, ARGMAX, COUNT_EQUAL, ARGSORT, TOP_K."""
from __future__ import annotations

import torch

from ...enums import Op, SortOrder
from ...types import Type
from .table import KernelTable
from .common import view, as_float, write, all_float, is_float

KERNELS = KernelTable("reduce")


def _float_src(node) -> bool:
    return is_float(node.src[0])


@KERNELS.register(Op.SUM, supports=lambda n: all_float(n, 1))
def sum_all(node):
    write(node, as_float(node.src[0]).sum())


@KERNELS.register(Op.SUM_ROWS, supports=lambda n: all_float(n, 1))
def sum_rows(node):
    write(node, as_float(node.src[0]).sum(-1, keepdim=True))


@KERNELS.register(Op.MEAN, supports=lambda n: all_float(n, 1))
def mean(node):
    write(node, as_float(node.src[0]).mean(-1, keepdim=True))


@KERNELS.register(Op.ARGMAX, supports=_float_src)
def argmax(node):
    """The first index of each row's maximum (torch.argmax returns the first on ties)."""
    write(node, as_float(node.src[0])[0, 0].argmax(-1))


def _supports_count_equal(node) -> bool:
    a, b = node.src[0], node.src[1]
    return a.type == b.type and (a.type == Type.I32 or is_float(a)) and node.type == Type.I64


@KERNELS.register(Op.COUNT_EQUAL, supports=_supports_count_equal)
def count_equal(node):
    write(node, (view(node.src[0]) == view(node.src[1])).sum())


@KERNELS.register(Op.ARGSORT, supports=_float_src)
def argsort(node):
    descending = node.op_params[0] == SortOrder.DESC
    # stable: equal values keep index order (ggml promises no order for ties)
    write(node, torch.argsort(as_float(node.src[0]), dim=-1, descending=descending, stable=True))


@KERNELS.register(Op.TOP_K, supports=_float_src)
def top_k(node):
    """Indices of the k = node.ne0 largest values of each row, largest first."""
    values = as_float(node.src[0])
    write(node, torch.topk(values, node.ne[0], dim=-1, largest=True, sorted=True).indices)
