"""QWEN2A (Qwen2-Audio): the whisper encoder with its 2-frame average pool, and a linear
projection mm.a.fc (clip.cpp's whisper-enc graph, qwen2a branch)."""
from __future__ import annotations

from ..tensor import Tensor
from .loader import MMProj
from .vit import linear
from .whisper import encode


def build(ctx, mm: MMProj, mel: Tensor, inputs: list) -> Tensor:
    """Mel frames [n_frames, n_mel] -> [n_embd_text, n_frames / 4] embeddings."""
    return linear(ctx, encode(ctx, mm, mel, pool=True), mm.tensor("mm.a.fc.weight"), mm.tensor("mm.a.fc.bias"))
