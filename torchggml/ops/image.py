"""Image, audio and diffusion ops: POOL_1D/2D (and POOL_2D_BACK), UPSCALE (upscale, interpolate),
PAD_REFLECT_1D, ROLL, TIMESTEP_EMBEDDING, and SAM's WIN_PART, WIN_UNPART, GET_REL_POS, ADD_REL_POS."""
from __future__ import annotations

import numpy as _np

from ..enums import Op, OpPool, ScaleMode, ScaleFlag
from ..tensor import Tensor, are_same_shape, is_contiguous
from ..types import Type, type_size
from ._common import new_op, same_as, require


# ---------------------------------------------------------------- pooling

def _pool_output_size(ins: int, ks: int, s: int, p: float) -> int:
    """(ins + 2p - ks) / s + 1 in float32, truncated, as ggml computes it (p may be fractional)."""
    f32 = _np.float32
    return int((f32(ins) + f32(2) * f32(p) - f32(ks)) / f32(s) + f32(1))


def pool_1d(ctx, a: Tensor, op: OpPool, k0: int, s0: int, p0: int) -> Tensor:
    """Max or average over windows of k0 along ne[0] (stride s0, padding p0 on both sides; padding
    is left out of both the max and the average). F32 result."""
    op = OpPool(op)
    ne = [_pool_output_size(a.ne[0], k0, s0, p0), a.ne[1], a.ne[2], a.ne[3]]
    require(ne[0] > 0, "pool_1d", f"no output (k0={k0}, s0={s0}, p0={p0})", a)
    return new_op(ctx, Op.POOL_1D, Type.F32, ne, [a], [int(op), k0, s0, p0])


def pool_2d(ctx, a: Tensor, op: OpPool, k0: int, k1: int, s0: int, s1: int, p0: float, p1: float) -> Tensor:
    """Max or average over k0 x k1 windows of ne[0], ne[1]. Padding counts as zeros in the average
    (which always divides by k0*k1) and is left out of the max. The output size uses p as given;
    the kernel uses int(p), as in ggml."""
    op = OpPool(op)
    ne = [_pool_output_size(a.ne[0], k0, s0, p0), _pool_output_size(a.ne[1], k1, s1, p1), a.ne[2], a.ne[3]]
    require(ne[0] > 0 and ne[1] > 0, "pool_2d", f"no output (k={k0}x{k1}, s={s0}x{s1}, p={p0}x{p1})", a)
    return new_op(ctx, Op.POOL_2D, Type.F32, ne, [a], [int(op), k0, k1, s0, s1, int(p0), int(p1)])


def pool_2d_back(ctx, a: Tensor, af: Tensor, op: OpPool, k0: int, k1: int, s0: int, s1: int,
                 p0: float, p1: float) -> Tensor:
    """The gradient of pool_2d's input af from a, the gradient of its output: max sends each
    gradient to its window's (first) maximum, avg spreads it / (k0*k1)."""
    op = OpPool(op)
    require(a.ne[2] == af.ne[2] and a.ne[3] == af.ne[3], "pool_2d_back",
            "a (output gradient) and af (forward input) must agree in ne[2], ne[3]", a, af)
    return new_op(ctx, Op.POOL_2D_BACK, Type.F32, af.ne, [a, af], [int(op), k0, k1, s0, s1, int(p0), int(p1)])


# ---------------------------------------------------------------- upscale / interpolate

def _interpolate(ctx, a: Tensor, ne, mode: int, name: str) -> Tensor:
    mode = int(mode)
    require((mode & 0xFF) in tuple(ScaleMode), name, f"unknown scale mode {mode & 0xFF}", a)
    require(not (mode & ScaleFlag.ANTIALIAS) or (mode & 0xFF) == ScaleMode.BILINEAR, name,
            "antialias needs the bilinear mode", a)
    require(a.type == Type.F32, name, "a must be F32", a)
    require(all(int(n) > 0 for n in ne), name, f"sizes {list(ne)} must be positive", a)
    return new_op(ctx, Op.UPSCALE, a.type, [int(n) for n in ne], [a], [mode])


def upscale(ctx, a: Tensor, scale_factor: int, mode: ScaleMode) -> Tensor:
    """ne[0] and ne[1] multiplied by scale_factor (> 1)."""
    require(scale_factor > 1, "upscale", f"scale_factor must be > 1 (got {scale_factor})", a)
    return _interpolate(ctx, a, [a.ne[0] * scale_factor, a.ne[1] * scale_factor, a.ne[2], a.ne[3]], mode,
                        "upscale")


def upscale_ext(ctx, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int, mode: ScaleMode) -> Tensor:
    """Deprecated in ggml: interpolate."""
    return _interpolate(ctx, a, [ne0, ne1, ne2, ne3], mode, "upscale_ext")


def interpolate(ctx, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int, mode: int) -> Tensor:
    """a resampled to [ne0, ne1, ne2, ne3]: `mode` is a ScaleMode (nearest, bilinear or bicubic over
    ne[0], ne[1]; nearest over ne[2], ne[3]) or-ed with ScaleFlag bits (ALIGN_CORNERS, ANTIALIAS)."""
    return _interpolate(ctx, a, [ne0, ne1, ne2, ne3], mode, "interpolate")


# ---------------------------------------------------------------- padding, roll

