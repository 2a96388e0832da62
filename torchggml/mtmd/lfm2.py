"""LFM2 (LFM2-VL): SigLIP over a dynamic-size image, its learned position grid resized to the
image's patch grid (bilinear with antialiasing), a pixel unshuffle of merge x merge patches
(the grid padded to multiples of merge), the optional input LayerNorm (eps 1e-5), and
mm.1 -> GELU -> mm.2 (clip.cpp's siglip graph, lfm2 branch)."""
from __future__ import annotations

from .. import ops
from ..enums import ScaleFlag, ScaleMode
from ..tensor import Tensor
from .loader import MMProj
from .vit import layer_norm, linear, patch_embed, pixel_shuffle, resized_positions, vit

INPUT_NORM_EPS = 1e-5  # nn.LayerNorm's default


def build(ctx, mm: MMProj, image: Tensor, inputs: list) -> Tensor:
    """[W, H, 3, 1] pixels -> [n_embd_text, ceil(W/p/merge) * ceil(H/p/merge)] embeddings."""
    hp, p = mm.vision, mm.vision.patch_size
    px, py = image.ne[0] // p, image.ne[1] // p
    x = ops.add(ctx, patch_embed(ctx, mm, image), resized_positions(ctx, mm.tensor("v.position_embd.weight"), px, py,
                                                                      int(ScaleMode.BILINEAR) | int(ScaleFlag.ANTIALIAS)))
    x = pixel_shuffle(ctx, vit(ctx, mm, x), px, py, hp.n_merge)
    norm_w, norm_b = mm.tensor("mm.input_norm.weight", required=False), mm.tensor("mm.input_norm.bias", required=False)
    if norm_w is not None:  # llama.cpp normalises only when the weight is there
        x = layer_norm(ctx, x, norm_w, norm_b, INPUT_NORM_EPS)
    elif norm_b is not None:
        x = ops.add(ctx, x, norm_b)
    x = ops.gelu(ctx, linear(ctx, x, mm.tensor("mm.1.weight"), mm.tensor("mm.1.bias")))
    return linear(ctx, x, mm.tensor("mm.2.weight"), mm.tensor("mm.2.bias"))
