"""Cases: SSM_CONV, SSM_SCAN (Mamba's per-state decay, Mamba-2's per-head decay, groups,
snapshots), RWKV_WKV6, GATED_LINEAR_ATTN, RWKV_WKV7, GATED_DELTA_NET (scalar and vector gate,
broadcast q/k heads, snapshots), SOLVE_TRI.

Each reference runs the op's recurrence token by token in float64, as ggml-cpu/ops.cpp defines
it: several sequences per call (ssm_scan picking its states through ids), and the state carried
over between calls (a graph with two calls, the second starting from the first's final states,
against one recurrence over all the tokens).
"""
from __future__ import annotations

import math

import torch

import torchggml as ggml
from .values import uniform
from .table import CaseTable

CASES = CaseTable()
case = CASES.case

T = ggml.Type


def softplus(x):
    """ggml's softplus: x above 20, log(1 + exp(x)) below."""
    return torch.where(x > 20.0, x, torch.log1p(torch.exp(torch.clamp_max(x, 20.0))))


def fixed(values):
    """An `init` entry: these integer values (torch order shape of the tensor)."""
    return lambda t, gen: torch.tensor(values, dtype=torch.int64).reshape(tuple(reversed(t.ne)))


def flat(*parts, width: int | None = None) -> torch.Tensor:
    """The parts' values one after another, as rows of `width` (default: one row)."""
    values = torch.cat([p.reshape(-1) for p in parts])
    return values.reshape(1, 1, -1, width or values.numel())


# ---------------------------------------------------------------- ssm_conv

def ssm_conv_ref(sx, c):
    """out[s, t, i] = sum_k sx[s, i, t + k] c[i, k]."""
    sx, c = sx[0], c[0, 0]
    d_conv = c.shape[1]
    n_t = sx.shape[-1] - d_conv + 1
    out = torch.zeros(sx.shape[0], n_t, sx.shape[1], dtype=torch.float64)
    for t in range(n_t):
        out[:, t] = (sx[:, :, t:t + d_conv] * c).sum(-1)
    return out[None]


for _d_conv, _d_inner, _n_t, _n_s in [(4, 16, 1, 1), (4, 32, 7, 3), (3, 8, 5, 2)]:
    def _build_ssm_conv(ctx, d_conv=_d_conv, d_inner=_d_inner, n_t=_n_t, n_s=_n_s):
        sx = ggml.new_tensor_3d(ctx, T.F32, d_conv - 1 + n_t, d_inner, n_s)
        c = ggml.new_tensor_2d(ctx, T.F32, d_conv, d_inner)
        return ggml.ssm_conv(ctx, sx, c), [sx, c]
    case("ssm_conv", f"d_conv={_d_conv},d_inner={_d_inner},n_t={_n_t},n_s={_n_s}", _build_ssm_conv, ssm_conv_ref)


# ---------------------------------------------------------------- ssm_scan

def ssm_scan_run(states, x, dt, A, B, C, ids, K=1):
    """(y [ns, nt, nh, dim], K state slots [K, ns, nh, dim, d_state]) of the selective scan:
    per sequence j from states[ids[j]], per token and head h (group g = h / (nh / ng)):
    dt' = softplus(dt), state = state * exp(dt' A[h]) + (x dt') B[g]^T, y = state C[g]."""
    ns, nt, nh, dim = x.shape
    ng, d_state = B.shape[2], B.shape[3]
    y = torch.zeros(ns, nt, nh, dim, dtype=torch.float64)
    slots = torch.zeros(K, ns, nh, dim, d_state, dtype=torch.float64)
    for j in range(ns):
        state = states[int(ids.reshape(-1)[j])].clone()               # [nh, dim, d_state]
        for t in range(nt):
            for h in range(nh):
                g = h // (nh // ng)
                d = softplus(dt[0, j, t, h])
                state[h] = state[h] * torch.exp(d * A[0, 0, h]) + torch.outer(x[j, t, h] * d, B[j, t, g])
                y[j, t, h] = state[h] @ C[j, t, g]
            if 0 <= nt - 1 - t < K:
                slots[nt - 1 - t, j] = state
    return y, slots


