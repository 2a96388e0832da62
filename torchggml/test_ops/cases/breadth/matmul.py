"""Breadth: MUL_MAT (every type, batches, broadcast, permuted operands, strided K views), MUL_MAT_ID
(experts x used x broadcast b x tokens), OUT_PROD (types x batches x broadcast)."""
from __future__ import annotations

import torchggml as ggml
from ..matmul import mul_mat_ref, mul_mat_id_ref, distinct_experts, out_prod_ref
from ..table import NMSE_MUL_MAT
from ..values import ggml_permute
from .common import T, ALL_TYPES, BASE_TYPES, OTHER_TYPES, blck, inits, new_table


def _mul_mat(table, type_a, type_b, m, n, k, bs=(1, 1), nr=(1, 1), per=(0, 1, 2, 3), k_v=0, o=1):
    bs, nr, per = tuple(bs), tuple(nr), tuple(per)
    permuted = per != (0, 1, 2, 3)
    ne_a, ne_b = [k, m, bs[0], bs[1]], [k, n, bs[0] * nr[0], bs[1] * nr[1]]

    def build(ctx):
        if permuted:
            a0 = ggml.new_tensor_4d(ctx, type_a, *[ne_a[p] for p in per])
            b0 = ggml.new_tensor_4d(ctx, type_b, *[ne_b[p] for p in per])
            a, b = ggml.permute(ctx, a0, *per), ggml.permute(ctx, b0, *per)
        else:
            kp = k_v or k
            a0 = a = ggml.new_tensor_4d(ctx, type_a, kp, m, bs[0], bs[1])
            b0 = b = ggml.new_tensor_4d(ctx, type_b, kp, n, bs[0] * nr[0], bs[1] * nr[1])
            if k_v:
                a = ggml.view_4d(ctx, a0, k, m, bs[0], bs[1], a0.nb[1], a0.nb[2], a0.nb[3], 0)
                b = ggml.view_4d(ctx, b0, k, n, *ne_b[2:], b0.nb[1], b0.nb[2], b0.nb[3], 0)
        out = ggml.mul_mat(ctx, a, b)
        for _ in range(1, o):
            out = ggml.add(ctx, out, ggml.mul_mat(ctx, a, b))
        return out, [a0, b0]

    def ref(a, b):
        if permuted:
            a, b = ggml_permute(a, per), ggml_permute(b, per)
        return o * mul_mat_ref(a[..., :k], b[..., :k])
    table.case("mul_mat", f"type_a={type_a.name},type_b={type_b.name},m={m},n={n},k={k},bs={list(bs)},"
               f"nr={list(nr)},per={list(per)},k_v={k_v},o={o}", build, ref, max_nmse=NMSE_MUL_MAT,
               init=inits({0: type_a, 1: type_b}))


def _mul_mat_cases(table):
    for type_a in ALL_TYPES:
        for i in range(1, 10):
            _mul_mat(table, type_a, T.F32, 16, i, 256)
    for type_a in types("Q4_0", "Q8_0", "MXFP4"):
        _mul_mat(table, type_a, T.F32, 2880, 32, 2880)
    for n in (1, 7, 8, 9, 16, 128, 512):
        _mul_mat(table, T.F32, T.F32, 1, n, 2048)
    batches = [((1, 1), (1, 1)), ((1, 1), (2, 1)), ((1, 1), (1, 2)), ((3, 1), (1, 1)), ((3, 1), (2, 1)),
               ((3, 2), (1, 1)), ((3, 2), (2, 1)), ((3, 2), (1, 2)), ((3, 2), (2, 2))]
    perms = ((0, 2, 1, 3), (0, 1, 3, 2), (0, 3, 2, 1))
    for type_a in BASE_TYPES:
        for type_b in (T.F32, T.F16):
            for k in ((256, 4) if blck(type_a) == 1 else (256,)):
                for bs, nr in batches:
                    _mul_mat(table, type_a, type_b, 16, 1, k, bs, nr)
                _mul_mat(table, type_a, type_b, 16, 4, k, (3, 2), (2, 2))
                for bs, nr in batches:
                    _mul_mat(table, type_a, type_b, 16, 16, k, bs, nr)
                for n in (1, 4, 8, 16):
                    for per in perms:
                        if n == 4 and per != (0, 3, 2, 1):
                            continue
                        _mul_mat(table, type_a, type_b, 16, n, k, (2, 3), (1, 1), per)
            for n in (1, 8, 16):
                _mul_mat(table, type_a, type_b, 16, n, 1024, (3, 2))
            _mul_mat(table, type_a, type_b, 16, 8, 256, (1536, 1))
    for n in (1, 8, 16):
        for per in perms:
            _mul_mat(table, T.BF16, T.F32, 16, n, 256, (2, 3), (1, 1), per)
    for type_a in OTHER_TYPES:
        if blck(type_a) != 256:
            _mul_mat(table, type_a, T.F32, 16, 1, blck(type_a))
        _mul_mat(table, type_a, T.F32, 16, 1, 256)
    for m, n, k, bs, nr in ((64, 2, 128, (8, 1), (1, 1)), (83, 2, 128, (8, 1), (4, 1)), (64, 2, 64, (8, 1), (4, 1)),
                            (83, 2, 64, (8, 1), (4, 1)), (64, 45, 128, (8, 1), (4, 1)), (128, 45, 64, (8, 1), (4, 1))):
        _mul_mat(table, T.F16, T.F32, m, n, k, bs, nr)
    _mul_mat(table, T.F16, T.F32, 1056, 1, 193, (1, 1), (4, 1), (0, 2, 1, 3))
    _mul_mat(table, T.F16, T.F32, 1056, 1, 67, (1, 1), (4, 1), (0, 2, 1, 3))
    _mul_mat(table, T.F32, T.F32, 16, 32, 32, k_v=64, o=3)
    _mul_mat(table, T.F32, T.F32, 64, 77, 77, (12, 1))
    _mul_mat(table, T.Q4_0, T.F32, 576, 512, 576)
    _mul_mat(table, T.Q4_0, T.F32, 1, 2048, 8192)
    for type_a in ALL_TYPES:
        _mul_mat(table, type_a, T.F32, 1, 64, 256)
    _mul_mat(table, T.Q8_0, T.F32, 6, 4096, 5120)
    for ta, tb, k, bs in ((T.F16, T.F16, 65, (1, 1)), (T.F16, T.F16, 80, (1, 1)), (T.F16, T.F32, 80, (1, 1)),
                          (T.F32, T.F32, 80, (1, 1)), (T.F16, T.F16, 588, (1, 1)), (T.F16, T.F16, 80, (4, 1))):
        _mul_mat(table, ta, tb, 64, 32, k, bs)
    for bs2 in (1, 3):
        for bs in (1, 2, 4, 8):
            for nr in (1, 4):
                for m in (0, 1):
                    for k in (0, 1):
                        for type in (T.F16, T.BF16, T.F32):
                            _mul_mat(table, type, T.F32, 1056 + m, 1, 128 + k, (bs, bs2), (nr, 1), (0, 2, 1, 3))
                            _mul_mat(table, type, T.F32, 128 + m, 1, 1056 + k, (bs, bs2), (nr, 1), k_v=2 * 1056 + k)


