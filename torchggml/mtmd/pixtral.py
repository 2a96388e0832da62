"""PIXTRAL (Pixtral, Mistral Small 3.1): a ViT with RMS norms, a gated FFN and 2-D RoPE (rows on
the first half of each head, columns on the second, the halves on interleaved frequencies), no
learned positions; the optional patch merger (RMS norm, merge x merge patches as one row by
im2col, a linear map); mm.1 -> GELU -> mm.2; and an [IMG_BREAK] embedding after every row but
the last (clip.cpp's pixtral graph)."""
from __future__ import annotations

import numpy as np

from .. import ops
from ..context import new_tensor_1d
from ..enums import RopeType
from ..tensor import Tensor, set_input, set_name
from ..types import Type
from .loader import MMProj
from .vit import linear, patch_embed, vit


def rope_2d(ctx, x: Tensor, pos_a: Tensor, pos_b: Tensor, theta: float) -> Tensor:
    """Dims [0, d/2) rotated by pos_a on the even frequencies, [d/2, d) by pos_b on the odd ones
    (a second rope of half the dims, its frequencies scaled by theta^(-2/d), offset by d/2)."""
    d = x.ne[0]
    x = ops.rope_ext(ctx, x, pos_a, None, d // 2, int(RopeType.NORMAL), 0, theta, 1.0, 0.0, 1.0, 0.0, 0.0)
    odd = float(np.float32(theta) ** np.float32(-2.0 / d))
    x = ops.rope_ext(ctx, x, pos_b, None, d // 2, int(RopeType.NORMAL), 0, theta, odd, 0.0, 1.0, 0.0, 0.0)
    return ops.rope_set_offset(x, d // 2)


def _positions(ctx, inputs: list, name: str, values: np.ndarray) -> Tensor:
    t = new_tensor_1d(ctx, Type.I32, values.size)
    set_name(t, name)
    set_input(t)
    inputs.append((t, values.astype(np.int32)))
    return t


def build(ctx, mm: MMProj, image: Tensor, inputs: list) -> Tensor:
    """[W, H, 3, 1] pixels -> [n_embd_text, rows * (cols + 1) - 1] embeddings (rows of merged
    patches, [IMG_BREAK] between them)."""
    hp, p, m = mm.vision, mm.vision.patch_size, mm.vision.n_merge
    px, py, e = image.ne[0] // p, image.ne[1] // p, hp.n_embd
    index = np.arange(px * py)
    pos_h = _positions(ctx, inputs, "pos_h", index // px)
    pos_w = _positions(ctx, inputs, "pos_w", index % px)
    x = vit(ctx, mm, patch_embed(ctx, mm, image), rms=True, rope=lambda t: rope_2d(ctx, t, pos_h, pos_w, 10000.0))
    merger = mm.tensor("mm.patch_merger.weight", required=False)
    if merger is not None:
        x = ops.mul(ctx, ops.rms_norm(ctx, x, hp.eps), mm.tensor("mm.input_norm.weight"))
        grid = ops.cont(ctx, ops.permute(ctx, ops.reshape_3d(ctx, x, e, px, py), 2, 0, 1, 3))  # [px, py, e]
        kernel = ops.view_3d(ctx, grid, m, m, e, grid.nb[1], grid.nb[2], 0)  # its shape only
        x = ops.im2col(ctx, kernel, grid, m, m, 0, 0, 1, 1, True, Type.F32)   # [e*m*m, px/m, py/m]
        x = ops.mul_mat(ctx, merger, ops.reshape_2d(ctx, x, x.ne[0], x.ne[1] * x.ne[2]))
    x = ops.gelu(ctx, linear(ctx, x, mm.tensor("mm.1.weight"), mm.tensor("mm.1.bias", required=False)))
    x = linear(ctx, x, mm.tensor("mm.2.weight"), mm.tensor("mm.2.bias", required=False))
    brk = mm.tensor("v.token_embd.img_break", required=False)
    if brk is None:
        return x
    cols, rows, t = px // m, py // m, x.ne[0]
    grid = ops.reshape_3d(ctx, x, t, cols, rows)
    breaks = ops.repeat(ctx, ops.reshape_3d(ctx, brk, t, 1, 1), ops.view_3d(ctx, grid, t, 1, rows, grid.nb[1], grid.nb[2], 0))
    x = ops.concat(ctx, grid, breaks, 1)                                  # [t, cols + 1, rows]
    return ops.cont(ctx, ops.view_2d(ctx, x, t, rows * (cols + 1) - 1, x.nb[1], 0))
