"""Breadth: NORM, RMS_NORM, L2_NORM, RMS_NORM_BACK, GROUP_NORM; ARGSORT, TOP_K, SUM, SUM_ROWS,
MEAN, ARGMAX, COUNT_EQUAL; PAD, ARANGE, DIAG_MASK_INF."""
from __future__ import annotations

import torch

import torchggml as ggml
from ..norm import norm_ref, rms_norm_ref, l2_norm_ref, group_norm_ref
from ..values import distinct, ggml_permute
from .common import T, new_table

S = ggml.SortOrder


def _row_norm(table, name, ne, v, eps, noncontig=False, inplace=False):
    fn = getattr(ggml, name + ("_inplace" if inplace else ""))
    ref = {"norm": norm_ref, "rms_norm": rms_norm_ref, "l2_norm": l2_norm_ref}[name]

    def build(ctx):
        root = ggml.new_tensor(ctx, T.F32, [ne[1], ne[0], ne[2], ne[3]] if noncontig else list(ne))
        a = ggml.permute(ctx, root, 1, 0, 2, 3) if noncontig else root
        if v:
            a = ggml.view_4d(ctx, a, a.ne[0] // 2, a.ne[1] // 2, a.ne[2] // 2, a.ne[3] // 2, a.nb[1], a.nb[2], a.nb[3], 0)
        if inplace:
            a = ggml.scale(ctx, a, 1.0)
        return fn(ctx, a, eps), [root]

    def expected(x):
        if noncontig:
            x = x.transpose(-1, -2)
        if v:
            x = x[:ne[3] // 2, :ne[2] // 2, :ne[1] // 2, :ne[0] // 2]
        return ref(x, eps)
    table.case(name, f"ne={list(ne)},v={int(v)},eps={eps}{',noncontig_rows' if noncontig else ''}"
               f"{',inplace' if inplace else ''}", build, expected)


def _rms_norm_back(table, ne, eps):
    def build(ctx):
        a, b = ggml.new_tensor(ctx, T.F32, list(ne)), ggml.new_tensor(ctx, T.F32, list(ne))
        return ggml.rms_norm_back(ctx, a, b, eps), [a, b]

    def ref(dy, x):
        mean_eps = (x * x).mean(-1, keepdim=True) + eps
        return (dy - x * (x * dy).sum(-1, keepdim=True) / (x.shape[-1] * mean_eps)) / torch.sqrt(mean_eps)
    table.case("rms_norm_back", f"ne={list(ne)},eps={eps}", build, ref)


def _norm_cases(table):
    for eps in (0.0, 1e-6, 1e-4, 1e-1, 10.0):
        for n in (64, 1025):
            for v in (False, True):
                _row_norm(table, "norm", (n, 5, 4, 3), v, eps)
                _row_norm(table, "rms_norm", (n, 5, 4, 3), v, eps)
            _row_norm(table, "norm", (n, 5, 4, 3), False, eps, noncontig=True)
            _rms_norm_back(table, (n, 5, 4, 3), eps)
            _row_norm(table, "l2_norm", (n, 5, 4, 3), False, max(eps, 1e-12))
            _row_norm(table, "l2_norm", (n, 5, 4, 3), True, max(eps, 1e-12))
            _row_norm(table, "l2_norm", (n, 5, 4, 3), False, max(eps, 1e-12), noncontig=True)
        for n in (33, 132, 260):
            for v in (False, True):
                _row_norm(table, "norm", (n, 5, 4, 3), v, eps)
                _row_norm(table, "rms_norm", (n, 5, 4, 3), v, eps)
    _row_norm(table, "rms_norm", (64, 5, 4, 3), False, 1e-6, inplace=True)
    for ne in ((64, 64, 320, 1), (9, 9, 1280, 1)):
        def build(ctx, ne=ne):
            a = ggml.new_tensor(ctx, T.F32, list(ne))
            return ggml.group_norm(ctx, a, 32, 1e-6), [a]
        table.case("group_norm", f"ne={list(ne)},num_groups=32", build, lambda x: group_norm_ref(x, 32, 1e-6))


def _argsort(table, ne, order):
    def build(ctx):
        a = ggml.new_tensor(ctx, T.F32, list(ne))
        return ggml.argsort(ctx, a, order), [a]
    table.case("argsort", f"ne={list(ne)},order={order.name}", build,
               lambda a: torch.argsort(a, dim=-1, descending=order == S.DESC), max_nmse=0, init={0: distinct})


def _top_k(table, ne, k, ties=False):
    """With ties (values from 4 levels) any k indices of the largest values are right: the case
    outputs the values at the indices (get_rows over one-value rows), compared with torch.topk's."""
    def build(ctx):
        a = ggml.new_tensor(ctx, T.F32, list(ne))
        idx = ggml.top_k(ctx, a, k)
        if not ties:
            return idx, [a]
        n_rows = ne[1] * ne[2] * ne[3]
        values = ggml.get_rows(ctx, ggml.reshape_3d(ctx, a, 1, ne[0], n_rows), ggml.reshape_2d(ctx, idx, k, n_rows))
        return ggml.reshape_4d(ctx, values, k, ne[1], ne[2], ne[3]), [a]
    if ties:
        init = {0: lambda t, g: torch.randint(0, 4, tuple(reversed(t.ne)), generator=g).double()}
        ref = lambda a: torch.topk(a, k, dim=-1).values
    else:
        init, ref = {0: distinct}, lambda a: torch.topk(a, k, dim=-1).indices
    table.case("top_k", f"ne={list(ne)},k={k},ties={int(ties)}", build, ref, max_nmse=0, init=init)


def _reduce(table, name, ne, fn, ref, desc=""):
    def build(ctx):
        a = ggml.new_tensor(ctx, T.F32, list(ne))
        return fn(ctx, a), [a]
    table.case(name, f"ne={list(ne)}{desc}", build, ref)


def _reduce_cases(table):
    for order in (S.ASC, S.DESC):
        i = 4
        while i <= 1024 * 1024:
            _argsort(table, (i - 1, 1, 1, 1), S.ASC)
            _argsort(table, (i, 1, 1, 1), S.ASC)
            i *= 2
        for ne in ((16, 10, 10, 10), (60, 10, 10, 10), (1023, 2, 1, 3), (1024, 2, 1, 3), (1025, 2, 1, 3),
                   (1025, 256, 1, 1), (2047, 2, 1, 3), (2048, 2, 1, 3), (2049, 2, 1, 3), (2, 8, 8192, 1),
                   (2048, 512, 1, 1)):
            _argsort(table, ne, order)
    for n in range(1, 5):
        for k in range(1, n + 1):
            _top_k(table, (n, 2, 1, 3), k, ties=True)
    for i in range(20):
        for k in (1, 2, 3, 7, 15, 100, 500, 1023, 9999):
            if k <= 1 << i:
                _top_k(table, (1 << i, 1, 1, 1), k)
                _top_k(table, ((1 << i) + 11, 1, 2, 1), k)
                _top_k(table, ((1 << i) + 11, 1, 2, 1), k, ties=True)
    for k in (1, 2, 3, 7, 15):
        for ne in ((16, 10, 10, 10), (60, 10, 10, 10), (1023, 2, 1, 3), (1024, 2, 1, 3), (1025, 2, 1, 3),
                   (16384, 1, 1, 1), (2047, 2, 1, 3), (2048, 2, 1, 3), (2049, 2, 1, 3)):
            _top_k(table, ne, k)
    total = lambda a: a.sum().reshape(1, 1, 1, 1)
    _reduce(table, "sum", (10, 5, 4, 3), ggml.sum, total)
    for perm in ((0, 2, 1, 3), (0, 3, 2, 1), (0, 1, 3, 2)):
        _reduce(table, "sum", (11, 5, 6, 3), lambda ctx, a, p=perm: ggml.sum(ctx, ggml.permute(ctx, a, *p)), total,
                f",permute={list(perm)}")
    for ne in ((33, 1, 1, 1), (33, 1024, 1, 1), (33, 256, 1, 1)):
        _reduce(table, "sum", ne, ggml.sum, total)
    _reduce(table, "sum", (33, 256, 1, 1), lambda ctx, a: ggml.sum(ctx, ggml.permute(ctx, a, 1, 0, 2, 3)), total,
            ",permute=[1, 0, 2, 3]")
    for ne in ((10, 5, 4, 3), (33, 1, 1, 1), (33, 256, 1, 1), (32769, 1, 1, 1), (32, 1, 1, 1), (32, 256, 1, 1),
               (32768, 1, 1, 1)):
        _reduce(table, "mean", ne, ggml.mean, lambda a: a.mean(-1, keepdim=True))
    rows = lambda a: a.sum(-1, keepdim=True)
    _reduce(table, "sum_rows", (10, 5, 4, 3), ggml.sum_rows, rows)
    for ne in ((11, 5, 6, 3), (16, 5, 6, 3)):
        for permute, slice_ in ((True, False), (False, True), (True, True)):
            def fn(ctx, a, ne=ne, permute=permute, slice_=slice_):
                if slice_:
                    a = ggml.view_4d(ctx, a, ne[0], ne[1], ne[2] // 2, ne[3] - 1, a.nb[1], a.nb[2] * 2, a.nb[3], a.nb[3])
                if permute:
                    a = ggml.permute(ctx, a, 0, 2, 3, 1)
                return ggml.sum_rows(ctx, a)

            def ref(a, ne=ne, permute=permute, slice_=slice_):
                if slice_:
                    a = a[1:, 0:2 * (ne[2] // 2):2]
                if permute:
                    a = ggml_permute(a, (0, 2, 3, 1))
                return a.sum(-1, keepdim=True)
            _reduce(table, "sum_rows", ne, fn, ref, f",permute={int(permute)},slice={int(slice_)}")
    for ne in ((33, 1, 1, 1), (33, 1024, 1, 1), (33, 256, 1, 1)):
        _reduce(table, "sum_rows", ne, ggml.sum_rows, rows)
    for ne in ((32, 1, 1, 1), (32, 513, 1, 1), (100, 10, 1, 1), (1024, 10, 1, 1), (1024, 12, 1, 1), (2000, 10, 1, 1),
               (5438, 3, 1, 1)):
        def build(ctx, ne=ne):
            a = ggml.new_tensor(ctx, T.F32, list(ne))
            return ggml.argmax(ctx, a), [a]
        table.case("argmax", f"ne={list(ne)}", build, lambda a: a.argmax(-1).reshape(1, 1, 1, -1), max_nmse=0,
                   init={0: distinct})
    for ne in ((4, 500, 1, 1), (4, 5000, 1, 1)):
        def build(ctx, ne=ne):
            a, b = ggml.new_tensor(ctx, T.F32, list(ne)), ggml.new_tensor(ctx, T.F32, list(ne))
            return ggml.count_equal(ctx, ggml.argmax(ctx, a), ggml.argmax(ctx, b)), [a, b]
        table.case("count_equal", f"ne={list(ne)}", build,
                   lambda a, b: (a.argmax(-1) == b.argmax(-1)).sum().reshape(1, 1, 1, 1), max_nmse=0)


def _misc_cases(table):
    for ne, p0, p1 in (((512, 512, 1, 1), 1, 1), ((1024, 1, 1, 1), 1, 0), ((1024, 2, 1, 1), 1, 0),
                       ((1024, 16, 1, 1), 0, 1), ((1023, 1, 1, 1), 1, 0), ((1023, 8, 1, 1), 1, 0),
                       ((1025, 1, 1, 1), 1, 0), ((1025, 8, 1, 1), 1, 0), ((2048, 1, 1, 1), 1, 0),
                       ((2048, 4, 1, 1), 1, 0), ((2049, 1, 1, 1), 1, 0), ((100, 1, 1, 1), 100, 0),
                       ((100, 1, 1, 1), 0, 100), ((100, 100, 1, 1), 50, 50)):
        def build(ctx, ne=ne, p0=p0, p1=p1):
            a = ggml.new_tensor(ctx, T.F32, list(ne))
            return ggml.pad(ctx, a, p0, p1, 0, 0), [a]
        table.case("pad", f"ne={list(ne)},pad_0={p0},pad_1={p1}", build,
                   lambda a, p0=p0, p1=p1: torch.nn.functional.pad(a, (0, p0, 0, p1)), max_nmse=0)
    for start, stop, step in ((0.0, 10.0, 1.0), (0.0, 1048576.0, 1.0)):
        def build(ctx, start=start, stop=stop, step=step):
            return ggml.arange(ctx, start, stop, step), []
        table.case("arange", f"start={start},stop={stop},step={step}", build,
                   lambda start=start, stop=stop, step=step: torch.arange(start, stop, step, dtype=torch.float64),
                   max_nmse=0)
    for ne in ((10, 10, 1, 1), (10, 10, 3, 1), (10, 10, 3, 2)):
        def build(ctx, ne=ne):
            a = ggml.new_tensor(ctx, T.F32, list(ne))
            return ggml.diag_mask_inf(ctx, a, 5), [a]

        def ref(a):
            i = torch.arange(a.shape[-2]).view(-1, 1)
            j = torch.arange(a.shape[-1]).view(1, -1)
            return a.masked_fill(j > i + 5, float("-inf"))
        table.case("diag_mask_inf", f"ne={list(ne)},n_past=5", build, ref, max_nmse=0)


def cases():
    table = new_table()
    _norm_cases(table)
    _reduce_cases(table)
    _misc_cases(table)
    return table
