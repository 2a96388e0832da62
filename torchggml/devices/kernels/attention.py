"""SOFT_MAX (soft_max_ext: mask, scale, ALiBi, sinks) and FLASH_ATTN_EXT, in float32.

Both follow ggml's CPU kernels: the mask row i of a [.., i, :] is mask row i, and mask dims 2
and 3 broadcast by tiling (index % mask.ne); ALiBi multiplies the mask by a per-head slope;
sinks add one logit per head to the softmax denominator only.
"""
from __future__ import annotations

import functools
import math

import torch

from ...enums import Op
from ...tensor import get_op_params_f32
from ...types import Type, wide_float
from .table import KernelTable, binds
from .common import view, all_float, is_float
from .matmul import is_readable, float_reader

KERNELS = KernelTable("attention")

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


def tile_reps(x: torch.Tensor, shape0: int, shape1: int) -> tuple[int, int] | None:
    """How often x's dims 0 and 1 repeat to reach (shape0, shape1) when ggml's mask broadcast
    tiles them (index % size); None when size-1 dims broadcast without copying."""
    reps = (shape0 // x.shape[0] if x.shape[0] > 1 else 1, shape1 // x.shape[1] if x.shape[1] > 1 else 1)
    return None if reps == (1, 1) else reps


def _mask_bias(vm, reps, slopes) -> torch.Tensor:
    """slope[h] * mask (float32) from the mask's current values, tiled by reps when needed."""
    m = vm.float()
    if reps is not None:
        m = m.repeat(*reps, 1, 1)
    return m if slopes is None else m * slopes


def bind_mask_bias(mask, rows: int, ne3: int, n_head: int, max_bias: float):
    """fn() -> slope[h] * mask for rows [0, rows), float32, broadcastable to [ne3, n_head, rows,
    n_cols]. The mask's view and the ALiBi slopes (op params only) are taken now; the mask's
    values are read, and tiled, at each call."""
    vm = view(mask)[:, :, :rows]
    slopes = alibi_slopes(n_head, max_bias, vm.device).view(1, n_head, 1, 1) if max_bias > 0.0 else None
    return functools.partial(_mask_bias, vm, tile_reps(vm, ne3, n_head), slopes)


def softmax_with_sinks(scores: torch.Tensor, sinks: torch.Tensor | None, out: torch.Tensor | None = None):
    """Softmax over the last dim of [ne3, n_head, rows, cols] (into `out` when given, which may
    be F16/BF16: rounded once); sinks [n_head] add exp(sink) to the denominator. A row with no
    finite score and no sink gives zeros (as ggml's S == 0). `scores` must be a temporary: it is
    overwritten."""
    peak = scores.amax(-1, keepdim=True)
    if sinks is not None:
        sinks = sinks.view(1, -1, 1, 1)
        peak = torch.maximum(peak, sinks)
    peak = peak.nan_to_num_(0.0, 0.0, 0.0)  # no finite peak: subtract 0
    e = scores.sub_(peak).exp_()
    total = e.sum(-1, keepdim=True, dtype=wide_float(e.device))
    if sinks is not None:
        total = total + torch.exp(sinks - peak)
    total.masked_fill_(total == 0, 1.0)
    inv = total.reciprocal_().float()
    return e.mul_(inv) if out is None else torch.mul(e, inv, out=out)


def _sinks_view(sinks) -> torch.Tensor | None:
    """The sinks' values [n_head] as a view (F32, one row)."""
    return view(sinks)[0, 0, 0] if sinks is not None else None


# ---------------------------------------------------------------- SOFT_MAX

def _supports_soft_max(node) -> bool:
    mask, sinks = node.src[1], node.src[2]
    return (all_float(node, 1) and (mask is None or is_float(mask))
            and (sinks is None or sinks.type == Type.F32))


def _soft_max_into(va, scale: float, bias, sinks, dst, _node) -> None:
    x = va.float() * scale  # [ne3, ne2, ne1, ne0], a temporary
    if bias is not None:
        x.add_(bias())
    softmax_with_sinks(x, sinks, out=dst)


def _bind_soft_max(node):
    a, mask, sinks = node.src[0], node.src[1], node.src[2]
    scale, max_bias = get_op_params_f32(node, 0), get_op_params_f32(node, 1)
    bias = bind_mask_bias(mask, a.ne[1], a.ne[3], a.ne[2], max_bias) if mask is not None else None
    return functools.partial(_soft_max_into, view(a), scale, bias, _sinks_view(sinks), view(node))


@KERNELS.register(Op.SOFT_MAX, supports=_supports_soft_max)
@binds(_bind_soft_max)
def soft_max(node):
    _bind_soft_max(node)(node)


# ---------------------------------------------------------------- FLASH_ATTN_EXT

def _supports_flash_attn(node) -> bool:
    q, k, v, mask, sinks = node.src[:5]
    return (is_float(q) and is_readable(k) and is_readable(v) and node.type == Type.F32
            and (mask is None or is_float(mask)) and (sinks is None or sinks.type == Type.F32))


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


def _flash_attn_into(vq, vk, vv, k_float, v_float, bias, sinks, scale: float, softcap: float, chunks,
                     _node) -> None:
    fq, fk, fv = vq.float(), k_float(vk), v_float(vv)
    b = bias() if bias is not None else None
    for rows, dst in chunks:
        dst.copy_(_attend(fq[:, :, rows], fk, fv, b[:, :, rows] if b is not None else None, sinks, scale, softcap))


def _bind_flash_attn_ext(node):
    """Views, the K/V conversion, the mask's broadcast and the query chunks are chosen now; q,
    K, V, mask and sinks are read at each call. Each chunk's result goes straight into the
    node (heads before tokens)."""
    q, k, v, mask, sinks = node.src[:5]
    scale, max_bias, softcap = (get_op_params_f32(node, i) for i in range(3))
    ne3, n_head, n_q = q.ne[3], q.ne[2], q.ne[1]
    bias = bind_mask_bias(mask, n_q, ne3, n_head, max_bias) if mask is not None else None
    # queries in chunks, so the score matrix stays bounded for long prompts
    step = max(1, SCORE_CHUNK // max(1, ne3 * n_head * k.ne[1]))
    out = view(node).permute(0, 2, 1, 3)  # [ne3, n_head, n_q, Dv]
    chunks = tuple((slice(i0, i0 + step), out[:, :, i0:i0 + step]) for i0 in range(0, n_q, step))
    return functools.partial(_flash_attn_into, view(q), view(k), view(v), float_reader(k), float_reader(v), bias,
                             _sinks_view(sinks), scale, softcap, chunks)


@KERNELS.register(Op.FLASH_ATTN_EXT, supports=_supports_flash_attn)
@binds(_bind_flash_attn_ext)
def flash_attn_ext(node):
    _bind_flash_attn_ext(node)(node)