def ssm_scan_ref(states, x, dt, A, B, C, ids, K=1):
    return flat(*ssm_scan_run(states, x, dt, A, B, C, ids, K))


def _ssm_scan_inputs(ctx, d_state, dim, nh, ng, nt, ns, n_slots, a_per_state):
    s = ggml.new_tensor_4d(ctx, T.F32, d_state, dim, nh, n_slots)
    x = ggml.new_tensor_4d(ctx, T.F32, dim, nh, nt, ns)
    dt = ggml.new_tensor_3d(ctx, T.F32, nh, nt, ns)
    A = ggml.new_tensor_2d(ctx, T.F32, d_state if a_per_state else 1, nh)
    B = ggml.new_tensor_4d(ctx, T.F32, d_state, ng, nt, ns)
    C = ggml.new_tensor_4d(ctx, T.F32, d_state, ng, nt, ns)
    ids = ggml.new_tensor_1d(ctx, T.I32, ns)
    return [s, x, dt, A, B, C, ids]


# (name, d_state, head_dim, n_head, n_group, n_seq_tokens, n_seqs, state slots, ids, A per state, K)
SSM_SCAN_SHAPES = [
    ("mamba", 16, 1, 32, 1, 5, 2, 3, [2, 0], True, 1),
    ("mamba decode", 16, 1, 24, 1, 1, 3, 3, [1, 2, 0], True, 1),
    ("mamba2", 16, 8, 4, 2, 4, 3, 4, [3, 0, 1], False, 1),
    ("mamba2 decode", 32, 16, 4, 1, 1, 2, 2, [0, 1], False, 1),
    ("mamba2 snapshots", 16, 4, 4, 4, 5, 2, 2, [1, 0], False, 3),
]
_A_INIT = uniform(-1.0, -0.05)  # decays, as -exp(A_log)

for (_name, _ds, _dim, _nh, _ng, _nt, _ns, _slots, _ids, _a_ps, _K) in SSM_SCAN_SHAPES:
    def _build_scan(ctx, shape=(_ds, _dim, _nh, _ng, _nt, _ns, _slots, _a_ps), K=_K):
        inputs = _ssm_scan_inputs(ctx, *shape)
        return ggml.ssm_scan(ctx, *inputs, K), inputs
    case("ssm_scan", f"{_name},d_state={_ds},head_dim={_dim},n_head={_nh},n_group={_ng},n_t={_nt},n_s={_ns},K={_K}",
         _build_scan, lambda *v, K=_K: ssm_scan_ref(*v, K=K), init={3: _A_INIT, 6: fixed(_ids)})


def _build_scan_strided_x(ctx):
    """x, B and C as views of one wider row per token (llama.cpp's xBC split)."""
    d_state, dim, nh, nt, ns = 8, 4, 3, 3, 2
    s, _, dt, A, _, _, ids = _ssm_scan_inputs(ctx, d_state, dim, nh, 1, nt, ns, ns, False)
    width = dim * nh + 2 * d_state
    xbc = ggml.new_tensor_3d(ctx, T.F32, width, nt, ns)
    x = ggml.view_4d(ctx, xbc, dim, nh, nt, ns, dim * 4, xbc.nb[1], xbc.nb[2], 0)
    B = ggml.view_4d(ctx, xbc, d_state, 1, nt, ns, d_state * 4, xbc.nb[1], xbc.nb[2], dim * nh * 4)
    C = ggml.view_4d(ctx, xbc, d_state, 1, nt, ns, d_state * 4, xbc.nb[1], xbc.nb[2], (dim * nh + d_state) * 4)
    return ggml.ssm_scan(ctx, s, x, dt, A, B, C, ids, 1), [s, xbc, dt, A, ids]


def _scan_strided_ref(s, xbc, dt, A, ids):
    x = xbc[0, :, :, :12].reshape(2, 3, 3, 4)
    B, C = xbc[0, :, :, None, 12:20], xbc[0, :, :, None, 20:28]
    return ssm_scan_ref(s, x, dt, A, B, C, ids)


case("ssm_scan", "x, B, C views of one row", _build_scan_strided_x, _scan_strided_ref,
     init={3: _A_INIT, 4: fixed([1, 0])})


