"""MLP (LLaVA 1.5): a CLIP ViT with a class token and a pre-norm, read at its second-to-last
layer, n_patches rows through mm.0 -> GELU -> mm.2 (clip.cpp's llava graph). clip_features is
the encoder the LDP projectors (ldp.py) share."""
from __future__ import annotations

from .. import ops
from ..tensor import Tensor
from .loader import MMProj
from .vit import linear, patch_embed, vit


def clip_features(ctx, mm: MMProj, image: Tensor) -> Tensor:
    """[W, H, 3, 1] pixels (square) -> the ViT's [n_embd, n_patches] rows at its second-to-last layer."""
    if image.ne[0] != image.ne[1]:
        raise ValueError(f"{mm.path}: {mm.projector} encodes square images, got {image.ne[0]}x{image.ne[1]}")
    x = patch_embed(ctx, mm, image)
    n_patches = x.ne[1]
    cls = mm.tensor("v.class_embd", required=False)
    if cls is not None:
        x = ops.concat(ctx, x, ops.reshape_2d(ctx, cls, cls.ne[0], 1), 1)  # after the patches, as clip.cpp
    x = ops.add(ctx, x, mm.tensor("v.position_embd.weight"))
    x = vit(ctx, mm, x, n_layer=mm.vision.n_layer - 1)
    if cls is not None:  # clip.cpp reads rows 1..n_patches (the class token, appended last, included)
        x = ops.view_2d(ctx, x, x.ne[0], n_patches, x.nb[1], x.nb[1])
    return x


def build(ctx, mm: MMProj, image: Tensor, inputs: list) -> Tensor:
    """[W, H, 3, 1] pixels (square) -> [n_embd_text, n_patches] embeddings."""
    x = ops.gelu(ctx, linear(ctx, clip_features(ctx, mm, image), mm.tensor("mm.0.weight"), mm.tensor("mm.0.bias")))
    w2 = mm.tensor("mm.2.weight", required=False)
    return x if w2 is None else linear(ctx, x, w2, mm.tensor("mm.2.bias"))
