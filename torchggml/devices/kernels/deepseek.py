"""DeepSeek's LIGHTNING_INDEXER and DeepSeek V4's hyper-connection ops (DSV4_HC_COMB/PRE/POST),
in float32."""
from __future__ import annotations

import torch

from ...enums import Op
from ...tensor import get_op_params_f32
from ...types import Type
from .table import KernelTable
from .common import as_float, write

KERNELS = KernelTable("deepseek")


def _f32(node) -> bool:
    return node.type == Type.F32 and all(s.type == Type.F32 for s in node.src if s is not None)


@KERNELS.register(Op.LIGHTNING_INDEXER,
                  supports=lambda n: n.src[0].type == Type.F32 and n.src[2].type == Type.F32 and n.src[3].type == Type.F16)
def lightning_indexer(node):
    """score[s, t, j] = sum_h w[s, t, h] * relu(q[s, t, h] . k[s, j]) + mask[s % ne33, t, j]."""
    q, k, w, mask = (as_float(node.src[i]) for i in range(4))
    # q [S, T, H, D], k [S, J, 1, D], w [S, 1, T, H], mask [S', 1, T, J]
    qk = torch.einsum("sthd,sjd->sthj", q, k[:, :, 0, :]).clamp_min(0.0)
    score = torch.einsum("sthj,sth->stj", qk, w[:, 0])
    reps = q.shape[0] // mask.shape[0]
    write(node, (score + mask[:, 0].repeat(reps, 1, 1)).unsqueeze(1))


@KERNELS.register(Op.DSV4_HC_COMB, supports=_f32)
def dsv4_hc_comb(node):
    """Per token: softmax over dst of mixes[2hc + dst + hc*src]*scale[2] + base, + eps, normalize
    over src; then n_iter - 1 rounds of (normalize over dst, normalize over src); each sum + eps."""
    hc = node.ne[0]
    eps, n_iter = get_op_params_f32(node, 0), node.op_params[1]
    mixes, scale, base = (as_float(node.src[i]) for i in range(3))
    off = 2 * hc
    logits = mixes[0, 0, :, off:off + hc * hc] * scale.reshape(-1)[2] + base.reshape(-1)[off:off + hc * hc]
    comb = torch.softmax(logits.reshape(-1, hc, hc), dim=-1) + eps         # [T, src, dst]

    def over_src(c):
        return c / (c.sum(1, keepdim=True) + eps)

    def over_dst(c):
        return c / (c.sum(2, keepdim=True) + eps)

    comb = over_src(comb)
    for _ in range(1, n_iter):
        comb = over_src(over_dst(comb))
    write(node, comb)


@KERNELS.register(Op.DSV4_HC_PRE, supports=_f32)
def dsv4_hc_pre(node):
    """[T, E]: sum over streams h of x[T, h, E] * weights[T, h]."""
    x, w = as_float(node.src[0])[0], as_float(node.src[1])[0, 0]
    write(node, torch.einsum("the,th->te", x, w))


@KERNELS.register(Op.DSV4_HC_POST, supports=_f32)
def dsv4_hc_post(node):
    """[T, dst, E]: x[T, E] * post[T, dst] + sum over src of comb[T, src, dst] * residual[T, src, E]."""
    x, residual = as_float(node.src[0])[0, 0], as_float(node.src[1])[0]
    post, comb = as_float(node.src[2])[0, 0], as_float(node.src[3])[0]
    out = x[:, None, :] * post[:, :, None] + torch.einsum("tsd,tse->tde", comb, residual)
    write(node, out)