def _build_scan_carry(ctx):
    """Two calls: the second starts from the first's final states (its ids 0..n_s-1)."""
    d_state, dim, nh, ng, ns = 16, 4, 4, 2, 2
    first = _ssm_scan_inputs(ctx, d_state, dim, nh, ng, 3, ns, 3, False)
    y1 = ggml.ssm_scan(ctx, *first, 1)
    s, x, dt, A, B, C, ids = _ssm_scan_inputs(ctx, d_state, dim, nh, ng, 2, ns, 1, False)
    carried = ggml.view_4d(ctx, y1, d_state, dim, nh, ns, d_state * 4, d_state * dim * 4, d_state * dim * nh * 4,
                           ggml.nelements(first[1]) * 4)
    y2 = ggml.ssm_scan(ctx, carried, x, dt, first[3], B, C, ids, 1)
    return y2, first + [x, dt, B, C, ids]


def _scan_carry_ref(s, x1, dt1, A, B1, C1, ids1, x2, dt2, B2, C2, ids2):
    _, slots = ssm_scan_run(s, x1, dt1, A, B1, C1, ids1)
    return ssm_scan_ref(slots[0], x2, dt2, A, B2, C2, ids2)


case("ssm_scan", "state carried between calls", _build_scan_carry, _scan_carry_ref,
     init={3: _A_INIT, 6: fixed([2, 0]), 11: fixed([0, 1])})


# ---------------------------------------------------------------- rwkv_wkv6, gated_linear_attn, rwkv_wkv7

def _by_seq(t, n_seqs):
    """[1, n_tokens, H, S] -> [n_seqs, n_tokens / n_seqs, H, S]."""
    return t[0].reshape(n_seqs, -1, *t.shape[2:])


def linear_attn_run(kind, inputs, state, scale=1.0):
    """(out [n_tokens, H, S], final states [n_seqs, H, S, S]) of one of the per-head state
    recurrences, tokens split evenly between the sequences (state [1, 1, n_seqs, S*S*H])."""
    n_seqs = state.shape[2]
    tokens = [_by_seq(t, n_seqs) for t in inputs]
    H, S = tokens[0].shape[2], tokens[0].shape[3]
    states = state[0, 0].reshape(n_seqs, H, S, S).clone()
    out = torch.zeros(n_seqs, tokens[0].shape[1], H, S, dtype=torch.float64)
    for j in range(n_seqs):
        for t in range(tokens[0].shape[1]):
            for h in range(H):
                st = states[j, h]
                vals = [x[j, t, h] for x in tokens]
                if kind == "wkv6":     # S[i][j]: i keys, j values; u the bonus
                    k, v, r, u, w = vals
                    kv = torch.outer(k, v)
                    out[j, t, h] = r @ (u[:, None] * kv + st)
                    states[j, h] = st * w[:, None] + kv
                elif kind == "gla":
                    k, v, q, g = vals
                    states[j, h] = st * g[:, None] + torch.outer(k, v)
                    out[j, t, h] = (q * scale) @ states[j, h]
                else:                  # wkv7: S[i][j]: i values, j keys
                    r, w, k, v, a, b = vals
                    sa = st @ a
                    states[j, h] = st * w[None, :] + torch.outer(v, k) + torch.outer(sa, b)
                    out[j, t, h] = states[j, h] @ r
    return out.reshape(-1, H * S), states


def _bonus(tf, n_tokens):
    """wkv6's bonus u [S, H] as one row per token [1, n_tokens, H, S] (the same every token)."""
    return tf.reshape(1, 1, *tf.shape[-2:]).expand(1, n_tokens, -1, -1)


def _wkv6_ref(k, v, r, tf, td, state):
    return flat(*linear_attn_run("wkv6", [k, v, r, _bonus(tf, k.shape[1]), td], state), width=k.shape[-1] * k.shape[-2])


def _gla_ref(k, v, q, g, state, scale):
    return flat(*linear_attn_run("gla", [k, v, q, g], state, scale), width=k.shape[-1] * k.shape[-2])


