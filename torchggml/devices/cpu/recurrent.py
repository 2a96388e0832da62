"""The CPU's numba layer for the recurrent ops (cpu/kernels.py lists it before the torch kernels):
SSM_SCAN, RWKV_WKV6, RWKV_WKV7 and GATED_DELTA_NET as one numba scan each (jit/recurrent_kernels.py)
over numpy views of the node's memory, bound when a graph is compiled. GATED_LINEAR_ATTN, SSM_CONV
and SOLVE_TRI run the torch kernels (kernels/recurrent.py), as every op does without numba or with
TORCHGGML_CPU_FAST_OPS=0."""
from __future__ import annotations

import math

from ...tensor import get_op_params_i32, nelements
from ..kernels.common import view
from .fast_ops import as_numpy
from .jit.loader import numba_available, recurrent_kernels


def _array(t):
    return as_numpy(view(t))


def _flat(node):
    return _array(node).reshape(-1)


def _call(fn, *args):
    def bound(_node):
        fn(*args)
    return bound


def bind_ssm_scan(node):
    if not numba_available():
        return None
    x = node.src[1]
    nx = nelements(x)
    xs = _array(x)
    ns, nt, nh, dim = xs.shape
    s_all = _array(node.src[0])
    out = _flat(node)
    y = out[:nx].reshape(ns, nt, nh, dim)
    slots = out[nx:].reshape(get_op_params_i32(node, 0), ns, nh, dim, s_all.shape[3])
    return _call(recurrent_kernels().ssm_scan, s_all, xs, _array(node.src[2])[0], _array(node.src[3])[0, 0],
                 _array(node.src[4]), _array(node.src[5]), _array(node.src[6]).reshape(-1), y, slots)


def _by_sequence(t, n_seqs):
    a = _array(t)[0]
    return a.reshape(n_seqs, -1, *a.shape[1:])


def _linear_attn_out(node, state_src: int):
    """(n_seqs, old states, outputs, new states) in the RWKV layout: outputs [S*H, n_tokens], then
    the states [S*S*H, n_seqs]."""
    S, H, n_tokens = node.src[0].ne[0], node.src[0].ne[1], node.src[0].ne[2]
    n_seqs = node.src[state_src].ne[1]
    out = _flat(node)
    y = out[:n_tokens * H * S].reshape(n_seqs, n_tokens // n_seqs, H, S)
    new_state = out[n_tokens * H * S:].reshape(n_seqs, H, S, S)
    return n_seqs, _array(node.src[state_src]).reshape(n_seqs, H, S, S), y, new_state


def bind_wkv6(node):
    if not numba_available():
        return None
    n, state, y, new_state = _linear_attn_out(node, 5)
    k, v, r, w = (_by_sequence(node.src[i], n) for i in (0, 1, 2, 4))
    u = _array(node.src[3]).reshape(k.shape[2], k.shape[3])
    return _call(recurrent_kernels().rwkv_wkv6, k, v, r, u, w, state, y, new_state)


def bind_wkv7(node):
    if not numba_available():
        return None
    n, state, y, new_state = _linear_attn_out(node, 6)
    return _call(recurrent_kernels().rwkv_wkv7, *(_by_sequence(node.src[i], n) for i in range(6)), state, y, new_state)


def bind_gated_delta_net(node):
    if not numba_available():
        return None
    v = _array(node.src[2])
    ns, T, H, S = v.shape
    out = _flat(node)
    y = out[:ns * T * H * S].reshape(ns, T, H, S)
    slots = out[ns * T * H * S:].reshape(get_op_params_i32(node, 0), ns, H, S, S)
    return _call(recurrent_kernels().gated_delta_net, _array(node.src[0]), _array(node.src[1]), v,
                 _array(node.src[3]), _array(node.src[4]), _array(node.src[5]), y, slots, 1.0 / math.sqrt(S))
