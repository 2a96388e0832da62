"""Breadth: GET_ROWS, GET_ROWS_BACK, SET_ROWS over every type, batches, views."""
from __future__ import annotations

import torch

import torchggml as ggml
from ..rows import get_rows_ref, set_rows_ref, distinct_rows
from ..values import randint
from .common import T, ALL_TYPES, blck, inits, new_table


def _get_rows(table, type, n, m, r, be1, be2, v):
    def build(ctx):
        a = ggml.new_tensor_4d(ctx, type, n, m, be1, be2)
        rows0 = rows = ggml.new_tensor_3d(ctx, T.I32, r, be1, be2)
        if v:
            rows = ggml.view_3d(ctx, rows0, r // 2, be1, be2, rows0.nb[1], rows0.nb[2], 0)
        return ggml.get_rows(ctx, a, rows), [a, rows0]
    init = {1: randint(0, m), **inits({0: type})}
    if type == T.I32:
        init[0] = randint(-1000, 1000)
    table.case("get_rows", f"type={type.name},n={n},m={m},r={r},be1={be1},be2={be2},v={int(v)}", build,
               lambda a, ids: get_rows_ref(a, ids[..., :r // 2] if v else ids), max_nmse=0.0, init=init)


def _get_rows_back_ref(n_rows):
    def ref(data, ids, grad):
        out = torch.zeros(1, 1, n_rows, grad.shape[-1], dtype=torch.float64)
        flat = grad.reshape(-1, grad.shape[-1])[:ids.numel()]
        out[0, 0].index_add_(0, ids.reshape(-1).long(), flat)
        return out
    return ref


def _get_rows_back(table, type, n, m, r, b, v):
    def build(ctx):
        data = ggml.new_tensor_3d(ctx, type, n, m, b)
        rows0 = rows = ggml.new_tensor_2d(ctx, T.I32, r, b)
        r_used = r
        if v:
            r_used = r // 2
            rows = ggml.view_2d(ctx, rows0, r_used, b, rows0.nb[1], 0)
        grad = ggml.new_tensor_3d(ctx, type, n, r_used, b)
        return ggml.get_rows_back(ctx, grad, rows, data), [data, rows0, grad]
    r_used = r // 2 if v else r
    table.case("get_rows_back", f"type={type.name},n={n},m={m},r={r},b={b},v={int(v)}", build,
               lambda data, ids, grad: _get_rows_back_ref(m)(data, ids[..., :r_used], grad),
               init={1: randint(0, m), **inits({0: type, 2: type})})


def _set_rows(table, src_type, type, idx_type, ne, nr23, r, v):
    ne2, ne3 = ne[2] * nr23[0], ne[3] * nr23[1]
    r_used = r // 2 if v else r

    def build(ctx):
        dst = ggml.new_tensor_4d(ctx, type, ne[0], ne[1], ne2, ne3)
        src0 = src = ggml.new_tensor_4d(ctx, src_type, ne[0], r, ne2, ne3)
        idx0 = idx = ggml.new_tensor_3d(ctx, idx_type, r, ne[2], ne[3])
        if v:
            src = ggml.view_4d(ctx, src0, ne[0], r_used, ne2, ne3, src0.nb[1], src0.nb[2], src0.nb[3], 0)
            idx = ggml.view_3d(ctx, idx0, r_used, ne[2], ne[3], idx0.nb[1], idx0.nb[2], 0)
        return ggml.set_rows(ctx, dst, src, idx), [dst, src0, idx0]
    ref = set_rows_ref(type)
    table.case("set_rows", f"type={type.name},type_src={src_type.name},type_idx={idx_type.name},ne={ne},"
               f"nr23={nr23},r={r},v={int(v)}", build,
               lambda a, b, c: ref(a, b[..., :r_used, :], c[..., :r_used]) if r_used else a,  # v with r=1: none
               max_nmse=0.0 if type in (T.F32, T.F16, T.BF16) else 1e-7,
               init={2: distinct_rows(ne[1]), **inits({0: type})})


def cases():
    table = new_table()
    for type in (T.F32, T.Q4_0):
        _get_rows(table, type, 300 * 256, 5, 4, 1, 2, False)
        _get_rows(table, type, 256, 80000, 70000, 2, 1, False)
        _get_rows(table, type, 256, 5, 4, 700, 100, False)
    _get_rows(table, T.F32, 1, 8, 2, 1, 1, False)
    for type in (*ALL_TYPES, T.I32):
        for b in (1, 7):
            for v in (False, True):
                _get_rows(table, type, max(256, blck(type)), 5, 4, b, 1, v)
    _get_rows_back(table, T.F32, 1, 8, 2, 1, False)
    _get_rows_back(table, T.F32, 1, 70000, 4, 1, False)
    for type in (*ALL_TYPES, T.I32):  # ggml's kernel reads F32 and F16 gradients: the rest unsupported
        for v in (False, True):
            _get_rows_back(table, type, max(256, blck(type)), 5, 4, 1, v)
    _set_rows(table, T.F32, T.F32, T.I64, [1, 8, 1, 3], [1, 1], 2, False)
    _set_rows(table, T.F32, T.F32, T.I32, [1, 8, 1, 3], [1, 1], 2, False)
    _set_rows(table, T.F32, T.Q8_0, T.I32, [256, 5, 1, 3], [1, 1], 1, False)
    for src_type in (T.F16, T.F32):
        for type in ALL_TYPES:
            for b in (1, 7):
                for v in (False, True):
                    _set_rows(table, src_type, type, T.I64, [256, 5, b, 3], [1, 1], 1, v)
                    _set_rows(table, src_type, type, T.I64, [256, 11, 1, b], [2, 3], 7, v)
                    _set_rows(table, src_type, type, T.I64, [3 * blck(type), 3, b, 1], [2, 3], 2, v)
                    if blck(type) == 1:
                        _set_rows(table, src_type, type, T.I64, [31, 3, b, 1], [2, 3], 2, v)
                        _set_rows(table, src_type, type, T.I64, [33, 5, 1, b], [2, 3], 1, v)
    for idx_type in (T.I64, T.I32):
        for v in (False, True):
            _set_rows(table, T.F16, T.F16, idx_type, [1, 8, 1, 3], [1, 1], 2, v)
    return table