def _wkv7_ref(r, w, k, v, a, b, state):
    return flat(*linear_attn_run("wkv7", [r, w, k, v, a, b], state), width=k.shape[-1] * k.shape[-2])


_DECAY = uniform(0.5, 1.0)    # w = exp(-exp(x)) in (0, 1)
_SMALL = uniform(-0.3, 0.3)   # wkv7's a and b (kk and kk * a): keep the state bounded

# (S, H, tokens per sequence, n_seqs)
LINEAR_ATTN_SHAPES = [(8, 2, 1, 1), (16, 3, 5, 2), (8, 4, 1, 3), (4, 2, 6, 1)]


def _tensors(ctx, n, S, H, n_tokens):
    return [ggml.new_tensor_3d(ctx, T.F32, S, H, n_tokens) for _ in range(n)]


for _S, _H, _nt, _ns in LINEAR_ATTN_SHAPES:
    _desc = f"S={_S},H={_H},n_seq_tokens={_nt},n_seqs={_ns}"

    def _build_wkv6(ctx, S=_S, H=_H, n=_nt * _ns, ns=_ns):
        k, v, r, td = _tensors(ctx, 4, S, H, n)
        tf = ggml.new_tensor_2d(ctx, T.F32, S, H)
        state = ggml.new_tensor_2d(ctx, T.F32, S * S * H, ns)
        return ggml.rwkv_wkv6(ctx, k, v, r, tf, td, state), [k, v, r, tf, td, state]
    case("rwkv_wkv6", _desc, _build_wkv6, _wkv6_ref, init={4: _DECAY})

    def _build_gla(ctx, S=_S, H=_H, n=_nt * _ns, ns=_ns):
        k, v, q, g = _tensors(ctx, 4, S, H, n)
        state = ggml.new_tensor_2d(ctx, T.F32, S * S * H, ns)
        return ggml.gated_linear_attn(ctx, k, v, q, g, state, 0.25), [k, v, q, g, state]
    case("gated_linear_attn", _desc, _build_gla, lambda *x: _gla_ref(*x, 0.25), init={3: _DECAY})

    def _build_wkv7(ctx, S=_S, H=_H, n=_nt * _ns, ns=_ns):
        r, w, k, v, a, b = _tensors(ctx, 6, S, H, n)
        state = ggml.new_tensor_2d(ctx, T.F32, S * S * H, ns)
        return ggml.rwkv_wkv7(ctx, r, w, k, v, a, b, state), [r, w, k, v, a, b, state]
    case("rwkv_wkv7", _desc, _build_wkv7, _wkv7_ref, init={1: _DECAY, 4: _SMALL, 5: _SMALL})


def _carry_view(ctx, first, S, H, n_tokens, n_seqs):
    """The final states of a first call, as the next call's state input [S*S*H, n_seqs]."""
    return ggml.view_2d(ctx, first, S * S * H, n_seqs, S * S * H * 4, S * H * n_tokens * 4)


def _build_wkv7_carry(ctx, S=8, H=2, ns=2):
    r, w, k, v, a, b = _tensors(ctx, 6, S, H, 3 * ns)
    state = ggml.new_tensor_2d(ctx, T.F32, S * S * H, ns)
    first = ggml.rwkv_wkv7(ctx, r, w, k, v, a, b, state)
    second = _tensors(ctx, 6, S, H, 2 * ns)
    out = ggml.rwkv_wkv7(ctx, *second, _carry_view(ctx, first, S, H, 3 * ns, ns))
    return out, [r, w, k, v, a, b, state] + second


def _wkv7_carry_ref(*x):
    _, states = linear_attn_run("wkv7", list(x[:6]), x[6])
    return _wkv7_ref(*x[7:], states.reshape(1, 1, states.shape[0], -1))


case("rwkv_wkv7", "state carried between calls", _build_wkv7_carry, _wkv7_carry_ref,
     init={1: _DECAY, 4: _SMALL, 5: _SMALL, 8: _DECAY, 11: _SMALL, 12: _SMALL})


