"""Breadth: CPY (type to type, permuted, transposed, reshaping, strided destinations), CONT, DUP,
REPEAT, REPEAT_BACK, CONCAT, SET."""
from __future__ import annotations

import itertools

import torch

import torchggml as ggml
from ..values import ggml_permute, uniform
from .common import T, ALL_TYPES, blck, inits, stored, new_table, has, view_of_bigger, corner

INT_TYPES = (T.I8, T.I16, T.I32, T.I64)


def _cpy(table, type_src, type_dst, ne_src, ne_dst=None, perm_src=None, perm_dst=None, transpose=False,
         dst_alloc=None):
    def build(ctx):
        src0 = src = ggml.new_tensor(ctx, type_src, list(ne_src))
        if perm_src:
            src = ggml.permute(ctx, src, *perm_src)
        if transpose:
            src = ggml.transpose(ctx, src)
        shape = list(ne_dst) if ne_dst else list(src.ne)
        if dst_alloc:
            buf = ggml.new_tensor(ctx, type_dst, list(dst_alloc))
            dst = ggml.view_4d(ctx, buf, *shape, buf.nb[1], buf.nb[2], buf.nb[3], 0)
        else:
            dst = ggml.new_tensor(ctx, type_dst, shape)
            if perm_dst:
                dst = ggml.permute(ctx, dst, *perm_dst)
        return ggml.cpy(ctx, src, dst), [src0]

    def ref(x):
        if perm_src:
            x = ggml_permute(x, perm_src)
        if transpose:
            x = x.transpose(-1, -2)
        if ne_dst:
            x = x.reshape(tuple(reversed(ne_dst)))
        elif perm_dst:  # the result is the permuted destination: values in order, its shape
            ne = [0] * 4
            for i, ax in enumerate(perm_dst):
                ne[ax] = x.shape[3 - i]
            x = x.reshape(tuple(reversed(ne)))
        if type_src == type_dst:
            return x
        if type_dst in INT_TYPES:
            return x.trunc()  # float to integer: ggml truncates as a C cast
        return stored(type_dst, x)
    init = inits({0: type_src})
    if type_src in INT_TYPES:
        init[0] = lambda t, g: torch.randint(-150, 150, tuple(reversed(t.ne)), generator=g)
    elif type_dst in INT_TYPES:
        init[0] = uniform(-150, 150)
    exact = type_src == type_dst or type_dst in (T.F32, *INT_TYPES) or type_src in INT_TYPES
    table.case("cpy", f"type_src={type_src.name},type_dst={type_dst.name},ne={list(ne_src)}"
               f"{f',ne_dst={list(ne_dst)}' if ne_dst else ''}{f',permute_src={perm_src}' if perm_src else ''}"
               f"{f',permute_dst={perm_dst}' if perm_dst else ''}{',transpose' if transpose else ''}"
               f"{f',dst_alloc={dst_alloc}' if dst_alloc else ''}", build, ref,
               max_nmse=0 if exact else 1e-6, init=init)


def _cpy_cases(table):
    for type in ALL_TYPES:
        nk = blck(type)
        for k in (1, 2, 3):
            _cpy(table, type, type, [k * nk, 2, 3, 4])
            _cpy(table, type, type, [k * nk, 2, 3, 4], perm_src=[0, 2, 1, 3])
            _cpy(table, type, type, [k * nk, 2, 3, 4], perm_src=[0, 3, 1, 2], perm_dst=[0, 2, 1, 3])
    for src in (T.F16, T.BF16, T.F32):
        for dst in ALL_TYPES:
            _cpy(table, src, dst, [256, 4, 4, 4])
            _cpy(table, src, dst, [256, 2, 3, 4], perm_src=[0, 2, 1, 3])
    for src in ALL_TYPES:
        _cpy(table, src, T.F32, [256, 4, 4, 4])
        _cpy(table, src, T.F32, [256, 2, 3, 4], perm_src=[0, 2, 1, 3])
    for src in (T.F16, T.F32):
        for dst in (T.F16, T.F32):
            _cpy(table, src, dst, [256, 2, 3, 4], perm_src=[1, 0, 2, 3])
    _cpy(table, T.F32, T.Q4_0, [96, 1, 1, 1])
    _cpy(table, T.Q4_0, T.F32, [96, 1, 1, 1])
    for pair in ((T.F32, T.I32), (T.I32, T.F32)):
        _cpy(table, *pair, [256, 2, 3, 4])
        _cpy(table, *pair, [256, 2, 3, 4], perm_src=[1, 0, 2, 3])
    for type, ne in ((T.F16, [256, 4, 3, 1]), (T.F32, [256, 4, 3, 1]), (T.F32, [256, 4, 3, 3]),
                     (T.BF16, [256, 4, 3, 1]), (T.F16, [256, 4, 1, 1]), (T.F32, [256, 4, 1, 1]),
                     (T.BF16, [256, 4, 1, 1]), (T.I32, [256, 4, 1, 1])):
        _cpy(table, type, type, ne, transpose=True)
    for type in (T.I32, T.F32):
        _cpy(table, type, type, [256, 1, 4, 1], perm_src=[1, 2, 0, 3])
    _cpy(table, T.F32, T.F32, [2, 2097121, 1, 1], perm_src=[1, 0, 2, 3])
    _cpy(table, T.F32, T.F32, [2, 2, 524281, 1], perm_src=[1, 0, 2, 3])
    for type in (T.F32, T.F16):
        _cpy(table, type, type, [128, 2, 3, 1], ne_dst=[128, 2, 3, 1], dst_alloc=[128, 4, 3, 1])
    dims = (3, 5, 7, 32)
    canonical, backwards = list(dims), [32, 7, 5, 3]
    for type in (T.F32, T.F16):
        for cur in itertools.permutations(dims):
            cur = list(cur)
            if cur != canonical:
                _cpy(table, type, type, cur, ne_dst=canonical)
            if cur != backwards:
                _cpy(table, type, type, cur, ne_dst=backwards)
            if cur[0] == 32 and type == T.F32 and backwards[0] == 32:
                _cpy(table, T.Q4_0, T.Q4_0, cur, ne_dst=backwards)


