"""Cases: POOL_1D/2D against F.max_pool/avg_pool (ggml's 1-D average leaves padding out, its 2-D
average counts it), POOL_2D_BACK against autograd through them, UPSCALE against F.interpolate
(nearest, bilinear, bicubic, align-corners, antialias) and the nearest index formula over
ne[2], ne[3], PAD_REFLECT_1D against F.pad(mode="reflect"), ROLL against torch.roll,
TIMESTEP_EMBEDDING against the float64 formula, WIN_PART/WIN_UNPART against numpy padding and
reshapes, GET_REL_POS and ADD_REL_POS against SAM's indexing."""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

import torchggml as ggml
from .values import T, distinct, uniform
from .table import CaseTable

CASES = CaseTable()
case = CASES.case

P = ggml.OpPool
S = ggml.ScaleMode
ALIGN = int(ggml.ScaleFlag.ALIGN_CORNERS)
ANTIALIAS = int(ggml.ScaleFlag.ANTIALIAS)


def _f16(x):
    return x.half().double()


# ---------------------------------------------------------------- POOL_1D / POOL_2D

for _type in (T.F32, T.F16):
    for _op in (P.MAX, P.AVG):
        for _k, _s, _p in [(3, 1, 1), (2, 2, 0), (4, 3, 2), (5, 2, 2)]:
            def _build_pool_1d(ctx, type=_type, op=_op, k=_k, s=_s, p=_p):
                a = ggml.new_tensor_3d(ctx, type, 17, 4, 3)
                return ggml.pool_1d(ctx, a, op, k, s, p), [a]

            def _pool_1d_ref(a, op=_op, k=_k, s=_s, p=_p):
                x = a.reshape(-1, 1, a.shape[-1])
                y = (F.max_pool1d(x, k, s, p) if op == P.MAX
                     else F.avg_pool1d(x, k, s, p, count_include_pad=False))
                return y.reshape(*a.shape[:-1], -1)
            case("pool_1d", f"type={_type.name},op={_op.name},k={_k},s={_s},p={_p}", _build_pool_1d, _pool_1d_ref,
                 max_nmse=0 if _op == P.MAX else 1e-12)

        for _k, _s, _p in [((3, 3), (1, 1), (1, 1)), ((2, 2), (2, 2), (0, 0)), ((3, 2), (2, 1), (1, 0)),
                           ((4, 4), (3, 2), (2, 1))]:
            def _build_pool_2d(ctx, type=_type, op=_op, k=_k, s=_s, p=_p):
                a = ggml.new_tensor_4d(ctx, type, 13, 11, 3, 2)
                return ggml.pool_2d(ctx, a, op, k[0], k[1], s[0], s[1], p[0], p[1]), [a]

            def _pool_2d_ref(a, op=_op, k=_k, s=_s, p=_p):
                args = (k[::-1], s[::-1], p[::-1])
                return F.max_pool2d(a, *args) if op == P.MAX else F.avg_pool2d(a, *args, count_include_pad=True)
            case("pool_2d", f"type={_type.name},op={_op.name},k={_k},s={_s},p={_p}", _build_pool_2d, _pool_2d_ref,
                 max_nmse=0 if _op == P.MAX else 1e-12)


def _build_pool_2d_fractional(ctx):
    # ggml sizes the output with the float padding (0.5 -> one more column) but pads by int(0.5) = 0
    a = ggml.new_tensor_4d(ctx, T.F32, 9, 7, 2, 1)
    return ggml.pool_2d(ctx, a, P.AVG, 2, 2, 2, 2, 0.5, 0.5), [a]


def _pool_2d_fractional_ref(a):
    padded = F.pad(a, (0, 1, 0, 1))                  # the last window reaches one past the input
    return F.avg_pool2d(padded, 2, 2, count_include_pad=True)


case("pool_2d", "fractional padding", _build_pool_2d_fractional, _pool_2d_fractional_ref, max_nmse=1e-12)


# ---------------------------------------------------------------- POOL_2D_BACK (autograd)

for _op in (P.MAX, P.AVG):
    for _k, _s, _p in [((2, 2), (2, 2), (0, 0)), ((3, 3), (2, 2), (1, 1)), ((3, 2), (1, 2), (1, 0))]:
        def _build_pool_2d_back(ctx, op=_op, k=_k, s=_s, p=_p):
            af = ggml.new_tensor_4d(ctx, T.F32, 10, 9, 3, 2)
            out = ggml.pool_2d(ctx, af, op, k[0], k[1], s[0], s[1], p[0], p[1])
            grad = ggml.new_tensor(ctx, T.F32, out.ne)
            return ggml.pool_2d_back(ctx, grad, af, op, k[0], k[1], s[0], s[1], p[0], p[1]), [grad, af]

        def _pool_2d_back_ref(grad, af, op=_op, k=_k, s=_s, p=_p):
            x = af.clone().requires_grad_(True)
            args = (k[::-1], s[::-1], p[::-1])
            y = F.max_pool2d(x, *args) if op == P.MAX else F.avg_pool2d(x, *args, count_include_pad=True)
            (gx,) = torch.autograd.grad(y, x, grad)
            return gx
        # distinct inputs: a max has one position, as autograd and ggml then agree
        case("pool_2d_back", f"op={_op.name},k={_k},s={_s},p={_p}", _build_pool_2d_back, _pool_2d_back_ref,
             max_nmse=1e-12, init={1: distinct})


