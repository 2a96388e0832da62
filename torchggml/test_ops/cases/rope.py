"""Cases: ROPE: NORMAL and NEOX with n_dims <= head size, frequency factors, YaRN (including
upstream's n_ctx_orig = 0 corner), F32/F16, strided views (fused QKV, second-half slices),
batches, in-place, rotation offsets; M-RoPE, interleaved M-RoPE and vision modes.

The reference follows ggml's cache loop literally (theta *= theta_scale per pair, running thetas
per axis for the multi modes), in float64.
"""
from __future__ import annotations

import math

import torch

import torchggml as ggml
from .values import uniform, randint, rounded
from .table import CaseTable

CASES = CaseTable()
case = CASES.case

T = ggml.Type
R = ggml.RopeType
IMROPE = ggml.ROPE_TYPE_IMROPE


def yarn_corr_dims_ref(n_dims, n_ctx_orig, base, beta_fast, beta_slow):
    if n_ctx_orig == 0:  # log(0) = -inf: the ramp starts at 0 and ends at -inf
        return 0.0, -math.inf

    def corr_dim(n_rot):
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))
    return max(0.0, math.floor(corr_dim(beta_fast))), min(n_dims - 1.0, math.ceil(corr_dim(beta_slow)))


def _select_axis(sector, sections, mode):
    s0, s1, s2, _ = sections
    if mode == IMROPE:
        if sector % 3 == 1 and sector < 3 * s1:
            return 1
        if sector % 3 == 2 and sector < 3 * s2:
            return 2
        return 0 if sector % 3 == 0 and sector < 3 * s0 else 3
    if sector < s0:
        return 0
    if sector < s0 + s1:
        return 1
    return 2 if sector < s0 + s1 + s2 else 3


def rope_cache_ref(pos, n_pairs, n_dims, mode, sections, ff, n_ctx_orig, base, fs, ef, af, bf, bs):
    """(cos, sin) [n_tokens, n_pairs] in float64 from positions [n_axes, n_tokens]."""
    theta_scale = base ** (-2.0 / n_dims)
    low, high = yarn_corr_dims_ref(n_dims, n_ctx_orig, base, bf, bs)
    multi = bool(mode & R.MROPE)
    thetas = [pos[a].clone() for a in range(pos.shape[0])]  # running theta per axis
    cos, sin = [], []
    for i in range(n_pairs):
        if multi:
            sector = i % sum(sections)
            if mode == R.VISION:  # each section restarts its axis' theta
                starts = (0, sections[0], sections[0] + sections[1], sum(sections[:3]))
                for axis, start in enumerate(starts):
                    if sector == start:
                        thetas[axis] = pos[axis].clone()
                        break
            theta_extrap = thetas[_select_axis(sector, sections, mode)]
        else:
            theta_extrap = thetas[0]
        theta_extrap = theta_extrap / (ff[i] if ff is not None else 1.0)
        theta_interp = fs * theta_extrap
        theta, mscale = theta_interp, af
        if ef != 0.0:
            ramp = 1 - min(1.0, max(0.0, (i - low) / max(0.001, high - low)))
            theta = theta_interp * (1 - ramp * ef) + theta_extrap * ramp * ef
            mscale = af * (1.0 + 0.1 * math.log(1.0 / fs))
        cos.append(torch.cos(theta) * mscale)
        sin.append(torch.sin(theta) * mscale)
        thetas = [t * theta_scale for t in thetas]
    return torch.stack(cos, -1), torch.stack(sin, -1)


