"""INTERNVL (InternVL 2.5 / 3): InternViT (a class token after the patches, learned positions,
layer scales), the class token dropped, a pixel shuffle of merge x merge patches into one row,
and the projector LayerNorm (eps 1e-5) -> mm.model.mlp.1 -> GELU -> mm.model.mlp.3
(clip.cpp's internvl graph). The 6B ViT (n_embd 3200, 45 layers) uses RMS norms."""
from __future__ import annotations

from .. import ops
from ..tensor import Tensor
from .loader import MMProj
from .vit import layer_norm, linear, patch_embed, pixel_shuffle, vit

PROJECTOR_EPS = 1e-5  # PyTorch's LayerNorm default, which InternVL's mlp1 keeps


def build(ctx, mm: MMProj, image: Tensor, inputs: list) -> Tensor:
    """[W, H, 3, 1] pixels (one tile) -> [n_embd_text, n_patches / merge^2] embeddings."""
    hp, p = mm.vision, mm.vision.patch_size
    if image.ne[0] != image.ne[1]:
        raise ValueError(f"{mm.path}: internvl encodes square tiles, got {image.ne[0]}x{image.ne[1]}")
    x = patch_embed(ctx, mm, image)
    n_patches = x.ne[1]
    cls = mm.tensor("v.class_embd")
    x = ops.concat(ctx, x, ops.reshape_2d(ctx, cls, cls.ne[0], 1), 1)  # after the patches, as clip.cpp
    x = ops.add(ctx, x, mm.tensor("v.position_embd.weight"))
    x = vit(ctx, mm, x, rms=hp.n_embd == 3200 and hp.n_layer == 45)
    x = ops.cont(ctx, ops.view_2d(ctx, x, x.ne[0], n_patches, x.nb[1], 0))  # the class token dropped
    x = pixel_shuffle(ctx, x, image.ne[0] // p, image.ne[1] // p, hp.n_merge)  # clip.cpp's, on square tiles
    mlp = lambda i, part: mm.tensor(f"mm.model.mlp.{i}.{part}")  # noqa: E731
    x = layer_norm(ctx, x, mlp(0, "weight"), mlp(0, "bias"), PROJECTOR_EPS)
    x = ops.gelu(ctx, linear(ctx, x, mlp(1, "weight"), mlp(1, "bias")))
    return linear(ctx, x, mlp(3, "weight"), mlp(3, "bias"))