def pad_reflect_1d(ctx, a: Tensor, p0: int, p1: int) -> Tensor:
    """Reflection padding of ne[0]: [a, b, c, d] -> [b, a, b, c, d, c] for p0 = p1 = 1."""
    require(p0 >= 0 and p1 >= 0, "pad_reflect_1d", f"padding ({p0}, {p1}) must be non-negative", a)
    require(p0 < a.ne[0] and p1 < a.ne[0], "pad_reflect_1d",
            f"padding ({p0}, {p1}) must be shorter than ne[0] = {a.ne[0]}", a)
    require(is_contiguous(a), "pad_reflect_1d", "a must be contiguous", a)
    require(a.type == Type.F32, "pad_reflect_1d", "a must be F32", a)
    ne = [a.ne[0] + p0 + p1, a.ne[1], a.ne[2], a.ne[3]]
    return new_op(ctx, Op.PAD_REFLECT_1D, a.type, ne, [a], [p0, p1])


def roll(ctx, a: Tensor, shift0: int, shift1: int, shift2: int, shift3: int) -> Tensor:
    """Elements moved by shift_i along dim i, wrapping around (torch.roll)."""
    shifts = [int(shift0), int(shift1), int(shift2), int(shift3)]
    require(a.nb[0] == type_size(a.type), "roll", "a's elements must be contiguous", a)
    for i, s in enumerate(shifts):
        require(abs(s) < a.ne[i], "roll", f"|shift{i}| = {abs(s)} must be < ne[{i}] = {a.ne[i]}", a)
    return new_op(ctx, Op.ROLL, a.type, a.ne, [a], shifts)


def timestep_embedding(ctx, timesteps: Tensor, dim: int, max_period: int) -> Tensor:
    """F32 [dim, N]: for timesteps [N], cos(t f_j) then sin(t f_j), f_j = max_period^(-j / (dim//2)),
    a zero last column when dim is odd (stable diffusion's sinusoidal embedding)."""
    require(timesteps.type == Type.F32, "timestep_embedding", "timesteps must be F32", timesteps)
    return new_op(ctx, Op.TIMESTEP_EMBEDDING, Type.F32, [dim, timesteps.ne[0]], [timesteps], [dim, max_period])


# ---------------------------------------------------------------- SAM: windows and relative positions

def win_part(ctx, a: Tensor, w: int) -> Tensor:
    """a [C, W, H] cut into w x w windows (zero padded): [C, w, w, n_windows]."""
    require(a.ne[3] == 1, "win_part", "a.ne[3] must be 1", a)
    require(a.type == Type.F32, "win_part", "a must be F32", a)
    px = (w - a.ne[1] % w) % w
    py = (w - a.ne[2] % w) % w
    npx = (px + a.ne[1]) // w
    npy = (py + a.ne[2]) // w
    return new_op(ctx, Op.WIN_PART, Type.F32, [a.ne[0], w, w, npx * npy], [a], [npx, npy, w])


def win_unpart(ctx, a: Tensor, w0: int, h0: int, w: int) -> Tensor:
    """win_part reversed: windows [C, w, w, n] back to [C, w0, h0] (padding dropped)."""
    require(a.type == Type.F32, "win_unpart", "a must be F32", a)
    return new_op(ctx, Op.WIN_UNPART, Type.F32, [a.ne[0], w0, h0], [a], [w])


def get_rel_pos(ctx, a: Tensor, qh: int, kh: int) -> Tensor:
    """F16 [C, kh, qh]: row (kh - 1) + (q - k) of a [C, 2*qh - 1] at (k, q)."""
    require(qh == kh, "get_rel_pos", f"qh ({qh}) must equal kh ({kh})", a)
    require(2 * max(qh, kh) - 1 == a.ne[1], "get_rel_pos", f"a.ne[1] must be 2*qh - 1 = {2 * qh - 1}", a)
    return new_op(ctx, Op.GET_REL_POS, Type.F16, [a.ne[0], kh, qh], [a])


def _add_rel_pos(ctx, a: Tensor, pw: Tensor, ph: Tensor, inplace: bool) -> Tensor:
    name = "add_rel_pos"
    require(are_same_shape(pw, ph), name, "pw and ph must have the same shape", pw, ph)
    require(is_contiguous(a) and is_contiguous(pw) and is_contiguous(ph), name, "a, pw, ph must be contiguous",
            a, pw, ph)
    require(pw.type == Type.F32 and ph.type == Type.F32, name, "pw and ph must be F32", pw, ph)
    require(pw.ne[3] == a.ne[2], name, "pw.ne[3] must equal a.ne[2]", a, pw)
    require(pw.ne[0] * pw.ne[0] == a.ne[0], name, "pw.ne[0]^2 must equal a.ne[0]", a, pw)
    require(pw.ne[1] * pw.ne[2] == a.ne[1], name, "pw.ne[1]*pw.ne[2] must equal a.ne[1]", a, pw)
    return same_as(ctx, Op.ADD_REL_POS, a, [a, pw, ph], [int(inplace)], inplace=inplace)


def add_rel_pos(ctx, a: Tensor, pw: Tensor, ph: Tensor) -> Tensor:
    """SAM's decomposed relative positions: a [W*H (keys), W*H (queries), B] plus pw along the key
    column (kw) and ph along the key row (kh); pw, ph [W, W, H, B]."""
    return _add_rel_pos(ctx, a, pw, ph, False)


def add_rel_pos_inplace(ctx, a: Tensor, pw: Tensor, ph: Tensor) -> Tensor:
    return _add_rel_pos(ctx, a, pw, ph, True)


__all__ = [name for name, fn in list(globals().items())
           if not name.startswith("_") and callable(fn) and getattr(fn, "__module__", None) == __name__]
