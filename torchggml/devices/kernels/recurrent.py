"""SSM_CONV, SSM_SCAN, RWKV_WKV6, GATED_LINEAR_ATTN, RWKV_WKV7, GATED_DELTA_NET, SOLVE_TRI in
float32, as ggml's CPU kernels (ggml-cpu/ops.cpp) compute them.

The scans loop over the tokens of a sequence only: each step is a few torch ops over every
sequence, head and state value at once, so a decode step (one token per sequence) is a handful
of ops whatever the model's width, and a prompt of n tokens is n such steps.
"""
from __future__ import annotations

import math

import torch

from ...enums import Op
from ...tensor import get_op_params_f32, get_op_params_i32, nelements
from ...types import Type
from .table import KernelTable
from .common import view

KERNELS = KernelTable("recurrent")


def _all_f32(node) -> bool:
    return node.type == Type.F32 and all(s.type == Type.F32 for s in node.src if s is not None and s.type != Type.I32)


def _flat_out(node) -> torch.Tensor:
    return view(node).reshape(-1)


def softplus(x: torch.Tensor) -> torch.Tensor:
    """ggml's softplus: x above 20, log(1 + exp(x)) below."""
    return torch.where(x > 20.0, x, torch.log1p(torch.exp(torch.clamp_max(x, 20.0))))


@KERNELS.register(Op.SSM_CONV, supports=_all_f32)
def ssm_conv(node):
    sx = view(node.src[0])[0]                        # [n_s, d_inner, d_conv - 1 + n_t]
    c = view(node.src[1])[0, 0]                      # [d_inner, d_conv]
    windows = sx.unfold(-1, c.shape[-1], 1)          # [n_s, d_inner, n_t, d_conv]
    out = torch.einsum("sitk,ik->sti", windows, c)   # [n_s, n_t, d_inner]
    view(node)[0].copy_(out)


