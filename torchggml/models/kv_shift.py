"""Moving a sequence's KV cells to other positions (llama.cpp's seq_add with its K shift), for the
server's --cache-reuse: the cells' positions change, and each layer's K rows, stored rotated at
their old positions, are rotated by the difference (RoPE's rotations compose: R(p + d) = R(d) R(p)).

    rotate = k_rotation(model)      # None, and why not, where the model's K cannot be shifted
    model.memory.shift(seq_id, p0, p1, delta, rotate)

The angle of rotary pair i is delta * freq_scale * base^(-2i/n_rot) in float64 (ggml's rope
without YaRN), the rotation in float32; NORMAL rotates pairs (2i, 2i+1), NEOX (i, i + n_rot/2).
Shifted K rows equal freshly rotated ones up to the K cache type's rounding (as in llama.cpp).
"""
from __future__ import annotations

import torch

from ..enums import RopeType
from ..types import Type

# architectures whose every attention layer rotates K with the file's one rope (no windows, no
# layers without rope, no multi-axis positions)
SHIFTABLE_ARCHS = frozenset({"llama", "qwen2", "qwen3"})


def k_rotation(model):
    """(rotate(il, rows f32 [n, n_embd_k], delta) -> rows rotated by delta positions, None), or
    (None, the reason) where this model's K cache cannot be shifted."""
    hp, kv = model.hp, model.memory.attention
    arch = model.file.arch
    if kv is None or model.memory.recurrent is not None:
        return None, "its memory is not a KV cache alone"
    if arch not in SHIFTABLE_ARCHS:
        return None, f"{arch} is not one of the architectures whose K can be shifted ({', '.join(sorted(SHIFTABLE_ARCHS))})"
    if kv.type not in (Type.F16, Type.F32):
        return None, f"its K cache is {kv.type.name} (shifting needs F16 or F32)"
    if hp.rope_type not in (RopeType.NORMAL, RopeType.NEOX) or hp.rope_sections or hp.swa_layers:
        return None, "its rotary embedding is not one plain rope for every layer"
    if hp.rope_scaling not in ("none", "linear") or hp.yarn_ext_factor or model.file.tensors.get("rope_freqs.weight"):
        return None, f"its rope scaling ({hp.rope_scaling}, frequency factors) is not supported by the shift"
    neox = hp.rope_type == RopeType.NEOX

    def rotate(il: int, rows: torch.Tensor, delta: int) -> torch.Tensor:
        n_rot = hp.layer_n_rot(il)
        head_dim = hp.head_dims(il)[0]
        base, scale = hp.rope_base_scale(il)
        theta = torch.tensor([delta * scale * base ** (-2.0 * i / n_rot) for i in range(n_rot // 2)],
                             dtype=torch.float64)
        cos, sin = torch.cos(theta).float(), torch.sin(theta).float()
        x = rows.reshape(rows.shape[0], -1, head_dim)
        if neox:
            a, b = x[..., :n_rot // 2], x[..., n_rot // 2:n_rot]
        else:
            a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        a0, b0 = a.clone(), b.clone()
        a.copy_(a0 * cos - b0 * sin)
        b.copy_(a0 * sin + b0 * cos)
        return rows

    return rotate, None
