"""QWEN2A (Qwen2-Audio): the whisper encoder (two 1-D convolutions with erf GELU, the second of
stride 2; learned positions; pre-norm blocks with LayerNorms, no key bias), a 2-frame average
pool before the post-norm, and a linear projection mm.a.fc (clip.cpp's whisper-enc graph)."""
from __future__ import annotations

from .. import ops
from ..enums import OpPool
from ..tensor import Tensor
from .loader import MMProj
from .vit import linear, vit


def build(ctx, mm: MMProj, mel: Tensor, inputs: list) -> Tensor:
    """Mel frames [n_frames, n_mel] -> [n_embd_text, n_frames / 4] embeddings."""
    t = lambda name: mm.tensor(name)  # noqa: E731
    x = ops.gelu_erf(ctx, ops.add(ctx, ops.conv_1d_ph(ctx, t("a.conv1d.1.weight"), mel, 1, 1), t("a.conv1d.1.bias")))
    x = ops.gelu_erf(ctx, ops.add(ctx, ops.conv_1d_ph(ctx, t("a.conv1d.2.weight"), x, 2, 1), t("a.conv1d.2.bias")))
    x = ops.cont(ctx, ops.transpose(ctx, ops.reshape_2d(ctx, x, x.ne[0], x.ne[1])))   # [n_embd, n_pos]
    pos = t("a.position_embd.weight")
    if pos.ne[1] < x.ne[1]:
        raise ValueError(f"{mm.path}: {x.ne[1]} audio positions but a.position_embd.weight has {pos.ne[1]}")
    x = ops.add(ctx, x, ops.view_2d(ctx, pos, pos.ne[0], x.ne[1], pos.nb[1], 0))

    def pool(h):  # average of each 2 frames
        h = ops.pool_1d(ctx, ops.cont(ctx, ops.transpose(ctx, h)), OpPool.AVG, 2, 2, 0)
        return ops.cont(ctx, ops.transpose(ctx, h))
    x = vit(ctx, mm, x, prefix="a", before_post_norm=pool)
    return linear(ctx, x, t("mm.a.fc.weight"), t("mm.a.fc.bias"))
