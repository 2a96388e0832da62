"""ROPE (rope_ext and rope_multi): NORMAL, NEOX, MROPE, IMROPE and VISION modes, frequency
factors, YaRN, rotation offset.

The angle of rotary pair i for a token at position p is ggml's rope_yarn of
theta_extrap = p * base^(-2i/n_dims) / freq_factor[i]; the angles are computed in float64 (ggml
iterates theta *= theta_scale in float32) and the rotation in float32. The per-pair constants
(base powers, YaRN ramp) come from the op params and are made once; positions are read at
every call.
"""
from __future__ import annotations

import functools
import math
import struct

import torch

from ...enums import Op, RopeType
from ...ops.rope import ROPE_TYPE_IMROPE, rope_yarn_corr_dims
from ...types import Type, wide_float
from .table import KernelTable, binds
from .common import view, is_float

KERNELS = KernelTable("rope")

MODES = frozenset({RopeType.NORMAL, RopeType.NEOX, RopeType.MROPE, RopeType.VISION, ROPE_TYPE_IMROPE})


class RopeParams:
    """ggml's rope op params: n_dims, mode, n_ctx_orig, YaRN floats, M-RoPE sections, offset."""

    def __init__(self, raw: bytes):
        p = struct.unpack_from("=16i", raw)
        self.n_dims, self.mode, self.n_ctx_orig = p[1], p[2], p[4]
        (self.freq_base, self.freq_scale, self.ext_factor, self.attn_factor,
         self.beta_fast, self.beta_slow) = struct.unpack_from("=6f", raw, 5 * 4)  # the bits of p[5:11]
        self.sections = tuple(p[11:15])
        self.n_offs = p[15]

    @property
    def multi(self) -> bool:
        return bool(self.mode & RopeType.MROPE)

    @property
    def n_pairs(self) -> int:
        """Rotary pairs: n_dims/2, or n_dims for VISION (which rotates whole rows)."""
        return self.n_dims if self.mode == RopeType.VISION else self.n_dims // 2


@functools.lru_cache(maxsize=256)
def _params_of(raw: bytes) -> RopeParams:
    return RopeParams(raw)


def rope_params(node) -> RopeParams:
    """The node's parsed op params (parsed once per distinct set: compiles look them up often)."""
    return _params_of(node.op_params.tobytes())


def _supports_rope(node) -> bool:
    a, pos, factors = node.src[0], node.src[1], node.src[2]
    if not (is_float(a) and node.type == a.type and pos is not None and pos.type == Type.I32):
        return False
    p = rope_params(node)
    if p.mode not in MODES or p.n_dims % 2 or p.n_offs % 2 or p.n_offs < 0:
        return False
    if p.mode == RopeType.VISION:
        ok_dims = p.n_dims * 2 == a.ne[0] and p.n_offs == 0
    else:
        ok_dims = p.n_offs + p.n_dims <= a.ne[0]
    if p.multi and not (any(s > 0 for s in p.sections[:3]) and sum(p.sections) <= a.ne[0]):
        return False
    return ok_dims and (factors is None or (factors.type == Type.F32 and factors.ne[0] >= p.n_pairs))


@functools.lru_cache(maxsize=256)
def multi_axes(n_pairs: int, sections: tuple, mode: int) -> tuple[tuple, tuple]:
    """For M-RoPE modes: which position axis (0 t, 1 h, 2 w, 3 e) drives each pair, and the
    power of theta_scale it gets (VISION restarts the power at every section start)."""
    s0, s1, s2, _ = sections
    sect_dims = sum(sections)
    sec_w, sec_e = s0 + s1, s0 + s1 + s2
    imrope, vision = mode == ROPE_TYPE_IMROPE, mode == RopeType.VISION
    last_reset = [0, 0, 0, 0]
    axes, powers = [], []
    for i in range(n_pairs):
        sector = i % sect_dims
        if vision:  # the first matching section start resets its axis
            for axis, start in enumerate((0, s0, sec_w, sec_e)):
                if sector == start:
                    last_reset[axis] = i
                    break
        if imrope:
            if sector % 3 == 1 and sector < 3 * s1:
                axis = 1
            elif sector % 3 == 2 and sector < 3 * s2:
                axis = 2
            elif sector % 3 == 0 and sector < 3 * s0:
                axis = 0
            else:
                axis = 3
        else:
            axis = 0 if sector < s0 else 1 if sector < sec_w else 2 if sector < sec_w + s2 else 3
        axes.append(axis)
        powers.append(i - last_reset[axis] if vision else i)
    return tuple(axes), tuple(powers)


@functools.lru_cache(maxsize=256)
def multi_axes_on(n_pairs: int, sections: tuple, mode: int, device: torch.device):
    """multi_axes as device tensors, made once: no host copies while a CUDA graph captures."""
    axes, powers = multi_axes(n_pairs, sections, mode)
    return torch.tensor(axes, device=device), torch.tensor(powers, dtype=wide_float(device), device=device)


@functools.lru_cache(maxsize=256)
def angle_constants(n_pairs: int, n_dims: int, mode: int, sections: tuple, freq_base: float, freq_scale: float,
                     ext_factor: float, n_ctx_orig: int, beta_fast: float, beta_slow: float, device: torch.device):
    """What the angles take from the op params alone, made once per parameter set and device (no
    host copies while a CUDA graph captures): (axes or None, inv_freq [n_pairs], YaRN's
    (1 - mix, mix) or None, the magnitude factor of YaRN or 1)."""
    wide = wide_float(device)
    pairs = torch.arange(n_pairs, dtype=wide, device=device)
    axes, power = None, pairs
    if mode & RopeType.MROPE:
        axes, power = multi_axes_on(n_pairs, sections, mode, device)
    inv_freq = float(freq_base) ** (-2.0 * power / n_dims)
    if ext_factor == 0.0:
        return axes, inv_freq, None, 1.0
    low, high = rope_yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
    ramp = 1.0 - torch.clamp((pairs - low) / max(0.001, high - low), 0.0, 1.0)
    mix = ramp * ext_factor
    return axes, inv_freq, (1.0 - mix, mix), 1.0 + 0.1 * math.log(1.0 / freq_scale)


