"""ULTRAVOX: the whisper encoder (no pool), stack_factor frames stacked as one row, and
Ultravox's projector: RMS norm (eps 1e-6), mm.a.mlp.1, SwiGLU with the silu on the second half,
RMS norm, mm.a.mlp.2 (clip.cpp's whisper-enc graph, ultravox branch)."""
from __future__ import annotations

from .. import ops
from ..tensor import Tensor
from .loader import MMProj
from .whisper import encode, stack_frames

NORM_EPS = 1e-6


def build(ctx, mm: MMProj, mel: Tensor, inputs: list) -> Tensor:
    """Mel frames [n_frames, n_mel] -> [n_embd_text, ceil(n_frames / 2 / stack_factor)] embeddings."""
    x = stack_frames(ctx, encode(ctx, mm, mel, pool=False), mm.audio.stack_factor)
    x = ops.mul(ctx, ops.rms_norm(ctx, x, NORM_EPS), mm.tensor("mm.a.norm_pre.weight"))
    x = ops.swiglu_swapped(ctx, ops.mul_mat(ctx, mm.tensor("mm.a.mlp.1.weight"), x))
    x = ops.mul(ctx, ops.rms_norm(ctx, x, NORM_EPS), mm.tensor("mm.a.norm_mid.weight"))
    return ops.mul_mat(ctx, mm.tensor("mm.a.mlp.2.weight"), x)
