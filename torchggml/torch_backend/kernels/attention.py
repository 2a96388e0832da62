"""SOFT_MAX (soft_max_ext: mask, scale, ALiBi, sinks) and FLASH_ATTN_EXT, in float32.

Both follow ggml's CPU kernels: the mask row i of a [.., i, :] is mask row i, and mask dims 2
and 3 broadcast by tiling (index % mask.ne); ALiBi multiplies the mask by a per-head slope;
sinks add one logit per head to the softmax denominator only.
"""
from __future__ import annotations

import math

import torch

from ...enums import Op
from ...tensor import get_op_params_f32
from . import CPU_KERNELS
from .common import as_float, write, all_float, is_float
from .matmul import is_readable
from .norm import wide_float

# flash attention builds the scores of this many (query, key) pairs at a time, at most
SCORE_CHUNK = 1 << 24


def alibi_slopes(n_head: int, max_bias: float, device) -> torch.Tensor:
    """ggml's ALiBi slope per head: m0^(h+1) for the first 2^floor(log2(n_head)) heads, then
    m1^(2(h - n_head_log2) + 1); all ones when max_bias is 0."""
    if max_bias <= 0.0:
        return torch.ones(n_head, dtype=torch.float32, device=device)
    n_head_log2 = 1 << int(math.floor(math.log2(n_head)))
    m0 = 2.0 ** (-max_bias / n_head_log2)
    m1 = 2.0 ** (-(max_bias / 2.0) / n_head_log2)
    h = torch.arange(n_head, dtype=wide_float(device), device=device)
    slopes = torch.where(h < n_head_log2, m0 ** (h + 1), m1 ** (2 * (h - n_head_log2) + 1))
    return slopes.float()


def tile_to(x: torch.Tensor, shape0: int, shape1: int) -> torch.Tensor:
    """Broadcast x's dims 0 and 1 to (shape0, shape1) by tiling (index % size), as ggml's mask
    broadcast does; size-1 dims expand without copying."""
    reps = [shape0 // x.shape[0] if x.shape[0] > 1 else 1, shape1 // x.shape[1] if x.shape[1] > 1 else 1]
    if reps != [1, 1]:
        x = x.repeat(reps[0], reps[1], 1, 1)
    return x


def mask_bias(mask, rows: int, ne3: int, n_head: int, max_bias: float) -> torch.Tensor:
    """slope[h] * mask for rows [0, rows), broadcastable to [ne3, n_head, rows, n_cols]."""
    m = tile_to(as_float(mask)[:, :, :rows], ne3, n_head)
    if max_bias > 0.0:
        m = m * alibi_slopes(n_head, max_bias, m.device).view(1, n_head, 1, 1)
    return m


def softmax_with_sinks(scores: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last dim of [ne3, n_head, rows, cols]; sinks [n_head] add exp(sink) to
    the denominator. A row with no finite score and no sink gives zeros (as ggml's S == 0)."""
    peak = scores.amax(-1, keepdim=True)
    if sinks is not None:
        sinks = sinks.view(1, -1, 1, 1)
        peak = torch.maximum(peak, sinks)
    peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
    e = torch.exp(scores - peak)
    total = e.sum(-1, keepdim=True, dtype=wide_float(e.device))
    if sinks is not None:
        total = total + torch.exp(sinks - peak)
    total = torch.where(total == 0, torch.ones_like(total), total)
    return e * (1.0 / total).float()


# ---------------------------------------------------------------- SOFT_MAX

def _supports_soft_max(node) -> bool:
    mask, sinks = node.src[1], node.src[2]
    return (all_float(node, 1) and (mask is None or is_float(mask))
            and (sinks is None or sinks.type.name == "F32"))


@CPU_KERNELS.register(Op.SOFT_MAX, supports=_supports_soft_max)
def soft_max(node):
    a, mask, sinks = node.src[0], node.src[1], node.src[2]
    scale, max_bias = get_op_params_f32(node, 0), get_op_params_f32(node, 1)
    x = as_float(a) * scale  # [ne3, ne2, ne1, ne0]
    if mask is not None:
        x = x + mask_bias(mask, a.ne[1], a.ne[3], a.ne[2], max_bias)
    write(node, softmax_with_sinks(x, as_float(sinks).reshape(-1) if sinks is not None else None))


# ---------------------------------------------------------------- FLASH_ATTN_EXT

def _supports_flash_attn(node) -> bool:
    q, k, v, mask, sinks = node.src[:5]
    return (is_float(q) and is_readable(k) and is_readable(v) and node.type.name == "F32"
            and (mask is None or is_float(mask)) and (sinks is None or sinks.type.name == "F32"))


def _attend(q, k, v, bias, sinks, scale: float, softcap: float) -> torch.Tensor:
    """q [ne3, H, n, D], k [ne3, Hk, n_kv, D], v [ne3, Hv, n_kv, Dv] -> [ne3, H, n, Dv].
    Consecutive q heads share a K/V head: q is regrouped, K and V are never repeated."""
    ne3, n_head, n_q, d = q.shape
    n_head_k, n_kv = k.shape[1], k.shape[2]
    n_head_v, dv = v.shape[1], v.shape[3]
    grouped_q = q.reshape(ne3, n_head_k, (n_head // n_head_k) * n_q, d)
    scores = torch.matmul(grouped_q, k.transpose(-1, -2)).view(ne3, n_head, n_q, n_kv)
    if softcap != 0.0:
        scores = softcap * torch.tanh(scores * (scale / softcap))
    else:
        scores = scores * scale
    if bias is not None:
        scores = scores + bias
    probs = softmax_with_sinks(scores, sinks)
    out = torch.matmul(probs.view(ne3, n_head_v, (n_head // n_head_v) * n_q, n_kv), v)
    return out.view(ne3, n_head, n_q, dv)


@CPU_KERNELS.register(Op.FLASH_ATTN_EXT, supports=_supports_flash_attn)
def flash_attn_ext(node):
    q, k, v, mask, sinks = node.src[:5]
    scale, max_bias, softcap = (get_op_params_f32(node, i) for i in range(3))
    vq, vk, vv = as_float(q), as_float(k), as_float(v)
    ne3, n_head, n_q = vq.shape[0], vq.shape[1], vq.shape[2]
    bias = mask_bias(mask, n_q, ne3, n_head, max_bias) if mask is not None else None
    vs = as_float(sinks).reshape(-1) if sinks is not None else None
    # queries in chunks, so the score matrix stays bounded for long prompts
    step = max(1, SCORE_CHUNK // max(1, ne3 * n_head * k.ne[1]))
    out = torch.empty(ne3, n_head, n_q, v.ne[0], dtype=torch.float32, device=vq.device)
    for i0 in range(0, n_q, step):
        rows = slice(i0, i0 + step)
        out[:, :, rows] = _attend(vq[:, :, rows], vk, vv, bias[:, :, rows] if bias is not None else None,
                                  vs, scale, softcap)
    write(node, out.permute(0, 2, 1, 3))  # result [Dv, n_head, n_q, ne3]: heads before tokens
