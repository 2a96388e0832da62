"""The whisper encoder every audio projector here starts from (clip.cpp's whisper-enc graph): two
1-D convolutions with erf GELU, the second of stride 2; learned positions; pre-norm blocks with
LayerNorms and no key bias; a 2-frame average pool before the post-norm where the projector has
one (qwen2a, voxtral); and the frame stacking ultravox and voxtral project (stack_factor frames
as one row, the last zero-padded)."""
from __future__ import annotations

from .. import ops
from ..enums import OpPool
from ..tensor import Tensor
from .loader import MMProj
from .vit import vit


def encode(ctx, mm: MMProj, mel: Tensor, pool: bool) -> Tensor:
    """Mel frames [n_frames, n_mel] -> [n_embd, n_frames / 2 (/ 4 with pool)]."""
    t = lambda name: mm.tensor(name)  # noqa: E731
    x = ops.gelu_erf(ctx, ops.add(ctx, ops.conv_1d_ph(ctx, t("a.conv1d.1.weight"), mel, 1, 1), t("a.conv1d.1.bias")))
    x = ops.gelu_erf(ctx, ops.add(ctx, ops.conv_1d_ph(ctx, t("a.conv1d.2.weight"), x, 2, 1), t("a.conv1d.2.bias")))
    x = ops.cont(ctx, ops.transpose(ctx, ops.reshape_2d(ctx, x, x.ne[0], x.ne[1])))   # [n_embd, n_pos]
    pos = t("a.position_embd.weight")
    if pos.ne[1] < x.ne[1]:
        raise ValueError(f"{mm.path}: {x.ne[1]} audio positions but a.position_embd.weight has {pos.ne[1]}")
    x = ops.add(ctx, x, ops.view_2d(ctx, pos, pos.ne[0], x.ne[1], pos.nb[1], 0))

    def average_pairs(h):  # average of each 2 frames
        h = ops.pool_1d(ctx, ops.cont(ctx, ops.transpose(ctx, h)), OpPool.AVG, 2, 2, 0)
        return ops.cont(ctx, ops.transpose(ctx, h))
    return vit(ctx, mm, x, prefix="a", before_post_norm=average_pairs if pool else None)


def stack_frames(ctx, x: Tensor, factor: int) -> Tensor:
    """[n_embd, n] -> [n_embd * factor, ceil(n / factor)]: each `factor` frames as one row."""
    if factor <= 1:
        return x
    total, stride = x.ne[0] * x.ne[1], x.ne[0] * factor
    x = ops.reshape_1d(ctx, x, total)
    if total % stride:
        x = ops.pad(ctx, x, -total % stride, 0, 0, 0)
    return ops.reshape_2d(ctx, x, stride, x.ne[0] // stride)