# ---------------------------------------------------------------- UPSCALE / interpolate

def _interp_ref(size, mode, align, antialias=False):
    def ref(a):
        kwargs = {} if mode == "nearest" else {"align_corners": align, "antialias": antialias}
        return F.interpolate(a, size=size, mode=mode, **kwargs)
    return ref


_MODES = {"nearest": S.NEAREST, "bilinear": S.BILINEAR, "bicubic": S.BICUBIC}

for _mode, _smode in _MODES.items():
    for _align in ((False, True) if _mode != "nearest" else (False,)):
        for _src, _dst in [((6, 5), (12, 10)), ((7, 4), (16, 9)), ((9, 8), (5, 6)), ((8, 8), (8, 3))]:
            def _build_interpolate(ctx, src=_src, dst=_dst, smode=_smode, align=_align):
                a = ggml.new_tensor_4d(ctx, T.F32, src[0], src[1], 3, 2)
                return ggml.interpolate(ctx, a, dst[0], dst[1], 3, 2, int(smode) | (ALIGN if align else 0)), [a]
            case("upscale", f"interpolate {_mode},align_corners={_align},{_src}->{_dst}", _build_interpolate,
                 _interp_ref(_dst[::-1], _mode, _align), max_nmse=1e-10)

for _src, _dst in [((16, 12), (7, 5)), ((9, 9), (4, 6))]:
    def _build_antialias(ctx, src=_src, dst=_dst):
        a = ggml.new_tensor_4d(ctx, T.F32, src[0], src[1], 2, 1)
        return ggml.interpolate(ctx, a, dst[0], dst[1], 2, 1, int(S.BILINEAR) | ANTIALIAS), [a]
    case("upscale", f"interpolate bilinear antialias,{_src}->{_dst}", _build_antialias,
         _interp_ref(_dst[::-1], "bilinear", False, True), max_nmse=1e-10)

for _factor, _smode in [(2, S.NEAREST), (3, S.NEAREST), (2, S.BILINEAR)]:
    def _build_upscale(ctx, factor=_factor, smode=_smode):
        a = ggml.new_tensor_4d(ctx, T.F32, 5, 4, 3, 1)
        return ggml.upscale(ctx, a, factor, smode), [a]
    case("upscale", f"upscale x{_factor} {_smode.name}", _build_upscale,
         _interp_ref((4 * _factor, 5 * _factor), _smode.name.lower(), False), max_nmse=1e-10)


def _nearest_4d_ref(ne):
    """Nearest over every dim: index floor(i * src / dst) (torch's nearest over ne[0], ne[1])."""
    def ref(a):
        for dim, n in enumerate(reversed(ne)):
            idx = torch.div(torch.arange(n) * a.shape[dim], n, rounding_mode="floor")
            a = a.index_select(dim, idx)
        return a
    return ref


for _ne in ([10, 6, 6, 2], [4, 3, 2, 4], [7, 5, 3, 3]):
    def _build_interpolate_4d(ctx, ne=_ne):
        a = ggml.new_tensor_4d(ctx, T.F32, 5, 3, 3, 2)
        return ggml.interpolate(ctx, a, *ne, S.NEAREST), [a]
    case("upscale", f"interpolate nearest over 4 dims,[5, 3, 3, 2]->{_ne}", _build_interpolate_4d,
         _nearest_4d_ref(_ne), max_nmse=0)


# ---------------------------------------------------------------- PAD_REFLECT_1D, ROLL

for _p0, _p1 in [(1, 1), (3, 0), (0, 5), (4, 6)]:
    def _build_pad_reflect(ctx, p0=_p0, p1=_p1):
        a = ggml.new_tensor_3d(ctx, T.F32, 9, 4, 2)
        return ggml.pad_reflect_1d(ctx, a, p0, p1), [a]
    case("pad_reflect_1d", f"p0={_p0},p1={_p1}", _build_pad_reflect,
         lambda a, p0=_p0, p1=_p1: F.pad(a.reshape(-1, 1, a.shape[-1]), (p0, p1), mode="reflect").reshape(
             *a.shape[:-1], -1), max_nmse=0)

for _type in (T.F32, T.F16, T.I32):
    for _shifts in [(1, 0, 0, 0), (-3, 2, 1, 0), (4, -2, -1, 1), (0, 0, 2, -1)]:
        def _build_roll(ctx, shifts=_shifts, type=_type):
            a = ggml.new_tensor_4d(ctx, type, 7, 5, 3, 2)
            return ggml.roll(ctx, a, *shifts), [a]
        case("roll", f"type={_type.name},shifts={_shifts}", _build_roll,
             lambda a, shifts=_shifts: torch.roll(a, shifts[::-1], dims=(0, 1, 2, 3)), max_nmse=0,
             init={0: lambda t, gen: torch.randint(-100, 100, tuple(reversed(t.ne)), generator=gen)}
             if _type == T.I32 else None)


