"""DeepSeek's ops: the DSA lightning indexer and DeepSeek V4's hyper-connections (DSV4_HC_*)."""
from __future__ import annotations

from ..enums import Op
from ..tensor import Tensor, set_op_params_f32, set_op_params_i32
from ..types import Type
from ._common import new_op, require


def lightning_indexer(ctx, q: Tensor, k: Tensor, weights: Tensor, mask: Tensor) -> Tensor:
    """Index scores [n_kv, n_batch, 1, ne3]: sum over heads h of weights[h, t] * relu(q[:, h, t] . k[:, 0, j])
    plus mask[j, t]. q [d, n_head, n_batch, ne3], k [d, 1, n_kv, ne3], weights [n_head, n_batch, 1, ne3]
    (prescaled), mask F16 [n_kv, n_batch, 1, ne33] broadcast over ne3."""
    name = "lightning_indexer"
    require(q.type == Type.F32, name, "q must be F32", q)
    require(weights.type == Type.F32, name, "weights must be F32", weights)
    require(mask.type == Type.F16, name, "mask must be F16", mask)
    require(q.ne[0] == k.ne[0], name, "q.ne[0] must equal k.ne[0]", q, k)
    require(mask.ne[0] == k.ne[2], name, "mask.ne[0] must equal k.ne[2] (n_kv)", mask, k)
    require(q.ne[1] == weights.ne[0], name, "q.ne[1] must equal weights.ne[0] (n_head)", q, weights)
    require(k.ne[1] == 1, name, "k.ne[1] must be 1", k)
    require(mask.ne[1] == q.ne[2], name, "mask.ne[1] must equal q.ne[2] (n_batch)", mask, q)
    require(q.ne[2] == weights.ne[1], name, "q.ne[2] must equal weights.ne[1]", q, weights)
    require(weights.ne[2] == 1 and mask.ne[2] == 1, name, "weights.ne[2] and mask.ne[2] must be 1", weights, mask)
    require(q.ne[3] == k.ne[3] == weights.ne[3], name, "q, k and weights must agree in ne[3]", q, k, weights)
    require(weights.ne[3] % mask.ne[3] == 0, name, "mask.ne[3] must divide ne[3]", weights, mask)
    return new_op(ctx, Op.LIGHTNING_INDEXER, Type.F32, [k.ne[2], q.ne[2], 1, q.ne[3]], [q, k, weights, mask])


def dsv4_hc_comb(ctx, mixes: Tensor, scale: Tensor, base: Tensor, eps: float, n_iter: int) -> Tensor:
    """The hyper-connection combination matrices [hc, hc, n_tokens] (hc = 4): logits
    mixes[2hc + dst + hc*src, t]*scale[2] + base[...], softmax over dst, + eps, then n_iter - 1 rounds
    of Sinkhorn normalization (over src, then dst), ending with a normalization over src."""
    name = "dsv4_hc_comb"
    require(mixes.type == Type.F32 and scale.type == Type.F32 and base.type == Type.F32, name,
            "mixes, scale and base must be F32", mixes, scale, base)
    require(n_iter > 0, name, f"n_iter must be > 0 (got {n_iter})")
    dim = mixes.ne[0]
    hc = next((i for i in range(1, dim + 1) if (2 + i) * i == dim), 0)
    require(hc == 4, name, f"mixes.ne[0] must be (2 + hc)*hc with hc = 4 (got {dim})", mixes)
    require(mixes.ne[2] == 1 and mixes.ne[3] == 1, name, "mixes must be 2-D", mixes)
    require(scale.ne[0] >= 3 and scale.ne[1:] == [1, 1, 1], name, "scale must be a vector of >= 3", scale)
    require(base.ne == [dim, 1, 1, 1], name, f"base must be a vector of {dim}", base)
    t = new_op(ctx, Op.DSV4_HC_COMB, Type.F32, [hc, hc, mixes.ne[1]], [mixes, scale, base])
    set_op_params_f32(t, 0, eps)
    set_op_params_i32(t, 1, int(n_iter))
    return t


def dsv4_hc_pre(ctx, x: Tensor, weights: Tensor) -> Tensor:
    """[n_embd, n_tokens]: sum over streams h of x[:, h, t] * weights[h, t]."""
    name = "dsv4_hc_pre"
    require(x.type == Type.F32 and weights.type == Type.F32, name, "x and weights must be F32", x, weights)
    hc = x.ne[1]
    require(hc > 0 and x.ne[3] == 1, name, "x must be [n_embd, hc, n_tokens]", x)
    require(weights.ne == [hc, x.ne[2], 1, 1], name, "weights must be [hc, n_tokens]", x, weights)
    return new_op(ctx, Op.DSV4_HC_PRE, Type.F32, [x.ne[0], x.ne[2]], [x, weights])


def dsv4_hc_post(ctx, x: Tensor, residual: Tensor, post: Tensor, comb: Tensor) -> Tensor:
    """[n_embd, hc, n_tokens]: x[:, t]*post[dst, t] + sum over src of residual[:, src, t]*comb[dst, src, t]."""
    name = "dsv4_hc_post"
    require(all(t.type == Type.F32 for t in (x, residual, post, comb)), name,
            "x, residual, post and comb must be F32", x, residual, post, comb)
    n_embd, n_tokens, hc = x.ne[0], x.ne[1], residual.ne[1]
    require(hc > 0 and x.ne[2] == 1 and x.ne[3] == 1, name, "x must be [n_embd, n_tokens]", x)
    require(residual.ne == [n_embd, hc, n_tokens, 1], name, "residual must be [n_embd, hc, n_tokens]", x, residual)
    require(post.ne == [hc, n_tokens, 1, 1], name, "post must be [hc, n_tokens]", post)
    require(comb.ne == [hc, hc, n_tokens, 1], name, "comb must be [hc, hc, n_tokens]", comb)
    return new_op(ctx, Op.DSV4_HC_POST, Type.F32, [n_embd, hc, n_tokens], [x, residual, post, comb])


__all__ = [name for name, fn in list(globals().items())
           if not name.startswith("_") and callable(fn) and getattr(fn, "__module__", None) == __name__]