def _cont(table, type, ne, view_slice=False, perm=None):
    def build(ctx):
        src = ggml.new_tensor(ctx, type, list(ne))
        if perm:
            x = ggml.permute(ctx, src, *perm)
        elif view_slice:
            x = ggml.view_4d(ctx, src, ne[0], 1, ne[2], ne[3], src.nb[1], src.nb[2], src.nb[3], src.nb[0] * (ne[1] - 1))
        else:
            x = ggml.transpose(ctx, src)
        return ggml.cont(ctx, x), [src]

    def ref(x):
        if perm:
            return ggml_permute(x, perm)
        if view_slice:  # ne0 values starting ne1-1 elements into each [ne1, ne0] matrix
            flat = x.reshape(ne[3], ne[2], ne[1] * ne[0])
            return flat[..., ne[1] - 1:ne[1] - 1 + ne[0]].reshape(ne[3], ne[2], 1, ne[0])
        return x.transpose(-1, -2)
    init = {0: lambda t, g: torch.randint(-100, 100, tuple(reversed(t.ne)), generator=g)} if type == T.I32 else {}
    table.case("cont", f"type={type.name},ne={ne}{',view_slice' if view_slice else ''}"
               f"{f',permute={perm}' if perm else ''}", build, ref, max_nmse=0, init=init)


def _dup(table, type, ne=(10, 10, 20, 1), perm=None):
    def build(ctx):
        src = ggml.new_tensor(ctx, type, list(ne))
        return ggml.dup(ctx, ggml.permute(ctx, src, *perm) if perm else src), [src]
    init = {0: lambda t, g: torch.randint(-100, 100, tuple(reversed(t.ne)), generator=g)} if type in INT_TYPES else {}
    table.case("dup", f"type={type.name},ne={list(ne)}{f',permute={perm}' if perm else ''}", build,
               (lambda x: ggml_permute(x, perm)) if perm else (lambda x: x), max_nmse=0, init=init)


def _repeat(table, type, ne, nr):
    def build(ctx):
        src = ggml.new_tensor(ctx, type, list(ne))
        target = ggml.new_tensor(ctx, type, [n * r for n, r in zip(ne, nr)])
        return ggml.repeat(ctx, src, target), [src, target]
    init = {0: lambda t, g: torch.randint(-100, 100, tuple(reversed(t.ne)), generator=g)} if type in INT_TYPES else {}
    table.case("repeat", f"type={type.name},ne={ne},nr={nr}", build, lambda x, _: x.repeat(*reversed(nr)),
               max_nmse=0, init=init)


