"""VOXTRAL: the whisper encoder with its 2-frame average pool, stack_factor frames stacked as
one row, and mm.a.mlp.1 -> erf GELU -> mm.a.mlp.2 (clip.cpp's whisper-enc graph, voxtral branch)."""
from __future__ import annotations

from .. import ops
from ..tensor import Tensor
from .loader import MMProj
from .whisper import encode, stack_frames


def build(ctx, mm: MMProj, mel: Tensor, inputs: list) -> Tensor:
    """Mel frames [n_frames, n_mel] -> [n_embd_text, ceil(n_frames / 4 / stack_factor)] embeddings."""
    x = stack_frames(ctx, encode(ctx, mm, mel, pool=True), mm.audio.stack_factor)
    x = ops.gelu_erf(ctx, ops.mul_mat(ctx, mm.tensor("mm.a.mlp.1.weight"), x))
    return ops.mul_mat(ctx, mm.tensor("mm.a.mlp.2.weight"), x)
