"""Cases: LIGHTNING_INDEXER and DSV4_HC_COMB/PRE/POST against float64 loops over the formulas of
ggml.h's comments."""
from __future__ import annotations

import torch

import torchggml as ggml
from .values import T, uniform
from .table import CaseTable

CASES = CaseTable()
case = CASES.case


def _indexer_ref(q, k, w, mask):
    """score[s, t, j] = sum_h w[h, t] relu(q[:, h, t] . k[:, j]) + mask[j, t] (mask tiled over s)."""
    n_stream, n_tokens, n_head = q.shape[0], q.shape[1], q.shape[2]
    n_kv = k.shape[1]
    out = torch.zeros(n_stream, 1, n_tokens, n_kv, dtype=torch.float64)
    for s in range(n_stream):
        for t in range(n_tokens):
            for j in range(n_kv):
                score = sum(w[s, 0, t, h] * torch.clamp_min(q[s, t, h] @ k[s, j, 0], 0) for h in range(n_head))
                out[s, 0, t, j] = score + mask[s % mask.shape[0], 0, t, j]
    return out


for _d, _heads, _tokens, _kv, _streams, _mask_streams in [(16, 4, 3, 7, 1, 1), (8, 2, 2, 5, 2, 1),
                                                          (32, 3, 4, 6, 2, 2)]:
    def _build_indexer(ctx, d=_d, heads=_heads, tokens=_tokens, kv=_kv, streams=_streams, ms=_mask_streams):
        q = ggml.new_tensor_4d(ctx, T.F32, d, heads, tokens, streams)
        k = ggml.new_tensor_4d(ctx, T.F32, d, 1, kv, streams)
        w = ggml.new_tensor_4d(ctx, T.F32, heads, tokens, 1, streams)
        mask = ggml.new_tensor_4d(ctx, T.F16, kv, tokens, 1, ms)
        return ggml.lightning_indexer(ctx, q, k, w, mask), [q, k, w, mask]
    case("lightning_indexer", f"d={_d},heads={_heads},tokens={_tokens},kv={_kv},streams={_streams},"
         f"mask_streams={_mask_streams}", _build_indexer, _indexer_ref, max_nmse=1e-12)


def _hc_comb_ref(eps, n_iter, hc=4):
    def ref(mixes, scale, base):
        n_tokens = mixes.shape[2]
        out = torch.zeros(1, n_tokens, hc, hc, dtype=torch.float64)
        for t in range(n_tokens):
            c = torch.zeros(hc, hc, dtype=torch.float64)              # c[src, dst]
            for src in range(hc):
                for dst in range(hc):
                    i = 2 * hc + dst + hc * src
                    c[src, dst] = mixes[0, 0, t, i] * scale.reshape(-1)[2] + base.reshape(-1)[i]
            c = torch.softmax(c, dim=1) + eps
            c = c / (c.sum(0, keepdim=True) + eps)
            for _ in range(1, n_iter):
                c = c / (c.sum(1, keepdim=True) + eps)
                c = c / (c.sum(0, keepdim=True) + eps)
            out[0, t] = c
        return out
    return ref


for _tokens, _eps, _n_iter in [(3, 1e-6, 1), (5, 1e-4, 3), (2, 1e-3, 20)]:
    def _build_hc_comb(ctx, tokens=_tokens, eps=_eps, n_iter=_n_iter):
        mixes = ggml.new_tensor_2d(ctx, T.F32, 24, tokens)
        scale = ggml.new_tensor_1d(ctx, T.F32, 3)
        base = ggml.new_tensor_1d(ctx, T.F32, 24)
        return ggml.dsv4_hc_comb(ctx, mixes, scale, base, eps, n_iter), [mixes, scale, base]
    case("dsv4_hc_comb", f"tokens={_tokens},eps={_eps},n_iter={_n_iter}", _build_hc_comb,
         _hc_comb_ref(_eps, _n_iter), max_nmse=1e-12, init={1: uniform(0.5, 2.0)})


def _build_hc_pre(ctx):
    x = ggml.new_tensor_3d(ctx, T.F32, 16, 4, 5)
    w = ggml.new_tensor_2d(ctx, T.F32, 4, 5)
    return ggml.dsv4_hc_pre(ctx, x, w), [x, w]


case("dsv4_hc_pre", "n_embd=16,hc=4,tokens=5", _build_hc_pre,
     lambda x, w: (x[0] * w[0, 0][:, :, None]).sum(1), max_nmse=1e-12)


def _hc_post_ref(x, residual, post, comb):
    """out[t, dst, i] = x[t, i] post[t, dst] + sum_src residual[t, src, i] comb[t, src, dst]."""
    x, residual, post, comb = x[0, 0], residual[0], post[0, 0], comb[0]
    mixed = (residual[:, :, None, :] * comb[:, :, :, None]).sum(1)
    return x[:, None, :] * post[:, :, None] + mixed


def _build_hc_post(ctx):
    x = ggml.new_tensor_2d(ctx, T.F32, 16, 5)
    residual = ggml.new_tensor_3d(ctx, T.F32, 16, 4, 5)
    post = ggml.new_tensor_2d(ctx, T.F32, 4, 5)
    comb = ggml.new_tensor_3d(ctx, T.F32, 4, 4, 5)
    return ggml.dsv4_hc_post(ctx, x, residual, post, comb), [x, residual, post, comb]


case("dsv4_hc_post", "n_embd=16,hc=4,tokens=5", _build_hc_post, _hc_post_ref, max_nmse=1e-12)
