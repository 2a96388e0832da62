"""LFM2 (LFM2-VL): SigLIP over a dynamic-size image, its learned position grid resized to the
image's patch grid (bilinear with antialiasing), a pixel unshuffle of merge x merge patches
(the grid padded to multiples of merge), the optional input LayerNorm (eps 1e-5), and
mm.1 -> GELU -> mm.2 (clip.cpp's siglip graph, lfm2 branch)."""
from __future__ import annotations

import math

from .. import ops
from ..enums import ScaleFlag, ScaleMode
from ..tensor import Tensor
from .loader import MMProj
from .vit import layer_norm, linear, patch_embed, pixel_shuffle, vit

INPUT_NORM_EPS = 1e-5  # nn.LayerNorm's default


def resized_positions(ctx, pos: Tensor, width: int, height: int) -> Tensor:
    """The square grid of position rows [n_embd, side^2] resampled to [n_embd, width * height]."""
    n_embd, side = pos.ne[0], math.isqrt(pos.ne[1])
    if width == side and height == side:
        return pos
    x = ops.permute(ctx, ops.reshape_3d(ctx, pos, n_embd, side, side), 2, 0, 1, 3)   # [side, side, n_embd]
    x = ops.interpolate(ctx, x, width, height, n_embd, 1, int(ScaleMode.BILINEAR) | int(ScaleFlag.ANTIALIAS))
    return ops.cont_2d(ctx, ops.permute(ctx, x, 1, 2, 0, 3), n_embd, width * height)


def build(ctx, mm: MMProj, image: Tensor, inputs: list) -> Tensor:
    """[W, H, 3, 1] pixels -> [n_embd_text, ceil(W/p/merge) * ceil(H/p/merge)] embeddings."""
    hp, p = mm.vision, mm.vision.patch_size
    px, py = image.ne[0] // p, image.ne[1] // p
    x = ops.add(ctx, patch_embed(ctx, mm, image), resized_positions(ctx, mm.tensor("v.position_embd.weight"), px, py))
    x = pixel_shuffle(ctx, vit(ctx, mm, x), px, py, hp.n_merge)
    norm_w, norm_b = mm.tensor("mm.input_norm.weight", required=False), mm.tensor("mm.input_norm.bias", required=False)
    if norm_w is not None:  # llama.cpp normalises only when the weight is there
        x = layer_norm(ctx, x, norm_w, norm_b, INPUT_NORM_EPS)
    elif norm_b is not None:
        x = ops.add(ctx, x, norm_b)
    x = ops.gelu(ctx, linear(ctx, x, mm.tensor("mm.1.weight"), mm.tensor("mm.1.bias")))
    return linear(ctx, x, mm.tensor("mm.2.weight"), mm.tensor("mm.2.bias"))
