"""LDP and LDPv2 (MobileVLM and MobileVLM V2): the LLaVA CLIP features (llava.clip_features) of a
24 x 24 patch grid, an MLP, then (clip.cpp's llava graph, ldp / ldpv2 branches):
- LDP: two MobileNetV3-style blocks over the grid (depthwise 3x3 conv, LayerNorm, hardswish,
  squeeze-excite gate, pointwise conv, LayerNorm), the first with a residual, the second of stride 2;
- LDPv2: a 2 x 2 average pool, then a positional depthwise 3x3 conv (PEG) added to its input.
Both give 12 x 12 = 144 tokens."""
from __future__ import annotations

from .. import ops
from ..enums import OpPool
from ..tensor import Tensor
from .llava import clip_features
from .loader import MMProj
from .vit import layer_norm, linear

GRID = 24  # clip.cpp builds the projector for a 24 x 24 patch grid only


def _grid(ctx, x: Tensor) -> Tensor:
    """[C, GRID * GRID] rows -> [GRID, GRID, C, 1] channels."""
    return ops.cont_4d(ctx, ops.permute(ctx, x, 1, 0, 2, 3), GRID, GRID, x.ne[0], 1)


def _channels_norm(ctx, x: Tensor, w: Tensor, b: Tensor, eps: float) -> Tensor:
    """LayerNorm over the channels of a [W, H, C, 1] grid."""
    x = layer_norm(ctx, ops.cont(ctx, ops.permute(ctx, x, 1, 2, 0, 3)), w, b, eps)
    return ops.cont(ctx, ops.permute(ctx, x, 2, 0, 1, 3))


def _mobile_block(ctx, mm: MMProj, i: int, x: Tensor, stride: int) -> Tensor:
    """Block i of [W, H, C, 1] -> [C, W / stride, H / stride, 1]."""
    t = lambda name: mm.tensor(f"mm.model.mb_block.{i}.block.{name}")  # noqa: E731
    eps = mm.vision.eps
    x = ops.conv_2d_dw(ctx, t("0.0.weight"), x, stride, stride, 1, 1, 1, 1)
    x = ops.hardswish(ctx, _channels_norm(ctx, x, t("0.1.weight"), t("0.1.bias"), eps))
    w, h, c = x.ne[0], x.ne[1], x.ne[2]
    gate = ops.reshape_2d(ctx, ops.pool_2d(ctx, x, OpPool.AVG, w, h, w, h, 0, 0), c, 1)   # squeeze-excite
    gate = ops.relu(ctx, linear(ctx, gate, t("1.fc1.weight"), t("1.fc1.bias")))
    gate = ops.hardsigmoid(ctx, linear(ctx, gate, t("1.fc2.weight"), t("1.fc2.bias")))
    x = ops.mul(ctx, x, ops.reshape_4d(ctx, gate, 1, 1, c, 1))
    x = ops.cont(ctx, ops.permute(ctx, ops.reshape_3d(ctx, x, w * h, c, 1), 1, 0, 2, 3))  # [C, W * H]
    x = ops.mul_mat(ctx, t("2.0.weight"), x)
    x = ops.reshape_4d(ctx, x, x.ne[0], w, h, 1)
    return layer_norm(ctx, x, t("2.1.weight"), t("2.1.bias"), eps)


def build(ctx, mm: MMProj, image: Tensor, inputs: list) -> Tensor:
    """[W, H, 3, 1] pixels (24 x 24 patches) -> [n_embd_text, 144] embeddings."""
    mlp = lambda i, x: linear(ctx, x, mm.tensor(f"mm.model.mlp.{i}.weight"), mm.tensor(f"mm.model.mlp.{i}.bias"))  # noqa: E731
    side = GRID * mm.vision.patch_size
    if (image.ne[0], image.ne[1]) != (side, side):
        raise ValueError(f"{mm.path}: {mm.projector} needs a {GRID}x{GRID} patch grid (a {side}x{side} tile), "
                         f"got {image.ne[0]}x{image.ne[1]}")
    x = clip_features(ctx, mm, image)
    if mm.projector == "ldp":
        grid = _grid(ctx, mlp(3, ops.gelu(ctx, mlp(1, x))))
        x = _mobile_block(ctx, mm, 1, grid, 1)
        x = ops.add(ctx, grid, ops.cont(ctx, ops.permute(ctx, x, 2, 0, 1, 3)))  # the residual
        x = _mobile_block(ctx, mm, 2, x, 2)
    else:
        grid = ops.pool_2d(ctx, _grid(ctx, mlp(2, ops.gelu(ctx, mlp(0, x)))), OpPool.AVG, 2, 2, 2, 2, 0, 0)
        peg = ops.conv_2d_dw(ctx, mm.tensor("mm.model.peg.0.weight"), grid, 1, 1, 1, 1, 1, 1)
        peg = ops.add(ctx, ops.cont(ctx, ops.permute(ctx, peg, 1, 2, 0, 3)), mm.tensor("mm.model.peg.0.bias"))
        x = ops.add(ctx, peg, ops.cont(ctx, ops.permute(ctx, grid, 1, 2, 0, 3)))
    return ops.reshape_2d(ctx, x, x.ne[0], x.ne[1] * x.ne[2])
