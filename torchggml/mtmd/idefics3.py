"""IDEFICS3 (SmolVLM): SigLIP, a pixel shuffle of merge x merge patches into one row, and a
linear projection (mm.model.fc) into the text model's width."""
from __future__ import annotations

from .. import ops
from ..tensor import Tensor
from .loader import MMProj
from .vit import embed_image, pixel_shuffle, vit


def build(ctx, mm: MMProj, image: Tensor, inputs: list) -> Tensor:
    """[W, H, 3, 1] pixels -> [n_embd_text, (W/p/merge)*(H/p/merge)] embeddings."""
    p = mm.vision.patch_size
    x = vit(ctx, mm, embed_image(ctx, mm, image))
    x = pixel_shuffle(ctx, x, image.ne[0] // p, image.ne[1] // p, mm.vision.n_merge)
    return ops.mul_mat(ctx, mm.tensor("mm.model.fc.weight"), x)