def _groups_to_heads(t: torch.Tensor, n_head: int) -> torch.Tensor:
    """[..., n_group, d] -> [..., n_head, d]: head h reads group h / (n_head / n_group)."""
    n_group = t.shape[-2]
    return t if n_group == n_head else t.repeat_interleave(n_head // n_group, dim=-2)


@KERNELS.register(Op.SSM_SCAN, supports=_all_f32)
def ssm_scan(node):
    s_all, x, dt, A, B, C, ids = (node.src[i] for i in range(7))
    K = get_op_params_i32(node, 0)
    xs = view(x)                                      # [ns, nt, nh, dim]
    ns, nt, nh, dim = xs.shape
    states = view(s_all)                              # [n_slots, nh, dim, d_state]
    d_state = states.shape[-1]
    state = states[view(ids).reshape(-1).long()].clone()
    dts = softplus(view(dt)[0])                       # [ns, nt, nh]
    a = view(A)[0, 0]                                 # [nh, d_state or 1]
    dA = torch.exp(dts[..., None, None] * a[:, None, :])  # [ns, nt, nh, 1, d_state or 1]
    x_dt = xs * dts[..., None]                        # [ns, nt, nh, dim]
    Bh = _groups_to_heads(view(B), nh)                # [ns, nt, nh, d_state]
    Ch = _groups_to_heads(view(C), nh)
    out = _flat_out(node)
    nx = nelements(x)
    y = out[:nx].view(ns, nt, nh, dim)
    slots = out[nx:].view(K, ns, nh, dim, d_state)
    for t in range(nt):
        state = state * dA[:, t] + x_dt[:, t, :, :, None] * Bh[:, t, :, None, :]
        y[:, t] = (state @ Ch[:, t, :, :, None]).squeeze(-1)
        slot = nt - 1 - t
        if 0 < slot < K:
            slots[slot].copy_(state)
    slots[0].copy_(state)


def _by_sequence(t: torch.Tensor, n_seqs: int) -> torch.Tensor:
    """[1, n_tokens, H, S] -> [n_seqs, n_tokens / n_seqs, H, S] (the tokens split evenly)."""
    return t[0].reshape(n_seqs, -1, *t.shape[2:])


def _linear_attn_views(node, state_src: int):
    """(state [n_seqs, H, S, S] copy, out [n_seqs, T, H, S], new-state view, n_seqs) of the
    RWKV / GLA layout: outputs [S*H, n_tokens] then states [S*S*H, n_seqs]."""
    n_tokens = node.src[0].ne[2]
    S, H = node.src[0].ne[0], node.src[0].ne[1]
    n_seqs = node.src[state_src].ne[1]
    state = view(node.src[state_src]).reshape(n_seqs, H, S, S).clone()
    out = _flat_out(node)
    y = out[:n_tokens * H * S].view(n_seqs, n_tokens // n_seqs, H, S)
    new_state = out[n_tokens * H * S:].view(n_seqs, H, S, S)
    return state, y, new_state, n_seqs


@KERNELS.register(Op.RWKV_WKV6, supports=_all_f32)
def rwkv_wkv6(node):
    state, y, new_state, n = _linear_attn_views(node, 5)
    k, v, r, w = (_by_sequence(view(node.src[i]), n) for i in (0, 1, 2, 4))
    H, S = k.shape[-2], k.shape[-1]
    u = view(node.src[3]).reshape(H, S, 1)
    for t in range(k.shape[1]):
        kv = k[:, t, :, :, None] * v[:, t, :, None, :]                  # [n, H, i, j]
        y[:, t] = (r[:, t, :, None, :] @ (u * kv + state)).squeeze(-2)
        state = state * w[:, t, :, :, None] + kv
    new_state.copy_(state)


@KERNELS.register(Op.GATED_LINEAR_ATTN, supports=_all_f32)
def gated_linear_attn(node):
    state, y, new_state, n = _linear_attn_views(node, 4)
    k, v, q, g = (_by_sequence(view(node.src[i]), n) for i in range(4))
    q = q * get_op_params_f32(node, 0)
    for t in range(k.shape[1]):
        state = state * g[:, t, :, :, None] + k[:, t, :, :, None] * v[:, t, :, None, :]
        y[:, t] = (q[:, t, :, None, :] @ state).squeeze(-2)
    new_state.copy_(state)


@KERNELS.register(Op.RWKV_WKV7, supports=_all_f32)
def rwkv_wkv7(node):
    state, y, new_state, n = _linear_attn_views(node, 6)             # state [n, H, i (values), j (keys)]
    r, w, k, v, a, b = (_by_sequence(view(node.src[i]), n) for i in range(6))
    for t in range(k.shape[1]):
        sa = state @ a[:, t, :, :, None]                              # [n, H, i, 1]
        state = (state * w[:, t, :, None, :] + v[:, t, :, :, None] * k[:, t, :, None, :]
                 + sa * b[:, t, :, None, :])
        y[:, t] = (state @ r[:, t, :, :, None]).squeeze(-1)
    new_state.copy_(state)


@KERNELS.register(Op.SOLVE_TRI, supports=_all_f32)
def solve_tri(node):
    a, b = view(node.src[0]), view(node.src[1])                       # [.., n, n], [.., n, k]
    view(node).copy_(torch.linalg.solve_triangular(a, b, upper=False))


def _heads_tiled(t: torch.Tensor, n_head: int, n_seqs: int) -> torch.Tensor:
    """q/k [nsq, T, Hk, S] -> [n_seqs, T, n_head, S]: head h reads h % Hk (tiled), sequence s
    reads s / (n_seqs / nsq)."""
    if t.shape[2] != n_head:
        t = t.repeat(1, 1, n_head // t.shape[2], 1)
    if t.shape[0] != n_seqs:
        t = t.repeat_interleave(n_seqs // t.shape[0], dim=0)
    return t


@KERNELS.register(Op.GATED_DELTA_NET, supports=_all_f32)
def gated_delta_net(node):
    K = get_op_params_i32(node, 0)
    v = view(node.src[2])                                             # [ns, T, H, S]
    ns, T, H, S = v.shape
    q = _heads_tiled(view(node.src[0]), H, ns)
    k = _heads_tiled(view(node.src[1]), H, ns)
    decay = torch.exp(view(node.src[3]))                              # [ns, T, H, 1 or S]
    beta = view(node.src[4])                                          # [ns, T, H, 1]
    state = view(node.src[5]).transpose(-1, -2).clone()              # [ns, H, i (keys), j (values)]
    out = _flat_out(node)
    y = out[:ns * T * H * S].view(ns, T, H, S)
    slots = out[ns * T * H * S:].view(K, ns, H, S, S)                 # M[j][i] = S[i][j]
    scale = 1.0 / math.sqrt(S)
    for t in range(T):
        state = state * decay[:, t, :, :, None]                       # row i by exp(g_i) (or one exp(g))
        kt = k[:, t, :, None, :]                                      # [ns, H, 1, i]
        delta = beta[:, t] * (v[:, t] - (kt @ state).squeeze(-2))     # [ns, H, j]
        state = state + k[:, t, :, :, None] * delta[:, :, None, :]
        y[:, t] = (q[:, t, :, None, :] @ state).squeeze(-2) * scale
        slot = T - 1 - t
        if slot < K:
            slots[slot].copy_(state.transpose(-1, -2))
