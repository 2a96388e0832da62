"""Rotary position embeddings: rope_ext (normal and NeoX, frequency factors, YaRN), rope_multi
(M-RoPE, interleaved M-RoPE, vision) and the rotation offset."""
from __future__ import annotations

import numpy as np

from ..enums import Op, RopeType
from ..tensor import Tensor, is_vector, set_op_params_i32
from ..types import Type
from ._common import same_as, require

__all__ = ["rope_ext", "rope_ext_inplace", "rope_multi", "rope_multi_inplace", "rope",
           "rope_inplace", "rope_set_offset", "rope_yarn_corr_dims", "MROPE_SECTIONS",
           "ROPE_TYPE_IMROPE"]

MROPE_SECTIONS = 4
ROPE_TYPE_IMROPE = 40  # interleaved M-RoPE (GGML_ROPE_TYPE_IMROPE)


def _rope_impl(ctx, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, sections, mode: int,
               n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float,
               attn_factor: float, beta_fast: float, beta_slow: float, inplace: bool) -> Tensor:
    require(mode & 1 == 0, "rope_ext", f"mode {mode}: mode & 1 is no longer supported", a)
    require(is_vector(b) and b.type == Type.I32, "rope_ext", "positions must be an I32 vector", b)
    mrope = bool(mode & RopeType.MROPE)
    require(a.ne[2] * (4 if mrope else 1) == b.ne[0], "rope_ext",
            "one position per token (a.ne[2]), four with M-RoPE", a, b)
    require(n_dims <= a.ne[0] and n_dims % 2 == 0, "rope_ext", f"n_dims={n_dims} must be even and <= a.ne[0]", a)
    if c is not None:
        require(c.type == Type.F32 and c.ne[0] >= n_dims // 2, "rope_ext", "freq factors must be F32 [>= n_dims/2]", c)
    if mrope and sections is not None:
        require(len(sections) == MROPE_SECTIONS, "rope_multi", "sections must have 4 entries", a)
        words = [int(s) for s in sections]
    else:
        words = [0] * MROPE_SECTIONS
    params = [0, int(n_dims), int(mode), 0, int(n_ctx_orig),
              float(freq_base), float(freq_scale), float(ext_factor), float(attn_factor),
              float(beta_fast), float(beta_slow), *words, 0]
    return same_as(ctx, Op.ROPE, a, [a, b, c], params, inplace=inplace)


def rope_ext(ctx, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, mode: int, n_ctx_orig: int,
             freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
             beta_fast: float, beta_slow: float, inplace: bool = False) -> Tensor:
    """Rotate the first n_dims of each row of a [head_dim, n_head, n_tokens, ne3] by positions b
    (I32 [n_tokens]); c holds optional per-pair frequency divisors (F32 [n_dims/2]).
    mode: RopeType.NORMAL rotates pairs (2i, 2i+1), RopeType.NEOX pairs (i, i + n_dims/2)."""
    return _rope_impl(ctx, a, b, c, n_dims, None, mode, n_ctx_orig, freq_base, freq_scale,
                      ext_factor, attn_factor, beta_fast, beta_slow, inplace)


def rope_ext_inplace(ctx, a, b, c, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                     attn_factor, beta_fast, beta_slow):
    return rope_ext(ctx, a, b, c, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                    attn_factor, beta_fast, beta_slow, inplace=True)


def rope_multi(ctx, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, sections, mode: int,
               n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float,
               attn_factor: float, beta_fast: float, beta_slow: float, inplace: bool = False) -> Tensor:
    """Multi-axis RoPE (mode MROPE, IMROPE or VISION): b holds 4 positions per token
    (I32 [4 * n_tokens]: all time positions, then height, width, extra); `sections` (4 ints)
    say how many rotary pairs each axis owns."""
    return _rope_impl(ctx, a, b, c, n_dims, sections, mode, n_ctx_orig, freq_base, freq_scale,
                      ext_factor, attn_factor, beta_fast, beta_slow, inplace)


def rope_multi_inplace(ctx, a, b, c, n_dims, sections, mode, n_ctx_orig, freq_base, freq_scale,
                       ext_factor, attn_factor, beta_fast, beta_slow):
    return rope_multi(ctx, a, b, c, n_dims, sections, mode, n_ctx_orig, freq_base, freq_scale,
                      ext_factor, attn_factor, beta_fast, beta_slow, inplace=True)


def rope(ctx, a: Tensor, b: Tensor, n_dims: int, mode: int) -> Tensor:
    return rope_ext(ctx, a, b, None, n_dims, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)


def rope_inplace(ctx, a: Tensor, b: Tensor, n_dims: int, mode: int) -> Tensor:
    return rope_ext(ctx, a, b, None, n_dims, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0, inplace=True)


def rope_set_offset(a: Tensor, n_offs: int) -> Tensor:
    """Rotate channels [n_offs, n_offs + n_dims) instead of [0, n_dims) (not for VISION)."""
    require(a.op in (Op.ROPE, Op.ROPE_BACK), "rope_set_offset", "a must be a rope or rope_back node", a)
    require(n_offs >= 0 and n_offs % 2 == 0, "rope_set_offset", f"n_offs={n_offs} must be even and >= 0", a)
    require(a.op_params[2] != RopeType.VISION, "rope_set_offset", "not for VISION mode", a)
    require(n_offs + a.op_params[1] <= a.ne[0], "rope_set_offset", "n_offs + n_dims must be <= ne[0]", a)
    set_op_params_i32(a, 15, n_offs)
    return a


def rope_yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                        beta_slow: float) -> tuple[float, float]:
    """The dims where YaRN's ramp starts and ends (ggml_rope_yarn_corr_dims), in float32 as ggml
    computes them (floor and ceil make the rounding matter)."""
    f32 = np.float32

    def corr_dim(n_rot):
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = f32(n_ctx_orig) / (f32(n_rot) * f32(2) * f32(np.pi))
            return f32(n_dims) * np.log(ratio) / (f32(2) * np.log(f32(freq_base)))

    start = np.floor(corr_dim(beta_fast))
    end = np.ceil(corr_dim(beta_slow))
    low = f32(0) if f32(0) > start else start  # C's MAX / MIN, NaN included
    high = f32(n_dims - 1) if f32(n_dims - 1) < end else end
    return float(low), float(high)
