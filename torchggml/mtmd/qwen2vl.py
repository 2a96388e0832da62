"""QWEN2VL (Qwen2-VL's vision tower, projector type qwen2vl_merger): two patch convolutions (the
two frames of a temporal patch; a still image feeds both), patches ordered by 2 x 2 blocks,
M-RoPE over (row, column) per head in GGML_ROPE_TYPE_VISION mode, full attention, and the merger:
each 2 x 2 block's four rows as one, through mm.0 -> GELU -> mm.2 (clip.cpp's qwen2vl graph
without window attention, which only Qwen2.5-VL uses)."""
from __future__ import annotations

import numpy as np

from .. import ops
from ..context import new_tensor_1d
from ..enums import RopeType
from ..tensor import Tensor, set_input, set_name
from ..types import Type
from .loader import MMProj
from .vit import linear, vit


def positions(px: int, py: int, merge: int) -> np.ndarray:
    """I32 [4 * n_pos]: each patch's row, column, row, column, in the 2 x 2 block order."""
    rows, cols = [], []
    for y in range(0, py, merge):
        for x in range(0, px, merge):
            for dy in range(2):
                for dx in range(2):
                    rows.append(y + dy)
                    cols.append(x + dx)
    return np.array(rows + cols + rows + cols, dtype=np.int32)


def build(ctx, mm: MMProj, image: Tensor, inputs: list) -> Tensor:
    """[W, H, 3, 1] pixels (multiples of 2 patches) -> [n_embd_text, n_patches / 4] embeddings."""
    hp, p = mm.vision, mm.vision.patch_size
    px, py, e = image.ne[0] // p, image.ne[1] // p, hp.n_embd
    if px % 2 or py % 2:
        raise ValueError(f"{mm.path}: qwen2vl needs an even number of patches per side, got {px}x{py}")
    conv = lambda name: ops.conv_2d(ctx, mm.tensor(name), image, p, p, 0, 0, 1, 1)  # noqa: E731
    x = ops.add(ctx, conv("v.patch_embd.weight"), conv("v.patch_embd.weight.1"))   # [px, py, e, 1]
    # rows in 2 x 2 block order: [e, px, py] -> pairs of columns -> pairs of rows
    x = ops.cont_4d(ctx, ops.permute(ctx, x, 1, 2, 0, 3), e * 2, px // 2, py, 1)
    x = ops.permute(ctx, ops.reshape_4d(ctx, x, e * 2, px // 2, 2, py // 2), 0, 2, 1, 3)
    x = ops.cont_3d(ctx, x, e, px * py, 1)
    x = ops.reshape_2d(ctx, x, e, px * py)
    pos = new_tensor_1d(ctx, Type.I32, 4 * px * py)
    set_name(pos, "positions")
    set_input(pos)
    inputs.append((pos, positions(px, py, hp.n_merge)))
    d = hp.d_head
    rope = lambda t: ops.rope_multi(ctx, t, pos, None, d // 2, [d // 4] * 4, int(RopeType.VISION),  # noqa: E731
                                    32768, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
    x = vit(ctx, mm, x, rope=rope)
    x = ops.reshape_2d(ctx, x, e * 4, px * py // 4)
    x = ops.gelu(ctx, linear(ctx, x, mm.tensor("mm.0.weight"), mm.tensor("mm.0.bias")))
    return linear(ctx, x, mm.tensor("mm.2.weight"), mm.tensor("mm.2.bias"))
