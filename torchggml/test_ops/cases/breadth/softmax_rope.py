"""Breadth: SOFT_MAX (masks and their precision, broadcast, sinks, ALiBi, scale, in place, long
rows), SOFT_MAX_BACK, ROPE and ROPE_BACK (every mode, YaRN, attention factor, frequency factors,
views, in place, rotation offsets)."""
from __future__ import annotations

import torch

import torchggml as ggml
from ..attention import soft_max_ref
from ..rope import rope_ref
from ..table import NMSE_SOFT_MAX
from ..values import uniform, randint, rounded
from .common import T, new_table

R = ggml.RopeType


def _soft_max(table, ne, mask, sinks, m_prec, nr23, scale, max_bias, inplace=False):
    ne_a = [ne[0], ne[1], ne[2] * nr23[0], ne[3] * nr23[1]]

    def build(ctx):
        a = ggml.new_tensor(ctx, T.F32, ne_a)
        inputs = [a]
        m = None
        if mask:
            m = ggml.new_tensor(ctx, m_prec, list(ne))
            inputs.append(m)
        x = ggml.scale(ctx, a, 1.0) if inplace else a
        out = (ggml.soft_max_ext_inplace if inplace else ggml.soft_max_ext)(ctx, x, m, scale, max_bias)
        if sinks:
            s = ggml.new_tensor_1d(ctx, T.F32, ne_a[2])
            ggml.soft_max_add_sinks(out, s)
            inputs.append(s)
        return out, inputs

    def ref(a, *rest):
        rest = list(rest)
        m = rest.pop(0) if mask else None
        s = rest.pop(0) if sinks else None
        return soft_max_ref(a, m, s, scale, max_bias)
    init = {1 + mask: uniform(-4.0, 4.0)} if sinks else {}
    table.case("soft_max", f"ne={list(ne)},mask={int(mask)},sinks={int(sinks)},m_prec={m_prec.name},nr23={list(nr23)},"
               f"scale={scale},max_bias={max_bias},inplace={int(inplace)}", build, ref, max_nmse=NMSE_SOFT_MAX, init=init)


def _soft_max_cases(table):
    for mask in (False, True):
        for sinks in (False, True):
            for max_bias in (0.0, 8.0):
                if not mask and max_bias > 0:
                    continue
                for scale in (1.0, 0.1):
                    for ne0 in (16, 1024):
                        for ne1 in (16, 1024):
                            if mask:
                                for mp in (T.F32, T.F16):
                                    _soft_max(table, (ne0, ne1, 1, 1), mask, sinks, mp, (1, 1), scale, max_bias)
                                    _soft_max(table, (ne0 - 1, ne1 - 1, 1, 1), mask, sinks, mp, (1, 1), scale, max_bias)
                                    if ne0 <= 32 and ne1 <= 32:
                                        _soft_max(table, (ne0, ne1, 1, 3), mask, sinks, mp, (3, 1), scale, max_bias)
                                        _soft_max(table, (ne0 - 1, ne1 - 1, 1, 1), mask, sinks, mp, (2, 3), scale,
                                                  max_bias)
                            else:
                                _soft_max(table, (ne0, ne1, 1, 1), mask, sinks, T.F32, (1, 1), scale, max_bias)
                                _soft_max(table, (ne0 - 1, ne1 - 1, 1, 1), mask, sinks, T.F32, (1, 1), scale, max_bias)
            for mp in (T.F32, T.F16):
                _soft_max(table, (16, 2, 32, 1), mask, sinks, mp, (1, 1), 0.1, 0.0, inplace=True)
    for ne, mask, sinks, mp, mb in (((16, 2, 32, 1), True, True, T.F32, 0.0), ((16, 2, 32, 1), True, False, T.F16, 0.0),
                                    ((16, 2, 32, 1), False, True, T.F32, 0.0), ((32, 2, 32, 1), True, True, T.F32, 0.0),
                                    ((32, 2, 32, 1), True, False, T.F16, 0.0), ((32, 2, 32, 1), True, True, T.F32, 8.0),
                                    ((32, 2, 32, 1), True, True, T.F16, 8.0), ((200001, 2, 3, 1), True, True, T.F32, 8.0),
                                    ((200001, 2, 3, 1), True, True, T.F16, 8.0)):
        _soft_max(table, ne, mask, sinks, mp, (1, 1), 0.1, mb)
    for ne in ((200000, 1, 1, 1), (200000, 4, 1, 1), (643251, 3, 1, 1)):
        _soft_max(table, ne, False, False, T.F32, (1, 1), 1.0, 0.0)


