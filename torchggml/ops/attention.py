"""Attention pieces: soft_max_ext (mask, scale, ALiBi, sinks) and flash_attn_ext."""
from __future__ import annotations

from ..enums import Op, Prec
from ..tensor import Tensor, is_contiguous, set_op_params_i32
from ..types import Type
from ._common import new_op, same_as, require

__all__ = ["soft_max", "soft_max_inplace", "soft_max_ext", "soft_max_ext_inplace",
           "soft_max_add_sinks", "flash_attn_ext", "flash_attn_ext_set_prec",
           "flash_attn_ext_get_prec", "flash_attn_ext_add_sinks"]


def _check_mask(op: str, a: Tensor, mask: Tensor | None, rows: int, batch2: int, batch3: int) -> None:
    if mask is None:
        return
    require(mask.type in (Type.F16, Type.F32), op, "mask must be F16 or F32", mask)
    require(is_contiguous(mask), op, "mask must be contiguous", mask)
    require(mask.ne[1] >= rows, op, "mask has fewer rows than the queries", a, mask)
    require(batch2 % mask.ne[2] == 0 and batch3 % mask.ne[3] == 0, op,
            "mask dims 2 and 3 must broadcast", a, mask)


def _soft_max(ctx, a: Tensor, mask: Tensor | None, scale: float, max_bias: float, inplace: bool) -> Tensor:
    op = "soft_max_ext"
    require(is_contiguous(a), op, "a must be contiguous", a)
    if mask is not None:
        require(mask.ne[0] == a.ne[0], op, "mask.ne[0] != a.ne[0]", a, mask)
    _check_mask(op, a, mask, a.ne[1], a.ne[2], a.ne[3])
    require(max_bias == 0.0 or mask is not None, op, "ALiBi (max_bias > 0) needs a mask", a)
    return same_as(ctx, Op.SOFT_MAX, a, [a, mask], [float(scale), float(max_bias)], inplace=inplace)


def soft_max(ctx, a: Tensor) -> Tensor:
    return _soft_max(ctx, a, None, 1.0, 0.0, False)


def soft_max_inplace(ctx, a: Tensor) -> Tensor:
    return _soft_max(ctx, a, None, 1.0, 0.0, True)


def soft_max_ext(ctx, a: Tensor, mask: Tensor | None, scale: float, max_bias: float) -> Tensor:
    """softmax(a * scale + slope * mask) over rows; slope is ALiBi's per head (dim 2) when
    max_bias > 0, else 1. mask F16/F32 [a.ne0, >= a.ne1, ...]: row i of a uses mask row i, and
    dims 2 and 3 broadcast by tiling (a index i2 uses mask index i2 % mask.ne2)."""
    return _soft_max(ctx, a, mask, scale, max_bias, False)


def soft_max_ext_inplace(ctx, a: Tensor, mask: Tensor | None, scale: float, max_bias: float) -> Tensor:
    return _soft_max(ctx, a, mask, scale, max_bias, True)


def _add_sinks(fn: str, a: Tensor, op: Op, slot: int, n_head: int, sinks: Tensor | None) -> None:
    """Attention sinks: one extra logit per head in the softmax denominator, as src[slot]."""
    if sinks is None:
        a.src[slot] = None
        return
    require(a.op == op, fn, f"a must be a {op.name.lower()} node", a)
    require(a.src[slot] is None, fn, "the node already has sinks", a)
    require(sinks.type == Type.F32 and sinks.ne[0] == n_head, fn, f"sinks must be F32 [{n_head}] (one per head)", a, sinks)
    a.src[slot] = sinks


def soft_max_add_sinks(a: Tensor, sinks: Tensor | None) -> None:
    """Sinks for a soft_max node: one per head (a's dim 2)."""
    _add_sinks("soft_max_add_sinks", a, Op.SOFT_MAX, 2, a.ne[2], sinks)


def flash_attn_ext(ctx, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float,
                   max_bias: float = 0.0, logit_softcap: float = 0.0) -> Tensor:
    """softmax(q k^T * scale (+ softcap) + mask) v, per head; consecutive q heads share a KV head
    (q.ne2 / k.ne2 of them).
    q [D, n_q, n_head, ne3], k [D, n_kv, n_head_kv, ne3], v [Dv, n_kv, n_head_kv, ne3],
    mask F16 [n_kv, >= n_q, broadcast over dims 2 and 3]
    -> F32 [Dv, n_head, n_q, ne3] (heads before tokens, ready to reshape to [Dv*n_head, n_q])."""
    op = "flash_attn_ext"
    require(q.ne[0] == k.ne[0], op, "q and k head sizes differ", q, k)
    require(k.ne[1] == v.ne[1], op, "k and v lengths differ", k, v)
    require(q.ne[2] % k.ne[2] == 0 and q.ne[2] % v.ne[2] == 0, op,
            "q heads must be a multiple of the K and V heads", q, k, v)
    require(q.ne[3] == k.ne[3] and q.ne[3] == v.ne[3], op, "q, k and v differ in ne[3]", q, k, v)
    if mask is not None:
        require(mask.type == Type.F16, op, "mask must be F16", mask)
        require(mask.ne[0] == k.ne[1], op, "mask.ne[0] must equal the KV length", mask, k)
    _check_mask(op, q, mask, q.ne[1], q.ne[2], q.ne[3])
    require(max_bias == 0.0 or mask is not None, op, "ALiBi (max_bias > 0) needs a mask", q)
    ne = [v.ne[0], q.ne[2], q.ne[1], q.ne[3]]
    return new_op(ctx, Op.FLASH_ATTN_EXT, Type.F32, ne, [q, k, v, mask],
                  [float(scale), float(max_bias), float(logit_softcap), int(Prec.DEFAULT)])


def flash_attn_ext_set_prec(a: Tensor, prec: Prec) -> None:
    require(a.op == Op.FLASH_ATTN_EXT, "flash_attn_ext_set_prec", "a must be a flash_attn_ext node", a)
    set_op_params_i32(a, 3, int(Prec(prec)))


def flash_attn_ext_get_prec(a: Tensor) -> Prec:
    require(a.op == Op.FLASH_ATTN_EXT, "flash_attn_ext_get_prec", "a must be a flash_attn_ext node", a)
    return Prec(a.op_params[3])


def flash_attn_ext_add_sinks(a: Tensor, sinks: Tensor | None) -> None:
    """Sinks for a flash_attn_ext node: one per head (the result's dim 1)."""
    _add_sinks("flash_attn_ext_add_sinks", a, Op.FLASH_ATTN_EXT, 4, a.ne[1], sinks)
