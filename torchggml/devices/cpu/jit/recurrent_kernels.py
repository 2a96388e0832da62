"""numba kernels of the recurrent ops for the CPU device (cpu/recurrent.py binds them): one pass
over each sequence's state per token, heads in parallel, instead of several torch ops that each
read and write the whole state (a decode step of Mamba-2 2.7B moves a 2.6 MB state per layer).
The arithmetic is ggml-cpu/ops.cpp's, in float32 (softplus as logf(1 + expf(x)) below 20); the
torch kernels (kernels/recurrent.py) remain the reference. Imported only when a kernel first runs;
module-level functions so numba's disk cache holds them."""
import math

import numpy as np
from numba import njit, prange


@njit(cache=True, parallel=True)
def ssm_scan(s_all, x, dt, A, B, C, ids, y, slots):
    """s_all [n_slots, nh, dim, ds]; x, y [ns, nt, nh, dim]; dt [ns, nt, nh]; A [nh, ds or 1];
    B, C [ns, nt, ng, ds]; ids [ns]; slots [K, ns, nh, dim, ds] (slot 0: final states)."""
    ns, nt, nh, dim = x.shape
    ds, ng, K = s_all.shape[3], B.shape[2], slots.shape[0]
    per_state = A.shape[1] != 1
    for job in prange(ns * nh):
        j, h = job // nh, job % nh
        g = h // (nh // ng)
        st = slots[0, j, h]
        st[:, :] = s_all[ids[j], h]
        for t in range(nt):
            d = dt[j, t, h]
            if d <= 20.0:
                d = np.float32(math.log(np.float32(1.0) + np.float32(math.exp(d))))
            dA = np.float32(math.exp(d * A[h, 0]))
            for i in range(dim):
                xd = x[j, t, h, i] * d
                acc = np.float32(0.0)
                for k in range(ds):
                    if per_state:
                        dA = np.float32(math.exp(d * A[h, k]))
                    v = st[i, k] * dA + B[j, t, g, k] * xd
                    st[i, k] = v
                    acc += v * C[j, t, g, k]
                y[j, t, h, i] = acc
            slot = nt - 1 - t
            if 0 < slot < K:
                slots[slot, j, h] = st


@njit(cache=True)
def _head_state(state, out_state, job, H):
    """(sequence, head, its state) of a job: the head's new state starts as a copy of the old."""
    j, h = job // H, job % H
    st = out_state[j, h]
    st[:, :] = state[j, h]
    return j, h, st


@njit(cache=True, parallel=True)
def rwkv_wkv6(k, v, r, u, w, state, y, out_state):
    """k, v, r, w, y [ns, T, H, S]; u [H, S]; state, out_state [ns, H, S (keys), S (values)]."""
    ns, T, H, S = k.shape
    for job in prange(ns * H):
        j, h, st = _head_state(state, out_state, job, H)
        for t in range(T):
            for c in range(S):
                y[j, t, h, c] = 0.0
            for i in range(S):
                ki, ri, ui, wi = k[j, t, h, i], r[j, t, h, i], u[h, i], w[j, t, h, i]
                for c in range(S):
                    kv = ki * v[j, t, h, c]
                    y[j, t, h, c] += ri * (ui * kv + st[i, c])
                    st[i, c] = st[i, c] * wi + kv


@njit(cache=True, parallel=True)
def rwkv_wkv7(r, w, k, v, a, b, state, y, out_state):
    """r, w, k, v, a, b, y [ns, T, H, S]; state, out_state [ns, H, S (values), S (keys)]."""
    ns, T, H, S = k.shape
    for job in prange(ns * H):
        j, h, st = _head_state(state, out_state, job, H)
        for t in range(T):
            for i in range(S):
                sa = np.float32(0.0)
                for c in range(S):
                    sa += a[j, t, h, c] * st[i, c]
                vi = v[j, t, h, i]
                acc = np.float32(0.0)
                for c in range(S):
                    st[i, c] = st[i, c] * w[j, t, h, c] + vi * k[j, t, h, c] + sa * b[j, t, h, c]
                    acc += st[i, c] * r[j, t, h, c]
                y[j, t, h, i] = acc


@njit(cache=True, parallel=True)
def gated_delta_net(q, k, v, g, beta, state, y, slots, scale):
    """q, k [nsq, T, Hk, S]; v, y [ns, T, H, S]; g [ns, T, H, 1 or S]; beta [ns, T, H, 1];
    state [ns, H, S, S] and slots [K, ns, H, S, S] as ggml's M[j][i] = S[i][j] (i over keys)."""
    ns, T, H, S = v.shape
    nsq, Hk, K = q.shape[0], q.shape[2], slots.shape[0]
    vector_gate = g.shape[3] != 1
    delta = np.empty((ns * H, S), dtype=np.float32)
    decay = np.empty((ns * H, S), dtype=np.float32)
    for job in prange(ns * H):
        s, h = job // H, job % H
        sq, hq = s // (ns // nsq), h % Hk
        m = slots[0, s, h]
        m[:, :] = state[s, h]
        d, e = delta[job], decay[job]
        for t in range(T):
            for i in range(S):
                e[i] = np.float32(math.exp(g[s, t, h, i if vector_gate else 0]))
            for c in range(S):         # row c of M is column c of S (value c)
                for i in range(S):
                    m[c, i] *= e[i]
            bt = beta[s, t, h, 0]
            for c in range(S):
                acc = np.float32(0.0)
                for i in range(S):
                    acc += m[c, i] * k[sq, t, hq, i]
                d[c] = (v[s, t, h, c] - acc) * bt
            for c in range(S):
                acc = np.float32(0.0)
                for i in range(S):
                    m[c, i] += k[sq, t, hq, i] * d[c]
                    acc += m[c, i] * q[sq, t, hq, i]
                y[s, t, h, c] = acc * scale
            slot = T - 1 - t
            if 0 < slot < K:
                slots[slot, s, h] = m
