"""QWEN3VL (Qwen3-VL's vision tower, projector type qwen3vl_merger): Qwen2-VL's two patch
convolutions (plus a bias) and 2 x 2 block order, learned positions resized to the patch grid
(bilinear, align corners) in that order, LayerNorm blocks with one fused q/k/v projection and
vision M-RoPE, the merger mm.0 -> GELU -> mm.2 over each 2 x 2 block; and deepstack: the output of
each layer with v.deepstack.{il}.* tensors, its 2 x 2 blocks through LayerNorm -> fc1 -> GELU ->
fc2, appended to each row after the merger's (clip.cpp's qwen3vl graph). Rows are
n_embd_text * (1 + deepstack layers) wide; the text model adds the extra slices to its first
layers' outputs."""
from __future__ import annotations

from .. import ops
from ..enums import ScaleFlag, ScaleMode
from ..tensor import Tensor
from .loader import MMProj
from .qwen2vl import block_order, block_patches, vision_rope
from .vit import layer_norm, linear, resized_positions, vit


def build(ctx, mm: MMProj, image: Tensor, inputs: list) -> Tensor:
    """[W, H, 3, 1] pixels (multiples of 2 patches) -> [n_embd_text * (1 + n_deepstack), n_patches / 4]."""
    hp, e = mm.vision, mm.vision.n_embd
    x, px, py = block_patches(ctx, mm, image)
    x = ops.add(ctx, x, mm.tensor("v.patch_embd.bias"))
    pos = resized_positions(ctx, mm.tensor("v.position_embd.weight"), px, py,
                            int(ScaleMode.BILINEAR) | int(ScaleFlag.ALIGN_CORNERS))
    x = ops.add(ctx, x, block_order(ctx, pos, px, py))
    deepstack = []

    def stack(il, h):
        opt = lambda name: mm.tensor(f"v.deepstack.{il}.{name}", required=False)  # noqa: E731
        if opt("fc1.weight") is None:
            return
        f = layer_norm(ctx, ops.reshape_2d(ctx, h, e * 4, px * py // 4), opt("norm.weight"), opt("norm.bias"), hp.eps)
        f = ops.gelu(ctx, linear(ctx, f, opt("fc1.weight"), opt("fc1.bias")))
        deepstack.append(linear(ctx, f, opt("fc2.weight"), opt("fc2.bias")))

    x = vit(ctx, mm, x, rope=vision_rope(ctx, inputs, px, py, hp.d_head), layer_out=stack)
    x = ops.reshape_2d(ctx, x, e * 4, px * py // 4)
    x = ops.gelu(ctx, linear(ctx, x, mm.tensor("mm.0.weight"), mm.tensor("mm.0.bias")))
    x = linear(ctx, x, mm.tensor("mm.2.weight"), mm.tensor("mm.2.bias"))
    for f in deepstack:
        x = ops.concat(ctx, x, f, 0)
    return x