def _mul_mat_id(table, type_a, type_b, n_mats, n_used, b, m, n, k):
    def build(ctx):
        experts = ggml.new_tensor_3d(ctx, type_a, k, m, n_mats)
        ids0 = ids = ggml.new_tensor_2d(ctx, T.I32, n_mats, n)
        if n_used != n_mats:
            ids = ggml.view_2d(ctx, ids0, n_used, n, ids0.nb[1], 0)
        rows = ggml.new_tensor_3d(ctx, type_b, k, 1 if b else n_used, n)
        return ggml.mul_mat_id(ctx, experts, rows, ids), [experts, rows, ids0]
    table.case("mul_mat_id", f"type_a={type_a.name},type_b={type_b.name},n_mats={n_mats},n_used={n_used},b={int(b)},"
               f"m={m},n={n},k={k}", build, lambda e, r, ids: mul_mat_id_ref(e, r, ids[..., :n_used]),
               max_nmse=NMSE_MUL_MAT, init={2: distinct_experts(n_mats), **inits({0: type_a})})


def _mul_mat_id_cases(table):
    for b in (False, True):
        for ta, n_mats, n_used, m, n, k in ((T.F16, 16, 16, 32, 1024, 16), (T.F16, 2, 2, 32, 8192, 64),
                                            (T.F16, 16, 16, 50, 200, 64), (T.BF16, 16, 16, 32, 1024, 16),
                                            (T.BF16, 16, 16, 50, 200, 64)):
            _mul_mat_id(table, ta, T.F32, n_mats, n_used, b, m, n, k)
    _mul_mat_id(table, T.F16, T.F32, 1, 1, False, 8, 16, 1)
    for type_a in types("MXFP4", "Q4_0"):
        _mul_mat_id(table, type_a, T.F32, 32, 2, False, 2880, 32, 2880)
    for type_a in ALL_TYPES:
        _mul_mat_id(table, type_a, T.F32, 4, 2, False, 64, 16, 3 * blck(type_a))
    for type_a in BASE_TYPES:
        for n_mats in (4, 8):
            for n_used in (1, 2, 4):
                for b in (False, True):
                    for n in (1, 4, 5, 17, 32, 129):
                        _mul_mat_id(table, type_a, T.F32, n_mats, n_used, b, 512, n, 256)
    for type_a in OTHER_TYPES:
        for n in (1, 32):
            _mul_mat_id(table, type_a, T.F32, 4, 2, False, 512, n, 256)


def _out_prod(table, type_a, type_b, m, n, k, bs=(1, 1), nr=(1, 1)):
    def build(ctx):
        a = ggml.new_tensor_4d(ctx, type_a, m, k, bs[0], bs[1])
        b = ggml.new_tensor_4d(ctx, type_b, n, k, bs[0] * nr[0], bs[1] * nr[1])
        return ggml.out_prod(ctx, a, b), [a, b]
    table.case("out_prod", f"type_a={type_a.name},type_b={type_b.name},m={m},n={n},k={k},bs={list(bs)},nr={list(nr)}",
               build, out_prod_ref, max_nmse=NMSE_MUL_MAT, init=inits({0: type_a, 1: type_b}))


def _out_prod_cases(table):
    for type_a in BASE_TYPES:
        for type_b in (T.F32, T.F16):
            for n in (1, 16):
                for k in (1, 16):
                    for bs2 in (1, 3):
                        for bs3 in (1, 3):
                            for nr2 in (1, 2):
                                for nr3 in (1, 2):
                                    _out_prod(table, type_a, type_b, 256, n, k, (bs2, bs3), (nr2, nr3))
    for ne2 in (1, 8, 16, 32):
        _out_prod(table, T.F32, T.F32, 256, 16, 16, (ne2, 1))
    for nr2 in (8, 16, 32):
        _out_prod(table, T.F32, T.F32, 256, 16, 16, (1, 1), (nr2, 1))


def types(*names):
    from .common import types_named
    return types_named(*names)


def cases():
    table = new_table()
    _mul_mat_cases(table)
    _mul_mat_id_cases(table)
    _out_prod_cases(table)
    return table