def rope_ref(x, pos, ff, n_dims, mode, sections=(0, 0, 0, 0), n_offs=0, n_ctx_orig=0, base=10000.0,
             fs=1.0, ef=0.0, af=1.0, bf=1.0, bs=1.0):
    """x [ne3, n_tokens, n_head, ne0] (torch order), positions as read back ([1, 1, 1, n])."""
    n_tokens = x.shape[1]
    pos = pos.reshape(-1).double().view(-1, n_tokens)  # [1 or 4 axes, n_tokens]
    n_pairs = n_dims if mode == R.VISION else n_dims // 2
    ff = ff.reshape(-1) if ff is not None else None
    cos, sin = rope_cache_ref(pos, n_pairs, n_dims, mode, sections, ff, n_ctx_orig, base, fs, ef, af, bf, bs)
    cos, sin = cos.view(1, n_tokens, 1, n_pairs), sin.view(1, n_tokens, 1, n_pairs)
    i = torch.arange(n_pairs)
    if mode == R.NORMAL:
        first, second = n_offs + 2 * i, n_offs + 2 * i + 1
    elif mode == R.VISION:
        first, second = i, i + n_dims
    else:
        first, second = n_offs + i, n_offs + i + n_dims // 2
    out = x.clone()
    x0, x1 = x[..., first], x[..., second]
    out[..., first] = x0 * cos - x1 * sin
    out[..., second] = x0 * sin + x1 * cos
    return out