def _soft_max_back(table, ne, scale, max_bias):
    def build(ctx):
        dy, y = ggml.new_tensor(ctx, T.F32, list(ne)), ggml.new_tensor(ctx, T.F32, list(ne))
        return ggml.soft_max_ext_back(ctx, dy, y, scale, max_bias), [dy, y]
    table.case("soft_max_back", f"ne={list(ne)},scale={scale},max_bias={max_bias}", build,
               lambda dy, y: scale * y * (dy - (y * dy).sum(-1, keepdim=True)), init={0: uniform(-100, 100)})


def _rope(table, type, ne, n_dims, mode, n_ctx, fs, ef, af, ff, v, forward, inplace=False, n_offs=0):
    multi = bool(mode & R.MROPE)
    vision = mode == R.VISION
    n_pos = ne[2] * 4 if multi else ne[2]
    if vision:
        dims, sections = n_dims // 2, [n_dims // 4, n_dims // 4, 0, 0]
    elif multi:
        dims, sections = n_dims, [n_dims // 3, n_dims // 3, n_dims // 3, 0]
    else:
        dims, sections = n_dims, None
    mult = (2, 4, 3, 1) if v & 1 else (2, 1, 1, 1) if v == 2 else (1, 1, 1, 1)
    offset0 = ne[0] if v == 2 else 0  # v == 2: the second half of each row

    def build(ctx):
        root = ggml.new_tensor(ctx, type, [n * m for n, m in zip(ne, mult)])
        a = root if mult == (1, 1, 1, 1) else ggml.view_4d(ctx, root, *ne, root.nb[1], root.nb[2], root.nb[3],
                                                           offset0 * root.nb[0])
        pos = ggml.new_tensor_1d(ctx, T.I32, n_pos)
        freq = ggml.new_tensor_1d(ctx, T.F32, n_dims // 2) if ff else None
        args = (0, 10000.0, fs, ef, af, 1.0, 1.0)
        if multi:
            fn = ggml.rope_multi_inplace if inplace else ggml.rope_multi if forward else ggml.rope_multi_back
            out = fn(ctx, a, pos, freq, dims, sections, mode, *args)
        else:
            fn = ggml.rope_ext_inplace if inplace else ggml.rope_ext if forward else ggml.rope_ext_back
            out = fn(ctx, a, pos, freq, dims, mode, *args)
        if n_offs:
            out = ggml.rope_set_offset(out, n_offs)
        return out, [root, pos] + ([freq] if ff else [])

    def rotate(x, pos, freq):
        return rope_ref(x, pos, freq, dims, mode, sections or (0, 0, 0, 0), n_offs, 0, 10000.0, fs, ef, af, 1.0, 1.0)

    def ref(root, pos, freq=None):
        x = root[:ne[3], :ne[2], :ne[1], offset0:offset0 + ne[0]]
        if forward:
            return rounded(type, rotate(x, pos, freq))
        # the transpose of the rotation: d/dx of sum(rope(x) * dy) (linear, so exact)
        xs = torch.zeros_like(x).requires_grad_(True)
        (grad,) = torch.autograd.grad((rotate(xs, pos, freq) * x).sum(), xs)
        return rounded(type, grad)
    init = {1: randint(0, n_ctx)}
    if ff:
        init[2] = uniform(0.9, 1.1)
    table.case("rope" if forward else "rope_back",
               f"type={type.name},ne={list(ne)},n_dims={n_dims},mode={mode},n_ctx={n_ctx},fs={fs},ef={ef},af={af},"
               f"ff={int(ff)},v={v},inplace={int(inplace)},n_offs={n_offs}", build, ref,
               max_nmse=1e-7 if type == T.F32 else 1e-6, init=init)


SHAPES_FIRST = [([128, 32, 2, 1], 128, R.NORMAL)]
SHAPES_ALL = [([128, 40, 2, 1], 128, R.NORMAL), ([128, 52, 2, 1], 128, R.NORMAL), ([128, 64, 2, 1], 128, R.NORMAL),
              ([16, 16, 8192, 1], 16, R.NORMAL), ([64, 1, 2, 1], 64, R.NEOX), ([64, 71, 2, 1], 64, R.NEOX),
              ([64, 8, 2, 1], 64, R.NEOX), ([80, 32, 2, 1], 20, R.NORMAL), ([80, 32, 2, 1], 32, R.NORMAL),
              ([80, 32, 4, 1], 32, R.NORMAL), ([80, 32, 2, 1], 20, R.NEOX), ([80, 32, 2, 1], 32, R.NEOX),
              ([80, 32, 4, 1], 32, R.NEOX), ([16, 16, 8192, 1], 16, R.NEOX),
              ([128, 12, 2, 1], 128, R.MROPE), ([128, 28, 2, 1], 128, R.MROPE), ([128, 12, 2, 1], 20, R.MROPE),
              ([128, 28, 2, 1], 32, R.MROPE), ([128, 12, 2, 1], 128, 40), ([128, 28, 2, 1], 128, 40),
              ([128, 12, 2, 1], 20, 40), ([128, 28, 2, 1], 32, 40), ([80, 16, 2, 1], 80, R.VISION),
              ([128, 16, 2, 1], 128, 40), ([16, 16, 8192, 1], 16, 40)]
SHAPES_LAST = [([64, 128, 2, 1], 64, R.NEOX)]
MODES = (R.NORMAL, R.NEOX, R.MROPE, 40, R.VISION)  # 40: interleaved M-RoPE (IMROPE)


def _rope_cases(table):
    for forward in (True, False):
        first = True
        for fs in (1.0, 1.4245):
            for ef in (0.0, 0.7465):
                for af in (1.0, 1.4245):
                    for type in (T.F32, T.F16):
                        for ff in (False, True):
                            for v in (0, 1):
                                shapes = SHAPES_FIRST + (SHAPES_ALL if first else []) + SHAPES_LAST
                                for ne, n_dims, mode in shapes:
                                    _rope(table, type, ne, n_dims, mode, 512, fs, ef, af, ff, v, forward)
                            for mode in MODES:
                                _rope(table, type, [36, 16, 2457, 1], 36, mode, 512, fs, ef, af, ff, 2, forward)
                        first = False
    for type in (T.F32, T.F16):
        for mode in MODES:
            for ff in (False, True):
                for ne, v in (([128, 32, 2, 1], 0), ([128, 32, 2, 1], 1), ([128, 32, 2, 3], 1)):
                    _rope(table, type, ne, 128, mode, 512, 1.4245, 0.7465, 1.4245, ff, v, True, inplace=True)
    for type in (T.F32, T.F16):
        for forward in (True, False):
            for ff in (False, True):
                for ne, n_dims, mode in (([128, 32, 2, 1], 32, R.NORMAL), ([128, 32, 2, 1], 32, R.NEOX),
                                         ([128, 12, 2, 1], 24, R.MROPE), ([128, 12, 2, 1], 24, 40)):
                    _rope(table, type, ne, n_dims, mode, 512, 1.4245, 0.7465, 1.4245, ff, 0, forward, n_offs=32)
        _rope(table, type, [128, 32, 2, 1], 32, R.NEOX, 512, 1.4245, 0.7465, 1.4245, False, 0, True, inplace=True,
              n_offs=32)


def cases():
    table = new_table()
    _soft_max_cases(table)
    for max_bias in (0.0, 8.0):
        for scale in (1.0, 0.1):
            for ne0 in (16, 1024):
                for ne1 in (16, 1024):
                    _soft_max_back(table, (ne0, ne1, 1, 1), scale, max_bias)
                    _soft_max_back(table, (ne0 - 1, ne1 - 1, 1, 1), scale, max_bias)
                    _soft_max_back(table, (ne0, ne1, 2, 3), scale, max_bias)
    _rope_cases(table)
    return table
