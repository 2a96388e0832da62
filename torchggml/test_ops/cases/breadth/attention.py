"""Breadth: FLASH_ATTN_EXT over head sizes (MLA included), GQA broadcast, KV lengths, batch sizes,
masks, sinks, ALiBi, softcap, precisions, KV types, permuted and viewed K/V (upstream's loops)."""
from __future__ import annotations

import math

import torchggml as ggml
from ..attention import flash_attn_ref, NMSE_ATTENTION
from ..values import uniform, ggml_permute
from .common import T, types_named, blck, inits, new_table

KV_TYPES = types_named("F32", "F16", "BF16", "Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0", "IQ4_NL")
IDENTITY = (0, 1, 2, 3)


def _pad(n, b):
    return (n + b - 1) // b * b


def _fa(table, hsk, hsv, nh, nr23, kv, nb, mask, sinks, max_bias, softcap, prec, type_k, type_v,
        permute=IDENTITY, kv_view=True, v_of_k=False):
    hk, hv = _pad(hsk, blck(type_k)), _pad(hsv, blck(type_v))
    scale = 1.0 / math.sqrt(hsk)
    permute = tuple(permute)

    def stored_ne(ne):
        out = [0] * 4
        for i in range(4):
            out[permute[i]] = ne[i]
        return out

    def create(ctx, type, ne, view):
        sne = stored_ne(ne)
        root = ggml.new_tensor_4d(ctx, type, sne[0], 2 * sne[1] if view else sne[1], sne[2], sne[3])
        t = ggml.view_4d(ctx, root, *sne, root.nb[1], root.nb[2], root.nb[3], 0) if view else root
        return root, (ggml.permute(ctx, t, *permute) if permute != IDENTITY else t)

    def logical(x, ne, view):
        sne = stored_ne(ne)
        if view:
            x = x[:, :, :sne[1], :]
        return ggml_permute(x, permute) if permute != IDENTITY else x

    ne_q, ne_k, ne_v = [hk, nb, nh * nr23[0], nr23[1]], [hk, kv, nh, nr23[1]], [hv, kv, nh, nr23[1]]

    def build(ctx):
        rq, q = create(ctx, T.F32, ne_q, False)
        rk, k = create(ctx, type_k, ne_k, kv_view)
        inputs = [rq, rk]
        if v_of_k:
            v = ggml.view_4d(ctx, k, hv, kv, nh, nr23[1], k.nb[1], k.nb[2], k.nb[3], 0)
        else:
            rv, v = create(ctx, type_v, ne_v, kv_view)
            inputs.append(rv)
        m = None
        if mask:
            m = ggml.new_tensor_4d(ctx, T.F16, kv, nb, 1, nr23[1])
            inputs.append(m)
        out = ggml.flash_attn_ext(ctx, q, k, v, m, scale, max_bias, softcap)
        if sinks:
            s = ggml.new_tensor_1d(ctx, T.F32, nh * nr23[0])
            ggml.flash_attn_ext_add_sinks(out, s)
            inputs.append(s)
        ggml.flash_attn_ext_set_prec(out, prec)
        return out, inputs

    def ref(q, k, *rest):
        rest = list(rest)
        q, k = logical(q, ne_q, False), logical(k, ne_k, kv_view)
        v = k[..., :hv] if v_of_k else logical(rest.pop(0), ne_v, kv_view)
        m = rest.pop(0) if mask else None
        s = rest.pop(0) if sinks else None
        return flash_attn_ref(q, k, v, m, s, scale, max_bias, softcap)

    n_in = 2 + (not v_of_k)
    init = inits({1: type_k, 2: type_v} if not v_of_k else {1: type_k})
    if sinks:
        init[n_in + mask] = uniform(-10.0, 10.0)
    table.case("flash_attn_ext", f"hsk={hsk},hsv={hsv},nh={nh},nr23={list(nr23)},kv={kv},nb={nb},mask={int(mask)},"
               f"sinks={int(sinks)},max_bias={max_bias},logit_softcap={softcap},prec={ggml.Prec(prec).name},"
               f"type_K={type_k.name},type_V={type_v.name},permute={list(permute)},kv_view={int(kv_view)},"
               f"v_of_k={int(v_of_k)}", build, ref, max_nmse=NMSE_ATTENTION, init=init)


