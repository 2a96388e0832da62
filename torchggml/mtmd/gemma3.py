"""GEMMA3: SigLIP, then a merge x merge average pool of the patch grid, an RMS norm and a linear
projection into the text model's width (clip.cpp's siglip graph, gemma3 branch)."""
from __future__ import annotations

from .. import ops
from ..enums import OpPool
from ..tensor import Tensor
from ..types import is_quantized
from .loader import MMProj
from .vit import embed_image, vit


def build(ctx, mm: MMProj, image: Tensor, inputs: list) -> Tensor:
    """[W, H, 3, 1] pixels (square) -> [n_embd_text, (side / merge)^2] embeddings."""
    hp = mm.vision
    side = image.ne[0] // hp.patch_size
    if image.ne[0] != image.ne[1]:
        raise ValueError(f"{mm.path}: gemma3 encodes square images, got {image.ne[0]}x{image.ne[1]}")
    x = vit(ctx, mm, embed_image(ctx, mm, image))                  # [n_embd, side*side]
    x = ops.cont_4d(ctx, ops.transpose(ctx, x), side, side, hp.n_embd, 1)
    k = hp.n_merge
    x = ops.pool_2d(ctx, x, OpPool.AVG, k, k, k, k, 0, 0)          # [side/k, side/k, n_embd, 1]
    x = ops.reshape_3d(ctx, x, x.ne[0] * x.ne[1], hp.n_embd, 1)
    x = ops.cont(ctx, ops.transpose(ctx, x))                       # [n_embd, n_tokens]
    x = ops.mul(ctx, ops.rms_norm(ctx, x, hp.eps), mm.tensor("mm.soft_emb_norm.weight"))
    proj = mm.tensor("mm.input_projection.weight")
    if is_quantized(proj.type):  # a transposed block type cannot be made contiguous
        raise ValueError(f"{mm.path}: mm.input_projection.weight is {proj.type.name}; llama.cpp transposes it in "
                         f"the graph, which needs F32 or F16")
    proj = ops.cont(ctx, ops.transpose(ctx, proj))
    return ops.mul_mat(ctx, proj, x)
