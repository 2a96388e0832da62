"""Recurrent layers' ops: state-space models (ssm_conv, ssm_scan), linear attention with a
per-head state (rwkv_wkv6, gated_linear_attn, rwkv_wkv7, gated_delta_net) and the triangular
solve of chunked linear attention (solve_tri).

The state-carrying ops return one flat F32 tensor: the outputs first, then the new states
(ggml's layout, so that graph builders take both with views). Sequences: ssm_scan reads each
sequence's state through `ids` (rows of s, which may hold more sequences than the batch);
the RWKV / GLA ops split the tokens evenly between state.ne[1] sequences; gated_delta_net has
the sequences in dim 3.
"""
from __future__ import annotations

from ..enums import Op
from ..tensor import Tensor, is_contiguous, is_contiguous_rows, is_matrix, is_vector, nelements, are_same_shape
from ..types import Type, type_size
from ._common import new_op, require

__all__ = ["ssm_conv", "ssm_scan", "rwkv_wkv6", "gated_linear_attn", "rwkv_wkv7", "solve_tri",
           "gated_delta_net"]


def ssm_conv(ctx, sx: Tensor, c: Tensor) -> Tensor:
    """Depthwise causal convolution of each sequence's window. sx [d_conv - 1 + n_t, d_inner,
    n_s] (the previous d_conv - 1 inputs then the new ones, per channel), c [d_conv, d_inner]:
    result F32 [d_inner, n_t, n_s], out[i, t, s] = sum_k sx[t + k, i, s] * c[k, i]."""
    op = "ssm_conv"
    require(sx.ne[3] == 1, op, "sx must be 3-D [d_conv - 1 + n_t, d_inner, n_s]", sx)
    require(is_matrix(c), op, "c must be a matrix [d_conv, d_inner]", c)
    require(sx.type == Type.F32 and c.type == Type.F32, op, "sx and c must be F32", sx, c)
    d_conv, d_inner = c.ne[0], c.ne[1]
    n_t = sx.ne[0] - d_conv + 1
    require(n_t >= 0, op, f"sx.ne[0]={sx.ne[0]} is shorter than d_conv - 1 = {d_conv - 1}", sx, c)
    require(sx.ne[1] == d_inner, op, f"sx.ne[1]={sx.ne[1]} != d_inner={d_inner}", sx, c)
    require(sx.nb[0] == 4 and sx.nb[1] == sx.ne[0] * 4, op, "sx rows must be contiguous", sx)
    return new_op(ctx, Op.SSM_CONV, Type.F32, [d_inner, n_t, sx.ne[2], 1], [sx, c])