def rope_angles(positions, n_tokens: int, axes, inv_freq, factors, freq_scale: float, yarn, mscale: float):
    """(cos, sin) [1, n_tokens, 1, n_pairs] float32 from the positions' current values: the angle
    of pair i at position pos is freq_scale * pos * base^(-2i/n_dims) / factor[i] (YaRN mixes in
    the unscaled angle); mscale is attn_factor (times YaRN's magnitude factor)."""
    wide = inv_freq.dtype
    pos = positions.to(wide)
    if axes is not None:
        pos = pos.view(4, n_tokens)[axes].T[None, :, None]  # [1, n_tokens, 1, n_pairs]
    theta_extrap = pos * inv_freq
    if factors is not None:
        theta_extrap = theta_extrap / factors.to(wide)
    theta = theta_extrap if freq_scale == 1.0 else freq_scale * theta_extrap
    if yarn is not None:
        theta = theta * yarn[0] + theta_extrap * yarn[1]
    cos, sin = torch.cos(theta), torch.sin(theta)
    if mscale != 1.0:  # (x * 1.0 == x exactly)
        cos, sin = cos.mul_(mscale), sin.mul_(mscale)
    return cos.float(), sin.float()


def _bind_angles(p: RopeParams, positions: torch.Tensor, n_tokens: int, factors: torch.Tensor | None):
    """fn() -> rope_angles of the views of the positions [n_tokens or 4*n_tokens] and frequency
    factors (their values are read at each call) and the op params' constants."""
    axes, inv_freq, yarn, yarn_mscale = angle_constants(
        p.n_pairs, p.n_dims, p.mode, p.sections, p.freq_base, p.freq_scale, p.ext_factor, p.n_ctx_orig,
        p.beta_fast, p.beta_slow, positions.device)
    if axes is None:
        positions = positions[:n_tokens].view(1, n_tokens, 1, 1)
    factors = factors[:p.n_pairs] if factors is not None else None
    return functools.partial(rope_angles, positions, n_tokens, axes, inv_freq, factors, p.freq_scale, yarn,
                             p.attn_factor * yarn_mscale)


def rotated_span(p: RopeParams, ne0: int) -> tuple[int, int]:
    """(first column, number of columns) that rotate: n_dims after the offset, or whole rows
    for VISION."""
    return (0, ne0) if p.mode == RopeType.VISION else (p.n_offs, p.n_dims)


def pair_halves(x: torch.Tensor, start: int, width: int, interleaved: bool):
    """Views of the two members of each rotary pair in columns [start, start + width) of x:
    (2i, 2i+1) for NORMAL, (i, i + width/2) otherwise."""
    if interleaved:
        return x[..., start:start + width:2], x[..., start + 1:start + width:2]
    half = width // 2
    return x[..., start:start + half], x[..., start + half:start + width]


def _inverse(angles):
    """The angles of the inverse rotation (ROPE_BACK): sin negated."""
    def inverse_angles():
        cos, sin = angles()
        return cos, -sin
    return inverse_angles


def _bind_rope(node):
    """Views of x, the node, positions and factors, and the constant angle factors are taken
    now; the positions' values are read at each call. x is read before the node is written, so
    the node may share x's memory (in-place). ROPE_BACK rotates by the negated angles."""
    a, positions, factors = node.src[0], node.src[1], node.src[2]
    p, n_tokens = rope_params(node), a.ne[2]
    angles = _bind_angles(p, view(positions)[0, 0, 0], n_tokens,
                          view(factors)[0, 0, 0] if factors is not None else None)
    if node.op == Op.ROPE_BACK:
        angles = _inverse(angles)
    vx, dst = view(a), view(node)  # [ne3, n_tokens, n_head, ne0]
    start, width = rotated_span(p, a.ne[0])
    interleaved = p.mode == RopeType.NORMAL
    (x0, x1), (d0, d1) = pair_halves(vx, start, width, interleaved), pair_halves(dst, start, width, interleaved)
    unrotated = ()  # columns outside the rotation are copied, unless the node is x's memory
    if not (dst.data_ptr() == vx.data_ptr() and dst.stride() == vx.stride()):
        if start > 0:
            unrotated += ((dst[..., :start], vx[..., :start]),)
        if start + width < a.ne[0]:
            unrotated += ((dst[..., start + width:], vx[..., start + width:]),)
    return functools.partial(_rotate, angles, x0, x1, d0, d1, unrotated)


def _rotate(angles, x0, x1, d0, d1, unrotated, _node) -> None:
    cos, sin = angles()
    f0, f1 = x0.float(), x1.float()
    a0, b1, a1, b0 = f0 * cos, f1 * sin, f0 * sin, f1 * cos  # every read of x before a write
    torch.sub(a0, b1, out=d0)  # x0 cos - x1 sin
    torch.add(a1, b0, out=d1)  # x0 sin + x1 cos
    for d, x in unrotated:
        d.copy_(x)


@KERNELS.register(Op.ROPE, Op.ROPE_BACK, supports=_supports_rope)
@binds(_bind_rope)
def rope(node):
    _bind_rope(node)(node)