def _main_loop(table):
    P = ggml.Prec
    for hsk in (40, 64, 72, 80, 96, 128, 192, 256, 320, 512, 576):
        for hsv in (40, 64, 72, 80, 96, 128, 192, 256, 512):
            if hsk not in (192, 320, 576) and hsk != hsv:
                continue
            if hsk == 192 and hsv not in (128, 192) or hsk == 576 and hsv != 512 or hsk == 320 and hsv != 256:
                continue
            for mask in (True, False):
                for sinks in (True, False):
                    for max_bias in (0.0, 8.0):
                        if not mask and max_bias > 0:
                            continue
                        for softcap in (0.0, 10.0):
                            if hsk != 128 and softcap != 0:
                                continue
                            for nh in (1, 4):
                                if nh == 1 and hsk not in (320, 576):
                                    continue
                                for nr3 in (1, 3):
                                    if hsk > 64 and nr3 > 1:
                                        continue
                                    for nr2 in (1, 4, 8, 12, 16, 20, 32):
                                        if (nr2 == 8 and hsk != 192 or nr2 == 12 and hsk != 128 or
                                                nr2 == 16 and hsk != 192 or nr2 == 20 and (nh != 1 or hsk != 576) or
                                                nr2 == 32 and (nh != 1 or hsk != 320)):
                                            continue
                                        for kv in (113, 512, 1024):
                                            if nr2 != 1 and kv != 512:
                                                continue
                                            for nb in (1, 3, 32, 75):
                                                for prec in (P.F32, P.DEFAULT):
                                                    if hsk != 128 and prec == P.DEFAULT:
                                                        continue
                                                    for tkv in KV_TYPES:
                                                        if tkv != T.F16 and hsk not in (64, 72):
                                                            continue
                                                        v_of_k = hsk == 576
                                                        args = (hsk, hsv, nh, (nr2, nr3), kv, nb, mask, sinks, max_bias,
                                                                softcap, prec, tkv, tkv)
                                                        _fa(table, *args, v_of_k=v_of_k)
                                                        if mask and max_bias == 0 and softcap == 0 and kv == 512:
                                                            _fa(table, *args, permute=(0, 2, 1, 3), v_of_k=v_of_k)


def cases():
    table = new_table()
    P = ggml.Prec
    for kv in (1024, 2048):
        for hs in (64, 128, 256):
            for nb in (32, 64):
                for tkv in types_named("F16", "Q8_0", "Q4_0"):
                    _fa(table, hs, hs, 8, (4, 1), kv, nb, True, False, 0.0, 0.0, P.F32, tkv, tkv)
    _main_loop(table)
    extra = [(64, 64, 4, (1, 1), 128, 2, "Q8_0", "Q4_0"), (64, 64, 4, (1, 1), 128, 2, "Q4_0", "F16"),
             (72, 72, 4, (1, 1), 96, 2, "Q4_0", "Q8_0"), (64, 64, 4, (1, 1), 96, 2, "F16", "F32")]
    for hsk, hsv, nh, nr, kv, nb, tk, tv in extra:
        _fa(table, hsk, hsv, nh, nr, kv, nb, True, False, 0.0, 0.0, P.F32, T[tk], T[tv])
    _fa(table, 128, 128, 4, (1, 1), 256, 1, False, False, 0.0, 0.0, P.F32, T.F16, T.Q4_0)
    for low in types_named("Q1_0", "Q2_0"):  # the 1- and 2-bit KV types, with and against others
        for hsk, hsv, kv, tk, tv in ((128, 128, 96, low, low), (128, 64, 128, low, T.Q4_0),
                                     (64, 128, 128, T.Q4_0, low), (128, 64, 64, low, T.F16)):
            _fa(table, hsk, hsv, 4, (1, 1), kv, 2, True, False, 0.0, 0.0, P.F32, tk, tv)
    for kv, nb, perm, sinks, mb, sc in ((113, 1, IDENTITY, False, 0.0, 0.0), (1024, 1, IDENTITY, False, 0.0, 0.0),
                                        (1024, 1, (0, 2, 1, 3), False, 0.0, 0.0), (1025, 64, (0, 2, 1, 3), False, 0.0, 0.0),
                                        (16384, 1, IDENTITY, False, 0.0, 0.0)):
        _fa(table, 256, 256, 2, (16, 1), kv, nb, True, sinks, mb, sc, P.F32, T.Q8_0, T.Q8_0, permute=perm)
    _fa(table, 256, 256, 2, (16, 2), 1025, 1, True, True, 8.0, 30.0, P.F32, T.Q8_0, T.Q8_0)
    _fa(table, 576, 512, 1, (20, 1), 113, 1, True, False, 0.0, 0.0, P.F32, T.Q8_0, T.Q8_0, v_of_k=True)
    return table