def _build_wkv6_carry(ctx, S=8, H=2, ns=2):
    k, v, r, td = _tensors(ctx, 4, S, H, 2 * ns)
    tf = ggml.new_tensor_2d(ctx, T.F32, S, H)
    state = ggml.new_tensor_2d(ctx, T.F32, S * S * H, ns)
    first = ggml.rwkv_wkv6(ctx, k, v, r, tf, td, state)
    k2, v2, r2, td2 = _tensors(ctx, 4, S, H, ns)
    out = ggml.rwkv_wkv6(ctx, k2, v2, r2, tf, td2, _carry_view(ctx, first, S, H, 2 * ns, ns))
    return out, [k, v, r, tf, td, state, k2, v2, r2, td2]


def _wkv6_carry_ref(k, v, r, tf, td, state, k2, v2, r2, td2):
    _, states = linear_attn_run("wkv6", [k, v, r, _bonus(tf, k.shape[1]), td], state)
    return _wkv6_ref(k2, v2, r2, tf, td2, states.reshape(1, 1, states.shape[0], -1))


case("rwkv_wkv6", "state carried between calls", _build_wkv6_carry, _wkv6_carry_ref, init={4: _DECAY, 9: _DECAY})


def _build_gla_carry(ctx, S=8, H=2, ns=2):
    k, v, q, g = _tensors(ctx, 4, S, H, 3 * ns)
    state = ggml.new_tensor_2d(ctx, T.F32, S * S * H, ns)
    first = ggml.gated_linear_attn(ctx, k, v, q, g, state, 0.25)
    second = _tensors(ctx, 4, S, H, ns)
    out = ggml.gated_linear_attn(ctx, *second, _carry_view(ctx, first, S, H, 3 * ns, ns), 0.25)
    return out, [k, v, q, g, state] + second


def _gla_carry_ref(*x):
    _, states = linear_attn_run("gla", list(x[:4]), x[4], 0.25)
    return _gla_ref(*x[5:], states.reshape(1, 1, states.shape[0], -1), 0.25)


case("gated_linear_attn", "state carried between calls", _build_gla_carry, _gla_carry_ref, init={3: _DECAY, 8: _DECAY})


# ---------------------------------------------------------------- gated_delta_net

def gdn_run(q, k, v, g, beta, state, K=1):
    """(out [ns, T, H, S], K state slots [K, ns, H, S, S] in ggml's transposed layout M[j][i]):
    head h reads q/k head h % H_k, sequence s reads s / (ns / q_seqs). Per token:
    S *= exp(g) (row i by exp(g_i) for a vector gate); d = beta (v - S^T k); S += k d^T;
    out = S^T q / sqrt(S_v)."""
    ns, n_t, H, S = v.shape
    Hk, nsq = q.shape[2], q.shape[0]
    out = torch.zeros(ns, n_t, H, S, dtype=torch.float64)
    slots = torch.zeros(K, ns, H, S, S, dtype=torch.float64)
    for s in range(ns):
        for h in range(H):
            st = state[s, h].T.clone()                                      # [i keys, j values]
            sq = s // (ns // nsq)
            for t in range(n_t):
                qt, kt = q[sq, t, h % Hk], k[sq, t, h % Hk]
                gt = g[s, t, h]
                st = st * (torch.exp(gt)[:, None] if gt.numel() > 1 else torch.exp(gt[0]))
                d = beta[s, t, h, 0] * (v[s, t, h] - kt @ st)
                st = st + torch.outer(kt, d)
                out[s, t, h] = (qt @ st) / math.sqrt(S)
                if n_t - 1 - t < K:
                    slots[n_t - 1 - t, s, h] = st.T
    return out, slots


# (S, H, H_k, n_tokens, n_seqs, q/k seqs, vector gate, K)
GDN_SHAPES = [(16, 2, 2, 1, 1, 1, False, 1), (16, 4, 2, 5, 2, 2, False, 1), (8, 2, 1, 4, 2, 1, False, 1),
              (8, 2, 2, 3, 2, 2, True, 1), (8, 4, 4, 1, 3, 3, False, 1), (8, 2, 2, 4, 2, 2, False, 3)]

