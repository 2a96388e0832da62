"""Breadth: vision / audio / diffusion ops (POOL_1D/2D, IM2COL, IM2COL_3D, CONV_2D (direct, WHCN
and CWHN), CONV_2D_DW, CONV_3D, CONV_TRANSPOSE_1D/2D, COL2IM_1D) and the small region ops
(CUMSUM, TRI, FILL, DIAG, PAD_REFLECT_1D, ROLL, TIMESTEP_EMBEDDING). Each family is generated
where its builder exists."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import torchggml as ggml
from .common import T, new_table, has, corner

NMSE_CONV = 1e-6


def _f16(x):
    return x.half().double()


def _out(n, k, s, p, d=1):
    """ggml's output length: C's truncating division (a window may start inside the padding and
    reach past it: ggml reads zeros there)."""
    num = n + 2 * p - d * (k - 1) - 1
    return (abs(num) // s) * (1 if num >= 0 else -1) + 1


def _conv2d_ggml(x, w, s, p, d):
    """F.conv2d with ggml's output size (s, p, d as (h, w)): inputs padded with zeros far enough
    for every output position ggml computes."""
    kh, kw = w.shape[-2:]
    oh, ow = _out(x.shape[-2], kh, s[0], p[0], d[0]), _out(x.shape[-1], kw, s[1], p[1], d[1])
    eh = max(0, (oh - 1) * s[0] + d[0] * (kh - 1) + 1 - (x.shape[-2] + 2 * p[0]))
    ew = max(0, (ow - 1) * s[1] + d[1] * (kw - 1) + 1 - (x.shape[-1] + 2 * p[1]))
    x = F.pad(x, (p[1], p[1] + ew, p[0], p[0] + eh))
    return F.conv2d(x, w, stride=s, dilation=d)


# ---------------------------------------------------------------- pooling (manual windows: any padding)

def _windows(x, k, s, p, fill):
    """x [..., L] padded by p with `fill` on both sides -> windows [..., OL, k]."""
    x = F.pad(x, (p, p), value=fill)
    return x.unfold(-1, k, s)


FLT_MAX = float(torch.finfo(torch.float32).max)


def _pool_1d_ref(op, k, s, p):
    """ggml's windows: max starts at -FLT_MAX (what a window wholly in the padding gives), average
    over the values inside the row (0 where none)."""
    def ref(a):
        if op == ggml.OpPool.MAX:
            return _windows(a, k, s, p, -FLT_MAX).amax(-1)
        count = _windows(torch.ones_like(a), k, s, p, 0.0).sum(-1)
        return _windows(a, k, s, p, 0.0).sum(-1) / count.clamp_min(1)
    return ref


def _pool_2d_ref(op, k0, k1, s0, s1, p0, p1):
    def ref(a):
        fill = -FLT_MAX if op == ggml.OpPool.MAX else 0.0
        x = F.pad(a, (p0, p0, p1, p1), value=fill)
        w = x.unfold(-2, k1, s1).unfold(-2, k0, s0)  # [.., OH, OW, k1, k0]
        return w.amax((-1, -2)) if op == ggml.OpPool.MAX else w.sum((-1, -2)) / (k0 * k1)
    return ref


def _pool_cases(table):
    P = ggml.OpPool
    for op in (P.AVG, P.MAX):
        for k0 in (1, 3):
            for k1 in (1, 3):
                for s0 in (1, 2):
                    for s1 in (1, 2):
                        for p0 in (0, 1):
                            for p1 in (0, 1):
                                def build(ctx, args=(op, k0, k1, s0, s1, p0, p1)):
                                    a = ggml.new_tensor(ctx, T.F32, [10, 10, 3, 1])
                                    return ggml.pool_2d(ctx, a, *args), [a]
                                table.case("pool_2d", f"pool_type={op.name},ne=[10, 10, 3, 1],k=[{k0}, {k1}],"
                                           f"s=[{s0}, {s1}],p=[{p0}, {p1}]", build,
                                           _pool_2d_ref(op, k0, k1, s0, s1, p0, p1))
    for op in (P.AVG, P.MAX):
        for k0 in (1, 2, 3):
            for s0 in (1, 2, 3):
                for p0 in (0, 1, 2, 3):
                    for ne in ([10, 3, 2, 1], [11, 1, 3, 2], [128, 2, 1, 3]):
                        def build(ctx, ne=ne, args=(op, k0, s0, p0)):
                            a = ggml.new_tensor(ctx, T.F32, ne)
                            return ggml.pool_1d(ctx, a, *args), [a]
                        table.case("pool_1d", f"pool_type={op.name},ne={ne},k0={k0},s0={s0},p0={p0}", build,
                                   _pool_1d_ref(op, k0, s0, p0))


# ---------------------------------------------------------------- im2col

def _im2col_2d_ref(k_hw, s, p, d):
    """b torch [N, IC, H, W] -> [N, OH, OW, IC*KH*KW] (the channel outermost in a column)."""
    def ref(kernel, b):
        cols = F.unfold(b, k_hw, dilation=d, padding=p, stride=s).transpose(1, 2)
        oh = _out(b.shape[2], k_hw[0], s[0], p[0], d[0])
        return cols.reshape(b.shape[0], oh, -1, cols.shape[-1])
    return ref


def _im2col_1d_ref(k, s, p, d):
    """b torch [1, N, IC, L] -> [1, N, OL, IC*K]."""
    def ref(kernel, b):
        x = b[0].unsqueeze(2)  # [N, IC, 1, L]
        cols = F.unfold(x, (1, k), dilation=(1, d), padding=(0, p), stride=(1, s)).transpose(1, 2)
        return cols.unsqueeze(0)
    return ref


def _im2col(table, t_in, t_k, t_dst, ne_in, ne_k, s0, s1, p0, p1, d0, d1, is_2d):
    def build(ctx):
        b = ggml.new_tensor(ctx, t_in, list(ne_in))
        a = ggml.new_tensor(ctx, t_k, list(ne_k))
        return ggml.im2col(ctx, a, b, s0, s1, p0, p1, d0, d1, is_2d, t_dst), [a, b]
    ref = (_im2col_2d_ref((ne_k[1], ne_k[0]), (s1, s0), (p1, p0), (d1, d0)) if is_2d
           else _im2col_1d_ref(ne_k[0], s0, p0, d0))
    table.case("im2col", f"type_input={t_in.name},type_kernel={t_k.name},dst_type={t_dst.name},ne_input={list(ne_in)},"
               f"ne_kernel={list(ne_k)},s=[{s0}, {s1}],p=[{p0}, {p1}],d=[{d0}, {d1}],is_2D={int(is_2d)}", build,
               (lambda a, b: _f16(ref(a, b))) if t_dst == T.F16 else ref, max_nmse=0)


def _im2col_cases(table):
    F32, F16 = T.F32, T.F16
    for t_k, t_dst, ne_in, ne_k in ((F32, F32, [3000, 128, 1, 1], [3, 128, 1280, 1]),
                                    (F16, F32, [3000, 128, 1, 1], [3, 128, 1280, 1]),
                                    (F16, F16, [3000, 128, 1, 1], [3, 128, 1280, 1]),
                                    (F16, F16, [3000, 384, 1, 1], [3, 384, 384, 1])):
        _im2col(table, F32, t_k, t_dst, ne_in, ne_k, 1, 0, 1, 0, 1, 0, False)
    for s0 in (1, 3):
        for p0 in (0, 3):
            for d0 in (1, 3):
                _im2col(table, F32, F32, F32, [20, 2, 2, 1], [3, 2, 2, 1], s0, 0, p0, 0, d0, 0, False)
    for t_k, t_dst in ((F32, F32), (F32, F16), (F16, F32), (F16, F16)):
        _im2col(table, F32, t_k, t_dst, [10, 10, 3, 1], [3, 3, 3, 1], 1, 1, 1, 1, 1, 1, True)
    for s0 in (1, 3):
        for s1 in (1, 3):
            for p0 in (0, 3):
                for p1 in (0, 3):
                    for d0 in (1, 3):
                        for d1 in (1, 3):
                            _im2col(table, F32, F32, F32, [20, 20, 2, 2], [3, 3, 2, 2], s0, s1, p0, p1, d0, d1, True)
    for ne_in, ne_k, p in (([12, 12, 1, 32], [3, 3, 1, 32], 1), ([12, 12, 2, 32], [3, 3, 2, 32], 1),
                           ([12, 12, 1, 1024], [3, 3, 1, 1024], 1), ([12, 12, 2, 1024], [3, 3, 2, 1024], 1),
                           ([12, 12, 1, 2048], [3, 3, 1, 2048], 1), ([12, 12, 2, 2048], [3, 3, 2, 2048], 1),
                           ([12, 12, 1, 2560], [3, 3, 1, 2560], 1), ([12, 12, 2, 2560], [3, 3, 2, 2560], 1),
                           ([5, 5, 1, 32], [3, 4, 1, 32], 0), ([128, 128, 1, 2], [32, 33, 1, 2], 1),
                           ([128, 128, 2, 1], [33, 34, 2, 1], 1)):
        _im2col(table, F32, F16, F16, ne_in, ne_k, 1, 1, p, p, 1, 1, True)
    _im2col(table, F32, F32, F32, [2, 2, 1536, 729], [2, 2, 1536, 4096], 1, 1, 0, 0, 1, 1, True)


def _im2col_3d_ref(ic, k, s, p, d, view_ne):
    """b torch [N*IC, D, H, W] -> [N*OD, OH, OW, IC*KD*KH*KW] (kernel offsets inner, channel outer)."""
    kw, kh, kd = k

    def ref(kernel, b):
        if view_ne is not None:
            b = corner(b, view_ne)
        n = b.shape[0] // ic
        if n == 0:  # fewer channels than IC: an empty result, as ggml
            return torch.zeros(0, 1, 1, 1, dtype=b.dtype)
        x = F.pad(b.reshape(n, ic, *b.shape[1:]), (p[0], p[0], p[1], p[1], p[2], p[2]))
        od, oh, ow = (_out(b.shape[1 + i], (kd, kh, kw)[i], s[2 - i], p[2 - i], d[2 - i]) for i in range(3))
        taps = []
        for z in range(kd):
            for y in range(kh):
                for xk in range(kw):
                    z0, y0, x0 = z * d[2], y * d[1], xk * d[0]
                    taps.append(x[:, :, z0:z0 + s[2] * (od - 1) + 1:s[2], y0:y0 + s[1] * (oh - 1) + 1:s[1],
                                  x0:x0 + s[0] * (ow - 1) + 1:s[0]])
        cols = torch.stack(taps, 2)  # [N, IC, K, OD, OH, OW]
        return cols.permute(0, 3, 4, 5, 1, 2).reshape(n * od, oh, ow, -1)
    return ref


def _im2col_3d(table, t_k, t_dst, ne_in, ne_k, ic, s, p, d, v):
    view_ne = [n - 2 for n in ne_in] if v else None

    def build(ctx):
        b0 = b = ggml.new_tensor(ctx, T.F32, list(ne_in))
        if v:
            b = ggml.view_4d(ctx, b0, *view_ne, b0.nb[1], b0.nb[2], b0.nb[3], 0)
        a = ggml.new_tensor(ctx, t_k, list(ne_k))
        return ggml.im2col_3d(ctx, a, b, ic, *s, *p, *d, t_dst), [a, b0]
    ref = _im2col_3d_ref(ic, ne_k[:3], s, p, d, view_ne)
    table.case("im2col_3d", f"type_kernel={t_k.name},dst_type={t_dst.name},ne_input={list(ne_in)},ne_kernel={list(ne_k)},"
               f"IC={ic},s={list(s)},p={list(p)},d={list(d)},v={int(v)}", build,
               (lambda a, b: _f16(ref(a, b))) if t_dst == T.F16 else ref, max_nmse=0)


def _im2col_3d_cases(table):
    for t_k, t_dst in ((T.F32, T.F32), (T.F16, T.F32), (T.F16, T.F16)):
        _im2col_3d(table, t_k, t_dst, [10, 10, 10, 9], [3, 3, 3, 1], 3, (1, 1, 1), (1, 1, 1), (1, 1, 1), False)
    for s0 in (1, 3):
        for s1 in (1, 3):
            for s2 in (1, 3):
                for p0 in (0, 3):
                    for p1 in (0, 3):
                        for p2 in (0, 3):
                            for d0 in (1, 3):
                                for d1 in (1, 3):
                                    for d2 in (1, 3):
                                        for ic in (1, 3):
                                            for v in (False, True):
                                                _im2col_3d(table, T.F32, T.F32, [20, 20, 10, 3], [3, 3, 3, 3], ic,
                                                           (s0, s1, s2), (p0, p1, p2), (d0, d1, d2), v)


# ---------------------------------------------------------------- direct convolutions

def _conv_2d(table, ne_in, ne_k, t_k, s0, s1, p0, p1, d0, d1, cwhn):
    def build(ctx):
        b0 = b = ggml.new_tensor(ctx, T.F32, list(ne_in))
        a0 = a = ggml.new_tensor(ctx, t_k, list(ne_k))
        if cwhn:  # channels innermost in memory, the same logical tensors
            b = ggml.permute(ctx, ggml.cont(ctx, ggml.permute(ctx, b0, 1, 2, 0, 3)), 2, 0, 1, 3)
            a = ggml.permute(ctx, ggml.cont(ctx, ggml.permute(ctx, a0, 2, 3, 1, 0)), 3, 2, 0, 1)
        return ggml.conv_2d_direct(ctx, a, b, s0, s1, p0, p1, d0, d1), [a0, b0]
    img = _f16 if t_k == T.F16 else (lambda x: x)
    table.case("conv_2d", f"ne_input={list(ne_in)},ne_kernel={list(ne_k)},type_kernel={t_k.name},s=[{s0}, {s1}],"
               f"p=[{p0}, {p1}],d=[{d0}, {d1}],cwhn={int(cwhn)}", build,
               lambda a, b: _conv2d_ggml(img(b), a, (s1, s0), (p1, p0), (d1, d0)),
               max_nmse=NMSE_CONV)


def _conv_2d_cases(table):
    s1, p0, d0, d1 = 5, 5, 2, 4
    for s0 in (1, 3):
        for p1 in (2, 5):
            for cin in (1, 25):
                for cout in (1, 12):
                    for kh in (1, 2, 3, 11):
                        for kw in (1, 2, 3, 11):
                            for h in (1, 133):
                                for w in (1, 141):
                                    if _out(w, kw, s0, p0, d0) > 0 and _out(h, kh, s1, p1, d1) > 0:
                                        for t_k in (T.F32, T.F16):
                                            for cwhn in (False, True):
                                                _conv_2d(table, [w, h, cin, 2], [kw, kh, cin, cout], t_k, s0, s1, p0,
                                                         p1, d0, d1, cwhn)
    for t_k in (T.F32, T.F16):
        for cwhn in (False, True):
            _conv_2d(table, [256, 256, 192, 1], [3, 3, 192, 96], t_k, 1, 1, 1, 1, 1, 1, cwhn)


def _conv_2d_dw(table, ne_in, ne_k, t_k, s, p, d, cwhn):
    def build(ctx):
        b0 = b = ggml.new_tensor(ctx, T.F32, list(ne_in))
        a0 = a = ggml.new_tensor(ctx, t_k, list(ne_k))
        if cwhn:
            b = ggml.permute(ctx, ggml.cont(ctx, ggml.permute(ctx, b0, 1, 2, 0, 3)), 2, 0, 1, 3)
            a = ggml.permute(ctx, ggml.cont(ctx, ggml.permute(ctx, a0, 2, 3, 1, 0)), 3, 2, 0, 1)
        return ggml.conv_2d_dw_direct(ctx, a, b, s, s, p, p, d, d), [a0, b0]
    table.case("conv_2d_dw", f"ne_input={list(ne_in)},ne_kernel={list(ne_k)},type_kernel={t_k.name},s={s},p={p},d={d},"
               f"cwhn={int(cwhn)}", build,
               lambda a, b: F.conv2d(b, a.reshape(-1, 1, *a.shape[2:]), stride=s, padding=p, dilation=d,
                                     groups=b.shape[1]), max_nmse=NMSE_CONV)


def _conv_3d(table, n, ic, idd, ih, iw, oc, kd, kh, kw, s, p, d, t_k):
    def build(ctx):
        b = ggml.new_tensor(ctx, T.F32, [iw, ih, idd, ic * n])
        a = ggml.new_tensor(ctx, t_k, [kw, kh, kd, ic * oc])
        return ggml.conv_3d_direct(ctx, a, b, *s, *p, *d, ic, n, oc), [a, b]
    img = _f16 if t_k == T.F16 else (lambda x: x)

    def ref(a, b):
        y = F.conv3d(img(b).reshape(n, ic, idd, ih, iw), a.reshape(oc, ic, kd, kh, kw), stride=s[::-1],
                     padding=p[::-1], dilation=d[::-1])
        return y.reshape(n * oc, *y.shape[2:])
    table.case("conv_3d", f"N={n},IC={ic},ID={idd},IH={ih},IW={iw},OC={oc},KD={kd},KH={kh},KW={kw},s={list(s)},"
               f"p={list(p)},d={list(d)},type_kernel={t_k.name}", build, ref, max_nmse=NMSE_CONV)


def _conv_3d_cases(table):
    for t_k in (T.F32, T.F16):
        for n in (1, 2):
            for ic in (1, 3):
                for oc in (1, 4):
                    for s0 in (1, 2):
                        for p1 in (0, 1):
                            for d2 in (1, 2):
                                iw, ih, idd = 20, 22, 18
                                s, p, d = (s0, s0, s0), (p1, p1, p1), (d2, d2, d2)
                                if min(_out(iw, 3, s0, p1, d2), _out(ih, 3, s0, p1, d2), _out(idd, 3, s0, p1, d2)) <= 0:
                                    continue
                                _conv_3d(table, n, ic, idd, ih, iw, oc, 3, 3, 3, s, p, d, t_k)
                                _conv_3d(table, n, ic, idd, ih, iw, oc, 3, 1, 5, (2, 1, 1), (2, 0, 1), (1, 1, 2), t_k)
        _conv_3d(table, 1, 4, 8, 8, 8, 8, 1, 1, 1, (1, 1, 1), (0, 0, 0), (1, 1, 1), t_k)


def _conv_transpose_1d(table, ne_in, ne_k, s0):
    def build(ctx):
        b = ggml.new_tensor(ctx, T.F32, list(ne_in))
        a = ggml.new_tensor(ctx, T.F32, list(ne_k))
        return ggml.conv_transpose_1d(ctx, a, b, s0, 0, 1), [a, b]
    table.case("conv_transpose_1d", f"ne_input={list(ne_in)},ne_kernel={list(ne_k)},s0={s0}", build,
               lambda a, b: F.conv_transpose1d(b[0], a[0], stride=s0), max_nmse=NMSE_CONV)


def _col2im_ref(s0, oc, p0):
    def ref(a):
        cols = a[0, 0]  # [T_in, K*OC]: column oc*K + k
        t_in, k = cols.shape[0], cols.shape[1] // oc
        full = F.fold(cols.T.reshape(1, oc * k, t_in), (1, (t_in - 1) * s0 + k), (1, k), stride=(1, s0))
        return full[0, :, 0, p0:full.shape[-1] - p0]
    return ref


def _transposed_cases(table):
    for cout in (1, 9):
        for cin in (1, 7):
            for k in (1, 3, 1337):
                for length in (1, 2, 13):
                    for s0 in (1, 2, 3):
                        _conv_transpose_1d(table, [length, cin, 1, 1], [k, cout, cin, 1], s0)
    _conv_transpose_1d(table, [197, 32, 1, 1], [16, 32, 32, 1], 1)
    for ne_in, ne_k, s0 in (([3, 2, 1, 1], [2, 3, 2, 1], 3), ([3, 2, 1, 1], [2, 3, 2, 1], 2), ([3, 2, 1, 1], [2, 3, 2, 1], 1),
                            ([3, 2, 1, 1], [3, 2, 2, 1], 2), ([3, 2, 1, 1], [3, 2, 2, 1], 1), ([3, 2, 1, 1], [3, 1, 2, 1], 1),
                            ([2, 1, 1, 1], [3, 1, 1, 1], 1)):
        _conv_transpose_1d(table, ne_in, ne_k, s0)
    for type in (T.F32, T.F16, T.BF16):
        for k, oc, t_in, s0, p0 in ((16, 32, 197, 8, 0), (4, 3, 7, 2, 0), (1, 5, 13, 1, 0), (6, 4, 11, 3, 1),
                                    (2, 3, 9, 3, 0), (5, 4, 11, 2, 0), (8, 4, 13, 4, 2), (4, 3, 1, 2, 0),
                                    (16, 1, 197, 8, 0), (1, 5, 13, 3, 0), (8, 2, 3, 2, 5)):
            def build(ctx, type=type, k=k, oc=oc, t_in=t_in, s0=s0, p0=p0):
                a = ggml.new_tensor_2d(ctx, type, k * oc, t_in)
                return ggml.col2im_1d(ctx, a, s0, oc, p0), [a]
            ref = _col2im_ref(s0, oc, p0)
            table.case("col2im_1d", f"type={type.name},K={k},OC={oc},T_in={t_in},s0={s0},p0={p0}", build,
                       ref if type == T.F32 else (lambda a, ref=ref, type=type: ref(a).to(ggml.type_to_dtype(type)).double()),
                       max_nmse=1e-12 if type == T.F32 else 1e-5)
    for t_k in (T.F32, T.F16):
        for ne_in, ne_k, stride in (([3, 2, 3, 1], [2, 2, 1, 3], 1), ([10, 10, 9, 1], [3, 3, 1, 9], 2),
                                    ([129, 63, 35, 1], [3, 3, 48, 35], 1)):
            def build(ctx, ne_in=ne_in, ne_k=ne_k, stride=stride, t_k=t_k):
                b = ggml.new_tensor(ctx, T.F32, ne_in)
                a = ggml.new_tensor(ctx, t_k, ne_k)
                return ggml.conv_transpose_2d_p0(ctx, a, b, stride), [a, b]
            img = _f16 if t_k == T.F16 else (lambda x: x)
            table.case("conv_transpose_2d", f"ne_input={ne_in},ne_kernel={ne_k},stride={stride},kernel_type={t_k.name}",
                       build, lambda a, b, stride=stride, img=img: F.conv_transpose2d(img(b), a, stride=stride),
                       max_nmse=NMSE_CONV)


def cases():
    table = new_table()
    if has("pool_2d"):
        _pool_cases(table)
    if has("im2col"):
        _im2col_cases(table)
    if has("im2col_3d"):
        _im2col_3d_cases(table)
    if has("conv_2d_direct"):
        _conv_2d_cases(table)
    if has("conv_2d_dw_direct"):
        for t_k in (T.F32, T.F16):
            for ne_in, ne_k, s, p in (([17, 34, 9, 1], [3, 3, 1, 9], 1, 0), ([32, 8, 64, 1], [3, 3, 1, 64], 2, 1)):
                for cwhn in (False, True):
                    _conv_2d_dw(table, ne_in, ne_k, t_k, s, p, 1, cwhn)
    if has("conv_3d_direct"):
        _conv_3d_cases(table)
    if has("conv_transpose_1d") and has("col2im_1d") and has("conv_transpose_2d_p0"):
        _transposed_cases(table)
    return table
