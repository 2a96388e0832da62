"""QWEN2VL and QWEN25VL (Qwen2-VL's and Qwen2.5-VL's vision towers, projector types
qwen2vl_merger and qwen2.5vl_merger): two patch convolutions (the two frames of a temporal
patch; a still image feeds both), patches ordered by 2 x 2 blocks, M-RoPE over (row, column) per
head in GGML_ROPE_TYPE_VISION mode, and the merger: each 2 x 2 block's four rows as one, through
mm.0 -> GELU -> mm.2 (clip.cpp's qwen2vl graph).

Qwen2.5-VL adds RMS norms, a gated SiLU FFN and window attention: the 2 x 2 blocks regrouped
window by window (windows of 112 / patch / 2 blocks a side), every layer but each
n_wa_pattern-th attending only within its window, and the merged rows put back in image order."""
from __future__ import annotations

import numpy as np

from .. import ops
from ..context import new_tensor_1d, new_tensor_2d
from ..enums import RopeType
from ..tensor import Tensor, set_input, set_name
from ..types import Type
from .loader import MMProj
from .vit import linear, vit

WINDOW_PIXELS = 112  # clip.cpp's attn_window_size default (Qwen2.5-VL's window_size)


def _input(ctx, inputs: list, name: str, values: np.ndarray, type=Type.I32) -> Tensor:
    t = (new_tensor_1d(ctx, type, values.shape[0]) if values.ndim == 1
         else new_tensor_2d(ctx, type, values.shape[1], values.shape[0]))
    set_name(t, name)
    set_input(t)
    inputs.append((t, values))
    return t


def windows(pw: int, ph: int, grid: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For a pw x ph grid of 2 x 2 blocks in windows of grid x grid blocks: idx (each block's
    place in window order), inv_idx (the block at each place) and the F32 mask [n_pos, n_pos]
    of the patches (0 within a window, float's lowest elsewhere)."""
    idx, inv = np.zeros(pw * ph, np.int32), np.zeros(pw * ph, np.int32)
    n_pos = pw * ph * 4
    mask = np.full((n_pos, n_pos), np.finfo(np.float32).min, np.float32)
    dst = 0
    for y in range(0, ph, grid):
        for x in range(0, pw, grid):
            first = dst
            for dy in range(min(grid, ph - y)):
                for dx in range(min(grid, pw - x)):
                    src = (y + dy) * pw + x + dx
                    idx[src], inv[dst] = dst, src
                    dst += 1
            mask[first * 4:dst * 4, first * 4:dst * 4] = 0.0
    return idx, inv, mask


def positions(px: int, py: int, idx: np.ndarray | None = None) -> np.ndarray:
    """I32 [4 * n_pos]: each patch's row, column, row, column, in the 2 x 2 block order (blocks
    moved to their window-order place idx[block] when given)."""
    n = px * py
    pos = np.zeros(4 * n, np.int32)
    ptr = 0
    for y in range(0, py, 2):
        for x in range(0, px, 2):
            for dy in range(2):
                for dx in range(2):
                    at = ptr if idx is None else idx[ptr // 4] * 4 + ptr % 4
                    pos[at], pos[n + at], pos[2 * n + at], pos[3 * n + at] = y + dy, x + dx, y + dy, x + dx
                    ptr += 1
    return pos


def block_patches(ctx, mm: MMProj, image: Tensor) -> tuple[Tensor, int, int]:
    """The two frames' patch convolutions of a still image, summed, as rows [n_embd, px * py] in
    2 x 2 block order; and px, py (the patches a side, even)."""
    p = mm.vision.patch_size
    px, py = image.ne[0] // p, image.ne[1] // p
    if px % 2 or py % 2:
        raise ValueError(f"{mm.path}: {mm.projector} needs an even number of patches per side, got {px}x{py}")
    conv = lambda name: ops.conv_2d(ctx, mm.tensor(name), image, p, p, 0, 0, 1, 1)  # noqa: E731
    x = ops.add(ctx, conv("v.patch_embd.weight"), conv("v.patch_embd.weight.1"))  # [px, py, n_embd, 1]
    return block_order(ctx, ops.permute(ctx, x, 1, 2, 0, 3), px, py), px, py


def block_order(ctx, x: Tensor, px: int, py: int) -> Tensor:
    """Patch rows [e, px, py] (any strides) -> [e, px * py] in 2 x 2 block order: pairs of
    columns, then pairs of rows."""
    e = x.ne[0]
    x = ops.cont_4d(ctx, x, e * 2, px // 2, py, 1)
    x = ops.permute(ctx, ops.reshape_4d(ctx, x, e * 2, px // 2, 2, py // 2), 0, 2, 1, 3)
    return ops.reshape_2d(ctx, ops.cont_3d(ctx, x, e, px * py, 1), e, px * py)


def vision_rope(ctx, inputs: list, px: int, py: int, d: int, idx: np.ndarray | None = None):
    """rope(q or k): vision M-RoPE over each patch's (row, column) in block order."""
    pos = _input(ctx, inputs, "positions", positions(px, py, idx))
    return lambda t: ops.rope_multi(ctx, t, pos, None, d // 2, [d // 4] * 4, int(RopeType.VISION),
                                    32768, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)


def build(ctx, mm: MMProj, image: Tensor, inputs: list) -> Tensor:
    """[W, H, 3, 1] pixels (multiples of 2 patches) -> [n_embd_text, n_patches / 4] embeddings."""
    hp, p = mm.vision, mm.vision.patch_size
    e = hp.n_embd
    x, px, py = block_patches(ctx, mm, image)
    n_blocks = px * py // 4
    windowed = hp.n_wa_pattern > 0
    if windowed:
        idx, inv, mask = windows(px // 2, py // 2, WINDOW_PIXELS // p // 2)
        inv_t, idx_t = _input(ctx, inputs, "inv_window_idx", inv), _input(ctx, inputs, "window_idx", idx)
        mask_t = _input(ctx, inputs, "window_mask", mask, Type.F32)
    rope = vision_rope(ctx, inputs, px, py, hp.d_head, idx if windowed else None)
    if windowed:  # the 2 x 2 blocks in window order; full attention every n_wa_pattern-th layer
        regroup = lambda t: ops.reshape_2d(ctx, ops.get_rows(ctx, ops.reshape_2d(ctx, t, e * 4, n_blocks), inv_t),  # noqa: E731
                                           e, px * py)
        x = vit(ctx, mm, x, rms=mm.projector == "qwen2.5vl_merger", rope=rope, after_pre_norm=regroup,
                mask=lambda il: None if (il + 1) % hp.n_wa_pattern == 0 else mask_t)
    else:
        x = vit(ctx, mm, x, rms=mm.projector == "qwen2.5vl_merger", rope=rope)
    x = ops.reshape_2d(ctx, x, e * 4, n_blocks)
    x = ops.gelu(ctx, linear(ctx, x, mm.tensor("mm.0.weight"), mm.tensor("mm.0.bias")))
    x = linear(ctx, x, mm.tensor("mm.2.weight"), mm.tensor("mm.2.bias"))
    return ops.get_rows(ctx, x, idx_t) if windowed else x
