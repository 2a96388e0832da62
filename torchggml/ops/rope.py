"""Rotary position embeddings: rope_ext (normal and NeoX, frequency factors, YaRN)."""
from __future__ import annotations

import math

from ..enums import Op, RopeType
from ..tensor import Tensor, is_vector
from ..types import Type
from ._common import same_as, require


def rope_ext(ctx, a: Tensor, b: Tensor, c: Tensor | None, n_dims: int, mode: int, n_ctx_orig: int,
             freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
             beta_fast: float, beta_slow: float, inplace: bool = False) -> Tensor:
    """Rotate the first n_dims of each row of a [head_dim, n_head, n_tokens, ne3] by positions b
    (I32 [n_tokens]); c holds optional per-pair frequency divisors (F32 [n_dims/2])."""
    require(is_vector(b) and b.type == Type.I32, "rope_ext", "positions must be an I32 vector", b)
    mrope = bool(mode & RopeType.MROPE)
    require(a.ne[2] * (4 if mrope else 1) == b.ne[0], "rope_ext", "one position per token (a.ne[2])", a, b)
    require(n_dims <= a.ne[0] and n_dims % 2 == 0, "rope_ext", f"n_dims={n_dims} must be even and <= a.ne[0]", a)
    if c is not None:
        require(c.type == Type.F32 and c.ne[0] >= n_dims // 2, "rope_ext", "freq factors must be F32 [n_dims/2]", c)
    params = [0, int(n_dims), int(mode), 0, int(n_ctx_orig),
              float(freq_base), float(freq_scale), float(ext_factor), float(attn_factor),
              float(beta_fast), float(beta_slow)]
    return same_as(ctx, Op.ROPE, a, [a, b, c], params, inplace=inplace)


def rope_ext_inplace(ctx, a, b, c, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                     attn_factor, beta_fast, beta_slow):
    return rope_ext(ctx, a, b, c, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                    attn_factor, beta_fast, beta_slow, inplace=True)


def rope(ctx, a: Tensor, b: Tensor, n_dims: int, mode: int) -> Tensor:
    return rope_ext(ctx, a, b, None, n_dims, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)


def rope_yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                        beta_slow: float) -> tuple[float, float]:
    """The dims where YaRN's ramp starts and ends (ggml_rope_yarn_corr_dims)."""
    def corr_dim(n_rot):
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(freq_base))
    start = math.floor(corr_dim(beta_fast))
    end = math.ceil(corr_dim(beta_slow))
    return max(0.0, float(start)), min(float(n_dims - 1), float(end))