def _rope_case(ne, n_dims, mode, type=T.F32, ff=False, n_ctx_orig=0, base=10000.0, fs=1.0, ef=0.0,
               af=1.0, bf=1.0, bs=1.0, sections=None, view=0, n_offs=0, inplace=False, n_ctx=512):
    """view 1: a is the corner of a bigger tensor (fused QKV); view 2: the second half of rows."""
    n_pos = ne[2] * (4 if mode & R.MROPE else 1)

    def build(ctx):
        if view == 1:
            a0 = ggml.new_tensor(ctx, type, [ne[0] * 2, ne[1] * 4, ne[2] * 3, ne[3]])
            a = ggml.view_4d(ctx, a0, *ne, a0.nb[1], a0.nb[2], a0.nb[3], 0)
        elif view == 2:
            a0 = ggml.new_tensor(ctx, type, [ne[0] * 2, *ne[1:]])
            a = ggml.view_4d(ctx, a0, *ne, a0.nb[1], a0.nb[2], a0.nb[3], ne[0] * ggml.type_size(type))
        else:
            a0 = a = ggml.new_tensor(ctx, type, ne)
        pos = ggml.new_tensor_1d(ctx, T.I32, n_pos)
        freq = ggml.new_tensor_1d(ctx, T.F32, n_dims // 2 if mode != R.VISION else n_dims) if ff else None
        if inplace:
            a = ggml.scale(ctx, a, 1.0)  # in place on a computed tensor, not on the input
        if mode & R.MROPE:
            op = ggml.rope_multi_inplace if inplace else ggml.rope_multi
            out = op(ctx, a, pos, freq, n_dims, list(sections), mode, n_ctx_orig, base, fs, ef, af, bf, bs)
        else:
            op = ggml.rope_ext_inplace if inplace else ggml.rope_ext
            out = op(ctx, a, pos, freq, n_dims, mode, n_ctx_orig, base, fs, ef, af, bf, bs)
        if n_offs:
            ggml.rope_set_offset(out, n_offs)
        return out, [a0, pos] + ([freq] if ff else [])

    def ref(a0, pos, freq=None):
        if view == 1:
            a0 = a0[:ne[3], :ne[2], :ne[1], :ne[0]]
        elif view == 2:
            a0 = a0[..., ne[0]:]
        out = rope_ref(a0, pos, freq, n_dims, mode, sections or (0, 0, 0, 0), n_offs, n_ctx_orig, base,
                       fs, ef, af, bf, bs)
        return rounded(type, out)

    init = {1: randint(0, n_ctx)}
    if ff:
        init[2] = uniform(0.9, 1.1)
    desc = (f"type={type.name},ne={ne},n_dims={n_dims},mode={mode},fs={fs},ef={ef},af={af},ff={ff}"
            f"{f',n_ctx_orig={n_ctx_orig},base={base},beta={bf}/{bs}' if n_ctx_orig else ''}"
            f"{f',sections={list(sections)}' if sections else ''}{f',v={view}' if view else ''}"
            f"{f',n_offs={n_offs}' if n_offs else ''}{',inplace' if inplace else ''}")
    case("rope", desc, build, ref, max_nmse=1e-7 if type == T.F32 else 1e-6, init=init)


# llama/neox shapes over upstream's parameter grid (rounded F16 results compare within 1e-6)
for _fs, _ef, _af in [(1.0, 0.0, 1.0), (1.4245, 0.7465, 1.4245), (1.0, 0.7465, 1.0), (0.25, 0.0, 1.0)]:
    for _type in (T.F32, T.F16):
        for _ff in (False, True):
            _rope_case([64, 4, 3, 1], 64, R.NORMAL, _type, _ff, fs=_fs, ef=_ef, af=_af)
            _rope_case([80, 3, 5, 1], 32, R.NEOX, _type, _ff, fs=_fs, ef=_ef, af=_af)
    _rope_case([80, 4, 3, 1], 20, R.NORMAL, fs=_fs, ef=_ef, af=_af, view=1)
    _rope_case([64, 2, 4, 1], 64, R.NEOX, fs=_fs, ef=_ef, af=_af, view=1)

# YaRN with a real context (a ramp between the correction dims), large bases and positions
_rope_case([128, 2, 6, 1], 128, R.NORMAL, n_ctx_orig=4096, fs=0.25, ef=1.0, af=1.0, bf=32.0, bs=1.0, n_ctx=16384)
_rope_case([128, 2, 6, 1], 128, R.NEOX, ff=True, n_ctx_orig=8192, base=1e6, fs=0.125, ef=1.0, af=0.9,
           bf=32.0, bs=1.0, n_ctx=65536)
_rope_case([64, 3, 4, 2], 64, R.NEOX, base=500000.0, n_ctx=100000)  # batch (ne3) and long positions
_rope_case([36, 4, 9, 1], 36, R.NORMAL, view=2)                      # second-half slice (clip's 2-D rope)
_rope_case([36, 4, 9, 1], 36, R.NEOX, view=2, type=T.F16)
for _mode in (R.NORMAL, R.NEOX):
    _rope_case([64, 4, 3, 1], 64, _mode, inplace=True)
    _rope_case([128, 4, 2, 1], 32, _mode, ff=True, fs=1.4245, ef=0.7465, af=1.4245, n_offs=32)
    _rope_case([128, 4, 2, 1], 32, _mode, n_offs=96, inplace=True)

# multi-axis modes: sections as upstream's tests and qwen2-vl / qwen3-vl models use them
_rope_case([128, 3, 2, 1], 128, R.MROPE, sections=(21, 21, 21, 0))
_rope_case([128, 3, 2, 1], 20, R.MROPE, ff=True, sections=(6, 6, 6, 0), fs=1.4245, ef=0.7465, af=1.4245)
_rope_case([128, 3, 4, 1], 128, R.MROPE, sections=(16, 24, 24, 0), base=1e6)
_rope_case([128, 3, 2, 1], 128, IMROPE, sections=(24, 20, 20, 0), base=5e6)
_rope_case([128, 3, 2, 1], 32, IMROPE, ff=True, sections=(10, 10, 10, 0), type=T.F16)
_rope_case([128, 3, 2, 1], 24, IMROPE, sections=(8, 8, 8, 0), n_offs=32)
_rope_case([80, 4, 2, 1], 40, R.VISION, sections=(20, 20, 0, 0))
_rope_case([80, 4, 3, 1], 40, R.VISION, ff=True, sections=(10, 10, 0, 0), fs=1.4245, ef=0.7465, af=1.4245, view=1)
_rope_case([64, 2, 3, 1], 32, R.VISION, sections=(8, 8, 8, 8))


# decode shapes: one token, every head (the CPU's numba kernel), with YaRN and frequency factors
_rope_case([64, 16, 1, 1], 64, R.NORMAL, n_ctx=4096)
_rope_case([128, 8, 1, 1], 128, R.NEOX, ff=True, n_ctx_orig=4096, fs=0.25, ef=1.0, af=1.0, bf=32.0, bs=1.0,
           n_ctx=16384)
_rope_case([128, 8, 1, 1], 64, R.NEOX, type=T.F16, n_offs=64, n_ctx=4096)

# prompt shapes past the threaded kernels' threshold: the tokens over the threads (the CPU's rope_rows)
_rope_case([256, 4, 128, 1], 256, R.NEOX, base=1e6, n_ctx=4096)
_rope_case([128, 8, 80, 1], 64, R.NORMAL, ff=True, n_offs=32)
