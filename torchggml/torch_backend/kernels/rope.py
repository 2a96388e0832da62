"""ROPE (rope_ext and rope_multi): NORMAL, NEOX, MROPE, IMROPE and VISION modes, frequency
factors, YaRN, rotation offset.

The angle of rotary pair i for a token at position p is ggml's rope_yarn of
theta_extrap = p * base^(-2i/n_dims) / freq_factor[i]; the angles are computed in float64 (ggml
iterates theta *= theta_scale in float32) and the rotation in float32.
"""
from __future__ import annotations

import functools
import math

import torch

from ...enums import Op, RopeType
from ...ops.rope import ROPE_TYPE_IMROPE, rope_yarn_corr_dims
from ...tensor import get_op_params_f32
from . import CPU_KERNELS
from .common import view, as_float, write, is_float
from .norm import wide_float

MODES = frozenset({RopeType.NORMAL, RopeType.NEOX, RopeType.MROPE, RopeType.VISION, ROPE_TYPE_IMROPE})


class RopeParams:
    """ggml's rope op params: n_dims, mode, n_ctx_orig, YaRN floats, M-RoPE sections, offset."""

    def __init__(self, node):
        p = node.op_params
        self.n_dims, self.mode, self.n_ctx_orig = p[1], p[2], p[4]
        (self.freq_base, self.freq_scale, self.ext_factor, self.attn_factor,
         self.beta_fast, self.beta_slow) = (get_op_params_f32(node, i) for i in range(5, 11))
        self.sections = tuple(p[11:15])
        self.n_offs = p[15]

    @property
    def multi(self) -> bool:
        return bool(self.mode & RopeType.MROPE)

    @property
    def n_pairs(self) -> int:
        """Rotary pairs: n_dims/2, or n_dims for VISION (which rotates whole rows)."""
        return self.n_dims if self.mode == RopeType.VISION else self.n_dims // 2


def _supports_rope(node) -> bool:
    a, pos, factors = node.src[0], node.src[1], node.src[2]
    if not (is_float(a) and node.type == a.type and pos is not None and pos.type.name == "I32"):
        return False
    p = RopeParams(node)
    if p.mode not in MODES or p.n_dims % 2 or p.n_offs % 2 or p.n_offs < 0:
        return False
    if p.mode == RopeType.VISION:
        ok_dims = p.n_dims * 2 == a.ne[0] and p.n_offs == 0
    else:
        ok_dims = p.n_offs + p.n_dims <= a.ne[0]
    if p.multi and not (any(s > 0 for s in p.sections[:3]) and sum(p.sections) <= a.ne[0]):
        return False
    return ok_dims and (factors is None or (factors.type.name == "F32" and factors.ne[0] >= p.n_pairs))


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


def rope_angles(p: RopeParams, positions: torch.Tensor, n_tokens: int,
                factors: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [n_tokens, n_pairs] float32, attn_factor (and YaRN's mscale) included."""
    device = positions.device
    wide = wide_float(device)
    pairs = torch.arange(p.n_pairs, dtype=wide, device=device)
    positions = positions.reshape(-1).to(wide)
    if p.multi:
        axes, power = multi_axes_on(p.n_pairs, p.sections, p.mode, device)
        pos = positions.view(4, n_tokens)[axes].T  # [n_tokens, n_pairs]
    else:
        pos = positions[:n_tokens, None]
        power = pairs
    theta_extrap = pos * float(p.freq_base) ** (-2.0 * power / p.n_dims)
    if factors is not None:
        theta_extrap = theta_extrap / factors.reshape(-1)[:p.n_pairs].to(wide)
    theta = p.freq_scale * theta_extrap
    mscale = p.attn_factor
    if p.ext_factor != 0.0:
        low, high = rope_yarn_corr_dims(p.n_dims, p.n_ctx_orig, p.freq_base, p.beta_fast, p.beta_slow)
        ramp = 1.0 - torch.clamp((pairs - low) / max(0.001, high - low), 0.0, 1.0)
        mix = ramp * p.ext_factor
        theta = theta * (1.0 - mix) + theta_extrap * mix
        mscale *= 1.0 + 0.1 * math.log(1.0 / p.freq_scale)
    return (torch.cos(theta) * mscale).float(), (torch.sin(theta) * mscale).float()


@CPU_KERNELS.register(Op.ROPE, supports=_supports_rope)
def rope(node):
    a, positions, factors = node.src[0], node.src[1], node.src[2]
    p = RopeParams(node)
    x = as_float(a)  # [ne3, n_tokens, n_head, ne0]
    n_tokens = a.ne[2]
    cos, sin = rope_angles(p, view(positions), n_tokens, as_float(factors) if factors is not None else None)
    cos, sin = cos.view(1, n_tokens, 1, -1), sin.view(1, n_tokens, 1, -1)
    start, width = (0, a.ne[0]) if p.mode == RopeType.VISION else (p.n_offs, p.n_dims)
    part = x[..., start:start + width]
    if p.mode == RopeType.NORMAL:  # pairs (2i, 2i+1)
        x0, x1 = part[..., 0::2], part[..., 1::2]
    else:  # pairs (i, i + width/2)
        x0, x1 = part[..., :width // 2], part[..., width // 2:]
    y0 = x0 * cos - x1 * sin
    y1 = x0 * sin + x1 * cos
    rotated = torch.stack((y0, y1), -1).flatten(-2) if p.mode == RopeType.NORMAL else torch.cat((y0, y1), -1)
    write(node, torch.cat((x[..., :start], rotated, x[..., start + width:]), -1))
