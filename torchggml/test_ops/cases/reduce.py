"""Cases: SUM, SUM_ROWS, MEAN, ARGMAX (first maximum on ties), COUNT_EQUAL, ARGSORT (both orders,
distinct values), TOP_K (largest first)."""
from __future__ import annotations

import torch

import torchggml as ggml
from .values import T, FLOAT_TYPES, randint, distinct, rounded, ggml_permute
from .table import CaseTable

CASES = CaseTable()
case = CASES.case

_SHAPE = [33, 5, 3, 2]


def _reduction_cases(name, ref, out_type_of):
    fn = getattr(ggml, name)
    for type in FLOAT_TYPES:
        def build(ctx, type=type):
            a = ggml.new_tensor(ctx, type, _SHAPE)
            return fn(ctx, a), [a]
        case(name, f"type={type.name}", build, lambda a, type=type: rounded(out_type_of(type), ref(a)))

    def build_permuted(ctx):
        a = ggml.new_tensor(ctx, T.F32, _SHAPE)
        return fn(ctx, ggml.permute(ctx, a, 1, 2, 0, 3)), [a]
    case(name, "permuted", build_permuted, lambda a: ref(ggml_permute(a, (1, 2, 0, 3))))


_reduction_cases("sum", lambda a: a.sum(), lambda type: type)
_reduction_cases("sum_rows", lambda a: a.sum(-1, keepdim=True), lambda type: type)
_reduction_cases("mean", lambda a: a.mean(-1, keepdim=True), lambda type: T.F32)


# ---------------------------------------------------------------- ARGMAX

def _first_argmax(a):
    """The first index of each row's maximum, without relying on torch's tie rule."""
    row = a[0, 0]
    idx = torch.arange(row.shape[-1]).expand_as(row)
    return torch.where(row == row.max(-1, keepdim=True).values, idx, row.shape[-1]).min(-1).values


# a few levels only: most rows hold their maximum more than once
_TIES = {0: lambda t, gen: torch.randint(0, 4, tuple(reversed(t.ne)), generator=gen).double() / 4}

for _type in (T.F32, T.F16):
    for _ne0, _ne1 in [(37, 8), (256, 3), (1, 4)]:
        def _build_argmax(ctx, type=_type, ne0=_ne0, ne1=_ne1):
            a = ggml.new_tensor_2d(ctx, type, ne0, ne1)
            return ggml.argmax(ctx, a), [a]
        case("argmax", f"type={_type.name},ne=[{_ne0},{_ne1}]", _build_argmax, _first_argmax, max_nmse=0)


def _build_argmax_ties(ctx):
    a = ggml.new_tensor_2d(ctx, T.F32, 16, 12)
    return ggml.argmax(ctx, a), [a]


case("argmax", "ties", _build_argmax_ties, _first_argmax, max_nmse=0, init=_TIES)


# ---------------------------------------------------------------- COUNT_EQUAL

for _type in (T.I32, T.F32, T.F16):
    def _build_count_equal(ctx, type=_type):
        a = ggml.new_tensor_3d(ctx, type, 20, 5, 3)
        b = ggml.new_tensor_3d(ctx, type, 20, 5, 3)
        return ggml.count_equal(ctx, a, b), [a, b]
    case("count_equal", f"type={_type.name}", _build_count_equal, lambda a, b: (a == b).sum(),
         max_nmse=0, init={0: randint(0, 3), 1: randint(0, 3)})


def _build_count_equal_transposed(ctx):
    a = ggml.new_tensor_2d(ctx, T.I32, 6, 9)
    b = ggml.new_tensor_2d(ctx, T.I32, 9, 6)
    return ggml.count_equal(ctx, ggml.transpose(ctx, a), b), [a, b]


case("count_equal", "transposed a", _build_count_equal_transposed,
     lambda a, b: (a.transpose(-1, -2) == b).sum(), max_nmse=0, init={0: randint(0, 3), 1: randint(0, 3)})


# ---------------------------------------------------------------- ARGSORT, TOP_K (distinct values)

for _order in (ggml.SortOrder.ASC, ggml.SortOrder.DESC):
    for _type, _ne in [(T.F32, [16, 5, 3]), (T.F32, [37, 4, 1]), (T.F32, [1000, 2, 1]), (T.F16, [24, 6, 2])]:
        def _build_argsort(ctx, order=_order, type=_type, ne=_ne):
            a = ggml.new_tensor(ctx, type, ne)
            return ggml.argsort(ctx, a, order), [a]
        case("argsort", f"order={_order.name},type={_type.name},ne={_ne}", _build_argsort,
             lambda a, order=_order: torch.argsort(a, dim=-1, descending=order == ggml.SortOrder.DESC),
             max_nmse=0, init={0: distinct})


def _build_argsort_transposed(ctx):
    a = ggml.new_tensor_2d(ctx, T.F32, 7, 20)
    return ggml.argsort(ctx, ggml.transpose(ctx, a), ggml.SortOrder.ASC), [a]


case("argsort", "transposed", _build_argsort_transposed, lambda a: torch.argsort(a.transpose(-1, -2), dim=-1),
     max_nmse=0, init={0: distinct})

# top_k: ggml promises the k indices in no order; torchggml's kernel writes them largest first,
# which the reference (torch.topk, sorted) checks exactly
for _k, _ne in [(1, [16, 5, 3]), (4, [16, 5, 3]), (16, [16, 5, 1]), (10, [100, 3, 1]), (3, [37, 2, 2])]:
    def _build_top_k(ctx, k=_k, ne=_ne):
        a = ggml.new_tensor(ctx, T.F32, ne)
        return ggml.top_k(ctx, a, k), [a]
    case("top_k", f"k={_k},ne={_ne}", _build_top_k, lambda a, k=_k: torch.topk(a, k, dim=-1).indices,
         max_nmse=0, init={0: distinct})


def _build_argsort_top_k(ctx):
    a = ggml.new_tensor_2d(ctx, T.F32, 20, 4)
    return ggml.cont(ctx, ggml.argsort_top_k(ctx, a, 5)), [a]


case("top_k", "argsort_top_k view", _build_argsort_top_k, lambda a: torch.topk(a, 5, dim=-1).indices,
     max_nmse=0, init={0: distinct})