def _repeat_back(table, ne, nr, v):
    big = [n * r for n, r in zip(ne, nr)]
    used = [b if r == 1 else b // 2 for b, r in zip(big, nr)] if v else big

    def build(ctx):
        src0 = src = ggml.new_tensor(ctx, T.F32, big)
        if v:
            src = ggml.view_4d(ctx, src0, *used, src0.nb[1], src0.nb[2], src0.nb[3], 0)
        target = ggml.new_tensor(ctx, T.F32, list(ne))
        return ggml.repeat_back(ctx, src, target), [src0, target]

    def ref(x, _):
        x = corner(x, used)
        tiles = [u // n for u, n in zip(used, ne)]
        split = x.reshape(tiles[3], ne[3], tiles[2], ne[2], tiles[1], ne[1], tiles[0], ne[0])
        return split.sum((0, 2, 4, 6))
    table.case("repeat_back", f"ne={ne},nr={nr},v={int(v)}", build, ref)


def _concat(table, type, ne_a, ne_b_d, dim, v):
    ne_b = list(ne_a)
    ne_b[dim] = ne_b_d
    mult_a = (2, 4, 3, 1) if v & 1 else (1, 1, 2, 4) if v & 4 else (1, 1, 1, 1)
    mult_b = (3, 2, 4, 1) if v & 2 else (1, 1, 3, 2) if v & 8 else (1, 1, 1, 1)

    def build(ctx):
        ra, a = view_of_bigger(ctx, type, ne_a, mult_a)
        rb, b = view_of_bigger(ctx, type, ne_b, mult_b)
        return ggml.concat(ctx, a, b, dim), [ra, rb]
    init = {i: (lambda t, g: torch.randint(-100, 100, tuple(reversed(t.ne)), generator=g))
            for i in (0, 1)} if type in INT_TYPES else inits({0: type, 1: type})
    table.case("concat", f"type={type.name},ne_a={ne_a},ne_b_d={ne_b_d},dim={dim},v={v}", build,
               lambda a, b: torch.cat([corner(a, ne_a), corner(b, ne_b)], dim=3 - dim), max_nmse=0, init=init)


def _set(table, type, ne, dim, inplace):
    """a with b written over its first half along dim (upstream's test_set)."""
    ne_b = list(ne)
    ne_b[dim] //= 2

    def build(ctx):
        a = ggml.new_tensor(ctx, type, list(ne))
        b = ggml.new_tensor(ctx, type, ne_b)
        offset = a.nb[dim] * (ne[dim] - ne_b[dim])
        fn = ggml.set_inplace if inplace else ggml.set
        x = ggml.scale(ctx, a, 1.0) if inplace and type == T.F32 else a
        return fn(ctx, x, b, a.nb[1], a.nb[2], a.nb[3], offset), [a, b]

    def ref(a, b):
        out = a.clone()
        idx = [slice(None)] * 4
        idx[3 - dim] = slice(ne[dim] - ne_b[dim], ne[dim])
        out[tuple(idx)] = b
        return out
    init = {i: (lambda t, g: torch.randint(-100, 100, tuple(reversed(t.ne)), generator=g))
            for i in (0, 1)} if type in INT_TYPES else {}
    table.case("set", f"type={type.name},ne={ne},dim={dim},inplace={int(inplace)}", build, ref, max_nmse=0, init=init)


def cases():
    table = new_table()
    _cpy_cases(table)
    for type_dst in (T.F32, T.I32, T.F16, T.BF16):
        for view_slice in (True, False):
            for ne in ([2, 1, 1, 1], [2, 1, 3, 5], [2, 3, 5, 7], [1, 4, 4, 1], [1, 8, 17, 1], [10, 10, 10, 1]):
                if view_slice and type_dst in (T.F16, T.BF16):
                    continue
                _cont(table, type_dst, ne, view_slice)
    for type_dst in (T.F32, T.F16):
        for ne in ([10, 10, 10, 1], [33, 5, 7, 1], [64, 3, 65, 1], [2, 3, 5, 7], [1024, 64, 64, 1],
                   [2304, 64, 64, 1], [1000, 33, 65, 1]):
            for perm in ([2, 1, 0, 3], [1, 2, 0, 3], [0, 2, 1, 3]):
                _cont(table, type_dst, ne, perm=perm)
    for type in (T.F32, T.F16, T.I32, T.I16):
        _dup(table, type)
    for type, perm in ((T.F32, [0, 2, 1, 3]), (T.F16, [0, 2, 1, 3]), (T.F32, [1, 0, 2, 3]), (T.F16, [1, 0, 2, 3])):
        _dup(table, type, (10, 10, 5, 1), perm)
    _dup(table, T.I16, (10, 8, 3, 1), [0, 2, 1, 3])
    _dup(table, T.I16, (10, 8, 3, 1), [1, 2, 0, 3])
    for ne3 in (1, 3):
        for type, nr in ((T.F32, [1, 1, 1, 1]), (T.F32, [2, 1, 1, 1]), (T.F32, [1, 2, 1, 1]), (T.F32, [1, 1, 2, 1]),
                         (T.F32, [1, 1, 1, 2]), (T.F16, [2, 1, 1, 1]), (T.I32, [2, 1, 1, 1]), (T.I16, [1, 1, 1, 2]),
                         (T.BF16, [2, 1, 1, 1])):
            _repeat(table, type, [10, 5, 4, ne3], nr)
    for v in (False, True):
        for nr in ([1, 1, 1, 1], [2, 1, 1, 1], [1, 2, 1, 1], [1, 1, 2, 1], [1, 1, 1, 2]):
            _repeat_back(table, [8, 6, 4, 2], nr, v)
    for v in (0, 1, 2, 3):
        for dim in range(4):
            for type in (T.F32, T.F16, T.BF16, T.I8, T.I16, T.I32, T.I64):
                _concat(table, type, [11, 12, 13, 14], 7, dim, v)
    for type in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0):
        for v in (0, 4, 8, 12):
            for dim in range(4):
                _concat(table, type, [128, 12, 13, 14], 256 if dim == 0 else 7, dim, v)
    if has("set"):
        for type in (T.F32, T.I32):
            for dim in (1, 2, 3):
                for inplace in (False, True):
                    _set(table, type, [6, 5, 4, 3], dim, inplace)
    return table