# ---------------------------------------------------------------- TIMESTEP_EMBEDDING

def _timestep_ref(dim, max_period):
    def ref(t):
        half = dim // 2
        freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float64) / half)
        args = t.reshape(-1, 1) * freqs[None, :]
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        if dim % 2:
            emb = torch.cat([emb, torch.zeros(emb.shape[0], 1, dtype=torch.float64)], dim=-1)
        return emb
    return ref


for _dim, _max_period in [(32, 10000), (15, 10000), (64, 100)]:
    def _build_timestep(ctx, dim=_dim, max_period=_max_period):
        t = ggml.new_tensor_1d(ctx, T.F32, 6)
        return ggml.timestep_embedding(ctx, t, dim, max_period), [t]
    # timesteps up to 1000: float32 arguments of cos/sin err by ~1e-4 absolute, as in ggml
    case("timestep_embedding", f"dim={_dim},max_period={_max_period}", _build_timestep,
         _timestep_ref(_dim, _max_period), max_nmse=1e-7, init={0: uniform(0, 1000)})


# ---------------------------------------------------------------- WIN_PART, WIN_UNPART

def _win_part_ref(w):
    def ref(a):
        x = a[0].numpy()                                           # [H, W, C]
        h, wd = x.shape[0], x.shape[1]
        npy, npx = -(-h // w), -(-wd // w)
        x = np.pad(x, ((0, npy * w - h), (0, npx * w - wd), (0, 0)))
        windows = [x[py * w:(py + 1) * w, px * w:(px + 1) * w] for py in range(npy) for px in range(npx)]
        return torch.from_numpy(np.stack(windows))
    return ref


for _c, _wd, _h, _w in [(4, 14, 14, 7), (3, 10, 9, 4), (2, 5, 8, 3)]:
    def _build_win_part(ctx, c=_c, wd=_wd, h=_h, w=_w):
        a = ggml.new_tensor_3d(ctx, T.F32, c, wd, h)
        return ggml.win_part(ctx, a, w), [a]
    case("win_part", f"C={_c},W={_wd},H={_h},w={_w}", _build_win_part, _win_part_ref(_w), max_nmse=0)

    def _build_win_unpart(ctx, c=_c, wd=_wd, h=_h, w=_w):
        a = ggml.new_tensor_3d(ctx, T.F32, c, wd, h)
        return ggml.win_unpart(ctx, ggml.win_part(ctx, a, w), wd, h, w), [a]
    case("win_unpart", f"win_part round trip,C={_c},W={_wd},H={_h},w={_w}", _build_win_unpart, lambda a: a,
         max_nmse=0)


# ---------------------------------------------------------------- GET_REL_POS, ADD_REL_POS (SAM)

def _get_rel_pos_ref(size):
    """SAM's get_rel_pos: rel_pos[(q - k) + (size - 1)] for query q, key k."""
    def ref(a):
        q = torch.arange(size)[:, None]
        k = torch.arange(size)[None, :]
        return a[0, 0][(q - k) + (size - 1)]
    return ref


for _c, _size in [(8, 5), (3, 7)]:
    def _build_get_rel_pos(ctx, c=_c, size=_size):
        a = ggml.new_tensor_2d(ctx, T.F16, c, 2 * size - 1)
        return ggml.get_rel_pos(ctx, a, size, size), [a]
    case("get_rel_pos", f"C={_c},size={_size}", _build_get_rel_pos, _get_rel_pos_ref(_size), max_nmse=0)


def _add_rel_pos_ref(a, pw, ph):
    """SAM's add_decomposed_rel_pos: attn[b, qh, qw, kh, kw] + rel_h[b, qh, qw, kh] + rel_w[b, qh, qw, kw]
    (here ph plays rel_h and pw rel_w)."""
    b, h, w = pw.shape[0], pw.shape[1], pw.shape[2]
    attn = a.reshape(b, h, w, w, w)
    return (attn + ph[..., :, None] + pw[..., None, :]).reshape(a.shape)


for _inplace in (False, True):
    def _build_add_rel_pos(ctx, inplace=_inplace):
        w, h, b = 4, 4, 2
        a = ggml.new_tensor_3d(ctx, T.F32, w * w, w * h, b)
        pw = ggml.new_tensor_4d(ctx, T.F32, w, w, h, b)
        ph = ggml.new_tensor_4d(ctx, T.F32, w, w, h, b)
        fn = ggml.add_rel_pos_inplace if inplace else ggml.add_rel_pos
        return fn(ctx, ggml.dup(ctx, a) if inplace else a, pw, ph), [a, pw, ph]
    case("add_rel_pos", f"inplace={_inplace}", _build_add_rel_pos, _add_rel_pos_ref, max_nmse=1e-12)