for _S, _H, _Hk, _nt, _ns, _nsq, _kda, _K in GDN_SHAPES:
    def _build_gdn(ctx, S=_S, H=_H, Hk=_Hk, nt=_nt, ns=_ns, nsq=_nsq, kda=_kda, K=_K):
        q = ggml.new_tensor_4d(ctx, T.F32, S, Hk, nt, nsq)
        k = ggml.new_tensor_4d(ctx, T.F32, S, Hk, nt, nsq)
        v = ggml.new_tensor_4d(ctx, T.F32, S, H, nt, ns)
        g = ggml.new_tensor_4d(ctx, T.F32, S if kda else 1, H, nt, ns)
        beta = ggml.new_tensor_4d(ctx, T.F32, 1, H, nt, ns)
        state = ggml.new_tensor_4d(ctx, T.F32, S, S, H, ns)
        return ggml.gated_delta_net(ctx, q, k, v, g, beta, state, K), [q, k, v, g, beta, state]
    case("gated_delta_net", f"S={_S},H={_H},H_k={_Hk},n_t={_nt},n_s={_ns},qk_seqs={_nsq},"
         f"gate={'vector' if _kda else 'scalar'},K={_K}", _build_gdn,
         lambda *x, K=_K: flat(*gdn_run(*x, K=K), width=x[2].shape[-1] * x[2].shape[-2]),
         init={1: uniform(-0.25, 0.25), 3: uniform(-1.0, 0.0), 4: uniform(0.0, 1.0)})


def _build_gdn_carry(ctx, S=8, H=2, ns=2):
    def inputs(nt):
        return ([ggml.new_tensor_4d(ctx, T.F32, S, H, nt, ns) for _ in range(3)]
                + [ggml.new_tensor_4d(ctx, T.F32, 1, H, nt, ns) for _ in range(2)])
    first = inputs(3)
    state = ggml.new_tensor_4d(ctx, T.F32, S, S, H, ns)
    y1 = ggml.gated_delta_net(ctx, *first, state, 1)
    carried = ggml.view_4d(ctx, y1, S, S, H, ns, S * 4, S * S * 4, S * S * H * 4, S * H * 3 * ns * 4)
    second = inputs(2)
    return ggml.gated_delta_net(ctx, *second, carried, 1), first + [state] + second


def _gdn_carry_ref(*x):
    _, slots = gdn_run(*x[:6])
    return flat(*gdn_run(*x[6:], slots[0]), width=x[2].shape[-1] * x[2].shape[-2])


_GDN_INIT = {1: uniform(-0.25, 0.25), 3: uniform(-1.0, 0.0), 4: uniform(0.0, 1.0)}
case("gated_delta_net", "state carried between calls", _build_gdn_carry, _gdn_carry_ref,
     init={**_GDN_INIT, **{i + 6: f for i, f in _GDN_INIT.items()}})


# ---------------------------------------------------------------- solve_tri

def solve_tri_ref(a, b):
    """Forward substitution: x_i = (b_i - sum_{t<i} a_it x_t) / a_ii, per matrix."""
    x = torch.zeros_like(b)
    for i in range(a.shape[-1]):
        x[..., i, :] = (b[..., i, :] - (a[..., i, :i, None] * x[..., :i, :]).sum(-2)) / a[..., i, i, None]
    return x


def _lower_triangular(t, gen):
    n = t.ne[0]
    a = torch.rand(tuple(reversed(t.ne)), generator=gen, dtype=torch.float64) * 2 - 1
    return torch.tril(a) + torch.eye(n, dtype=torch.float64) * 2.0


for _n, _k, _b2, _b3 in [(4, 1, 1, 1), (16, 3, 2, 2), (64, 8, 3, 1), (5, 7, 1, 2)]:
    def _build_solve_tri(ctx, n=_n, k=_k, b2=_b2, b3=_b3):
        a = ggml.new_tensor_4d(ctx, T.F32, n, n, b2, b3)
        b = ggml.new_tensor_4d(ctx, T.F32, k, n, b2, b3)
        return ggml.solve_tri(ctx, a, b, True, True, False), [a, b]
    case("solve_tri", f"n={_n},k={_k},batch=[{_b2},{_b3}]", _build_solve_tri, solve_tri_ref,
         init={0: _lower_triangular})
