"""The recurrent ops' builders reject bad shapes as ggml asserts them, with a ValueError naming the
op and the tensor (their values are checked in tests/test_ops.py, test_ops/cases/recurrent.py)."""
from __future__ import annotations

import pytest

import torchggml as ggml

T = ggml.Type


def _ssm_scan(ctx, dt_tokens=3, ids_type=T.I32, a_rows=1, K=1):
    s = ggml.new_tensor_4d(ctx, T.F32, 16, 4, 2, 3)
    x = ggml.new_tensor_4d(ctx, T.F32, 4, 2, 3, 2)
    dt = ggml.new_tensor_3d(ctx, T.F32, 2, dt_tokens, 2)
    A = ggml.new_tensor_2d(ctx, T.F32, a_rows, 2)
    B = ggml.new_tensor_4d(ctx, T.F32, 16, 1, 3, 2)
    C = ggml.new_tensor_4d(ctx, T.F32, 16, 1, 3, 2)
    ids = ggml.new_tensor_1d(ctx, ids_type, 2)
    return ggml.ssm_scan(ctx, s, x, dt, A, B, C, ids, K)


def _wkv6(ctx, td_tokens=4, state_seqs=2):
    k, v, r = (ggml.new_tensor_3d(ctx, T.F32, 8, 2, 4) for _ in range(3))
    tf = ggml.new_tensor_2d(ctx, T.F32, 8, 2)
    td = ggml.new_tensor_3d(ctx, T.F32, 8, 2, td_tokens)
    state = ggml.new_tensor_2d(ctx, T.F32, 8 * 8 * 2, state_seqs)
    return ggml.rwkv_wkv6(ctx, k, v, r, tf, td, state)


def _gdn(ctx, beta_heads=2, state_ne0=8, K=1):
    q, k, v = (ggml.new_tensor_4d(ctx, T.F32, 8, 2, 3, 1) for _ in range(3))
    g = ggml.new_tensor_4d(ctx, T.F32, 1, 2, 3, 1)
    beta = ggml.new_tensor_4d(ctx, T.F32, 1, beta_heads, 3, 1)
    state = ggml.new_tensor_4d(ctx, T.F32, state_ne0, 8, 2, 1)
    return ggml.gated_delta_net(ctx, q, k, v, g, beta, state, K)


BAD = [
    ("ssm_conv", lambda ctx: ggml.ssm_conv(ctx, ggml.new_tensor_3d(ctx, T.F32, 6, 8, 1),
                                           ggml.new_tensor_2d(ctx, T.F32, 4, 16)), "d_inner"),
    ("ssm_conv", lambda ctx: ggml.ssm_conv(ctx, ggml.new_tensor_3d(ctx, T.F32, 2, 8, 1),
                                           ggml.new_tensor_2d(ctx, T.F32, 4, 8)), "shorter than d_conv"),
    ("ssm_scan", lambda ctx: _ssm_scan(ctx, dt_tokens=2), "dt must be"),
    ("ssm_scan", lambda ctx: _ssm_scan(ctx, ids_type=T.F32), "ids must be an I32"),
    ("ssm_scan", lambda ctx: _ssm_scan(ctx, a_rows=3), "A.ne"),
    ("ssm_scan", lambda ctx: _ssm_scan(ctx, a_rows=16, K=2), "snapshots"),
    ("ssm_scan", lambda ctx: _ssm_scan(ctx, K=0), "K=0"),
    ("rwkv_wkv6", lambda ctx: _wkv6(ctx, td_tokens=3), "td must be"),
    ("rwkv_wkv6", lambda ctx: _wkv6(ctx, state_seqs=3), "split evenly"),
    ("gated_delta_net", lambda ctx: _gdn(ctx, beta_heads=1), "beta must be"),
    ("gated_delta_net", lambda ctx: _gdn(ctx, state_ne0=4), "state must be"),
    ("gated_delta_net", lambda ctx: _gdn(ctx, K=0), "K=0"),
    ("solve_tri", lambda ctx: ggml.solve_tri(ctx, ggml.new_tensor_2d(ctx, T.F32, 4, 3),
                                             ggml.new_tensor_2d(ctx, T.F32, 2, 3), True, True, False), "square"),
    ("solve_tri", lambda ctx: ggml.solve_tri(ctx, ggml.new_tensor_2d(ctx, T.F32, 4, 4),
                                             ggml.new_tensor_2d(ctx, T.F32, 2, 4), True, False, False), "lower=True"),
]


@pytest.mark.parametrize("op, build, message", BAD, ids=[f"{op}:{m}" for op, _, m in BAD])
def test_bad_shapes_raise(op, build, message):
    ctx = ggml.init(no_alloc=True)
    with pytest.raises(ValueError, match=message) as info:
        build(ctx)
    assert str(info.value).startswith(op) and "ne=" in str(info.value)


def test_result_shapes_follow_ggml():
    ctx = ggml.init(no_alloc=True)
    assert list(_ssm_scan(ctx).ne) == [4 * 2 * 3 * 2 + 16 * 4 * 2 * 2, 1, 1, 1]
    assert list(_wkv6(ctx).ne) == [16, 4 + 8 * 2, 1, 1]
    assert list(_gdn(ctx, K=2).ne) == [16, 3 + 2 * 8, 1, 1]
    sx, c = ggml.new_tensor_3d(ctx, T.F32, 7, 8, 2), ggml.new_tensor_2d(ctx, T.F32, 4, 8)
    assert list(ggml.ssm_conv(ctx, sx, c).ne) == [8, 4, 2, 1]