def ssm_scan(ctx, s: Tensor, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, ids: Tensor,
             K: int) -> Tensor:
    """The selective scan of Mamba (A [d_state, n_head]) and Mamba-2 (A [1, n_head]).
    s [d_state, head_dim, n_head, >= n_seqs] states (sequence j starts from s[..., ids[j]]),
    x [head_dim, n_head, n_seq_tokens, n_seqs], dt [n_head, n_seq_tokens, n_seqs],
    B, C [d_state, n_group, n_seq_tokens, n_seqs] (head h uses group h / (n_head / n_group)).
    Per token: dt' = softplus(dt), state = state * exp(dt' A) + B x dt', y = C . state.
    Result F32, flat: y (as x, contiguous) then K state slots of [d_state, head_dim, n_head,
    n_seqs]: slot 0 the final states, slot k the states k tokens before the end (K > 1 only for
    the scalar-decay form; slots older than the batch stay unwritten)."""
    op = "ssm_scan"
    require(K >= 1 and K <= 2**31 - 1, op, f"K={K} must lie in [1, INT32_MAX]", x)
    for name, t in (("s", s), ("dt", dt), ("A", A)):
        require(is_contiguous(t), op, f"{name} must be contiguous", t)
    for name, t in (("x", x), ("B", B), ("C", C)):
        require(t.nb[0] == type_size(t.type) and t.nb[1] == t.ne[0] * t.nb[0], op,
                f"{name}'s first two dims must be contiguous", t)
    for name, t in (("s", s), ("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C)):
        require(t.type == Type.F32, op, f"{name} must be F32", t)
    require(are_same_shape(B, C), op, "B and C must have the same shape", B, C)
    require(ids.type == Type.I32 and is_vector(ids), op, "ids must be an I32 vector", ids)
    d_state, head_dim, n_head, n_seq_tokens, n_seqs = s.ne[0], x.ne[0], x.ne[1], x.ne[2], x.ne[3]
    require(list(dt.ne[:3]) == [n_head, n_seq_tokens, n_seqs] and dt.ne[3] == 1, op,
            f"dt must be [{n_head}, {n_seq_tokens}, {n_seqs}]", dt, x)
    require(s.ne[1] == head_dim and s.ne[2] == n_head, op, f"s must be [d_state, {head_dim}, {n_head}, ...]", s, x)
    require(B.ne[0] == d_state and B.ne[2] == n_seq_tokens and B.ne[3] == n_seqs, op,
            f"B must be [{d_state}, n_group, {n_seq_tokens}, {n_seqs}]", B, x)
    require(n_head % B.ne[1] == 0, op, f"n_head={n_head} must be a multiple of n_group={B.ne[1]}", B, x)
    require(ids.ne[0] == n_seqs, op, f"ids must have n_seqs={n_seqs} entries", ids, x)
    require(is_matrix(A) and A.ne[1] == n_head, op, f"A must be [d_state or 1, {n_head}]", A)
    require(A.ne[0] in (1, d_state), op, f"A.ne[0] must be 1 or d_state={d_state}", A, s)
    require(A.ne[0] == 1 or K == 1, op, "state snapshots (K > 1) need the scalar-decay form (A [1, n_head])", A)
    n = nelements(x) + K * d_state * head_dim * n_head * n_seqs
    return new_op(ctx, Op.SSM_SCAN, Type.F32, [n, 1, 1, 1], [s, x, dt, A, B, C, ids], [int(K)])


def _linear_attn_checks(op: str, S: int, H: int, n_tokens: int, state: Tensor, named) -> int:
    """The shared checks of rwkv_wkv6/7 and gated_linear_attn; returns n_seqs."""
    for name, t in named:
        require(is_contiguous(t), op, f"{name} must be contiguous", t)
        require(t.type == Type.F32, op, f"{name} must be F32", t)
    for name, t in named:
        if name not in ("state", "time_first"):
            require(list(t.ne[:3]) == [S, H, n_tokens], op, f"{name} must be [{S}, {H}, {n_tokens}]", t)
    n_seqs = state.ne[1]
    require(nelements(state) == S * S * H * n_seqs, op,
            f"state must hold S*S*H*n_seqs = {S}*{S}*{H}*{n_seqs} values", state)
    require(n_seqs > 0 and n_tokens % n_seqs == 0, op,
            f"n_tokens={n_tokens} must split evenly into n_seqs={n_seqs} sequences", state)
    return n_seqs


def _linear_attn_result(ctx, op: Op, S: int, H: int, n_tokens: int, n_seqs: int, srcs, params=()) -> Tensor:
    # outputs [S*H, n_tokens] then the new states [S*H, S*n_seqs]
    return new_op(ctx, op, Type.F32, [S * H, n_tokens + S * n_seqs, 1, 1], srcs, params)


def rwkv_wkv6(ctx, k: Tensor, v: Tensor, r: Tensor, tf: Tensor, td: Tensor, state: Tensor) -> Tensor:
    """RWKV-6's time mixing. k, v, r, td [S, H, n_tokens] (td: the per-token decay w), tf
    [S, H] (the bonus u), state [S*S*H, n_seqs] (per head S[i][j], i over keys, j over values).
    Per token: out_j = sum_i r_i (u_i k_i v_j + S_ij); S_ij = S_ij w_i + k_i v_j.
    Result F32 [S*H, n_tokens + S*n_seqs]: outputs, then the final states."""
    S, H, n_tokens = k.ne[0], k.ne[1], k.ne[2]
    n_seqs = _linear_attn_checks("rwkv_wkv6", S, H, n_tokens, state,
                                 (("k", k), ("v", v), ("r", r), ("time_first", tf), ("td", td), ("state", state)))
    require(nelements(tf) == S * H, "rwkv_wkv6", f"tf must hold S*H = {S * H} values", tf)
    return _linear_attn_result(ctx, Op.RWKV_WKV6, S, H, n_tokens, n_seqs, [k, v, r, tf, td, state])


def gated_linear_attn(ctx, k: Tensor, v: Tensor, q: Tensor, g: Tensor, state: Tensor, scale: float) -> Tensor:
    """Gated linear attention. k, v, q, g [S, H, n_tokens], state [S*S*H, n_seqs].
    Per token: S_ij = S_ij g_i + k_i v_j; out_j = scale * sum_i q_i S_ij (the new state).
    Result F32 [S*H, n_tokens + S*n_seqs]."""
    S, H, n_tokens = k.ne[0], k.ne[1], k.ne[2]
    n_seqs = _linear_attn_checks("gated_linear_attn", S, H, n_tokens, state,
                                 (("k", k), ("v", v), ("q", q), ("g", g), ("state", state)))
    return _linear_attn_result(ctx, Op.GATED_LINEAR_ATTN, S, H, n_tokens, n_seqs, [k, v, q, g, state],
                               [float(scale)])


def rwkv_wkv7(ctx, r: Tensor, w: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, state: Tensor) -> Tensor:
    """RWKV-7's time mixing. r, w, k, v, a, b [S, H, n_tokens], state [S*S*H, n_seqs] (per head
    S[i][j], i over values, j over keys). Per token: sa_i = sum_j a_j S_ij;
    S_ij = S_ij w_j + v_i k_j + sa_i b_j; out_i = sum_j S_ij r_j.
    Result F32 [S*H, n_tokens + S*n_seqs]."""
    S, H, n_tokens = k.ne[0], k.ne[1], k.ne[2]
    n_seqs = _linear_attn_checks("rwkv_wkv7", S, H, n_tokens, state,
                                 (("r", r), ("w", w), ("k", k), ("v", v), ("a", a), ("b", b), ("state", state)))
    return _linear_attn_result(ctx, Op.RWKV_WKV7, S, H, n_tokens, n_seqs, [r, w, k, v, a, b, state])


def solve_tri(ctx, a: Tensor, b: Tensor, left: bool, lower: bool, uni: bool) -> Tensor:
    """X with A X = B, per matrix of dims 2 and 3: a [n, n] lower triangular (row i is a's row
    i, non-zero diagonal), b [k, n] (k right-hand sides). Only left, lower, non-unit (as ggml)."""
    op = "solve_tri"
    require(a.type == Type.F32 and b.type == Type.F32, op, "a and b must be F32", a, b)
    require(a.ne[0] == a.ne[1], op, "a must be square", a)
    require(a.ne[1] == b.ne[1], op, "b must have as many rows as a", a, b)
    require(a.ne[2] == b.ne[2] and a.ne[3] == b.ne[3], op, "a and b must have the same batch dims", a, b)
    require(is_contiguous(a) and is_contiguous(b), op, "a and b must be contiguous", a, b)
    require(left and lower and not uni, op, "only left=True, lower=True, uni=False is implemented (as ggml)", a)
    return new_op(ctx, Op.SOLVE_TRI, Type.F32, list(b.ne), [a, b])


def gated_delta_net(ctx, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, K: int) -> Tensor:
    """The gated delta rule (Qwen3-Next's linear attention; Kimi's KDA with a vector gate).
    q, k [S, H_k, n_tokens, n_seqs] (head h reads q/k head h % H_k, sequence s reads s / (n_seqs
    / q.ne3)), v [S, H, n_tokens, n_seqs], g [1 or S, H, n_tokens, n_seqs] (log decay), beta
    [1, H, n_tokens, n_seqs], state [S, S, H, n_seqs] (M[j][i] = S[i][j], i over keys).
    Per token: S *= exp(g) (row i by exp(g_i) with a vector gate); d_j = beta (v_j - sum_i S_ij k_i);
    S_ij += k_i d_j; out_j = sum_i S_ij q_i / sqrt(S).
    Result F32 [S*H, n_tokens*n_seqs + K*S*n_seqs]: outputs [S, H, n_tokens, n_seqs], then K
    state slots of [S, S, H, n_seqs] (slot 0 final, slot k k tokens back; older ones unwritten)."""
    op = "gated_delta_net"
    for name, t in (("q", q), ("k", k), ("v", v)):
        require(is_contiguous_rows(t), op, f"{name} rows must be contiguous", t)
    for name, t in (("g", g), ("beta", beta), ("state", state)):
        require(is_contiguous(t), op, f"{name} must be contiguous", t)
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("state", state)):
        require(t.type == Type.F32, op, f"{name} must be F32", t)
    S, H, n_tokens, n_seqs = v.ne
    require(q.ne[0] == S and k.ne[0] == S, op, f"q and k rows must have S={S} values", q, k, v)
    require(are_same_shape(q, k), op, "q and k must have the same shape", q, k)
    require(q.ne[2] == n_tokens and H % q.ne[1] == 0 and n_seqs % q.ne[3] == 0, op,
            "q/k heads and sequences must divide v's", q, v)
    require(g.ne[0] in (1, S) and list(g.ne[1:]) == [H, n_tokens, n_seqs], op,
            f"g must be [1 or {S}, {H}, {n_tokens}, {n_seqs}]", g, v)
    require(list(beta.ne) == [1, H, n_tokens, n_seqs], op, f"beta must be [1, {H}, {n_tokens}, {n_seqs}]", beta, v)
    require(list(state.ne) == [S, S, H, n_seqs], op, f"state must be [{S}, {S}, {H}, {n_seqs}]", state, v)
    require(K >= 1, op, f"K={K} must be >= 1", v)
    return new_op(ctx, Op.GATED_DELTA_NET, Type.F32, [S * H, n_tokens * n_seqs + K * S * n_seqs, 1, 1],
                  [q, k, v, g, beta, state], [int(K)])
