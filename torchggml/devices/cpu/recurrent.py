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


def _shaped(array, *dims) -> bool:
    """array has these dims (None: any size); the scans index their inputs by one input's sizes,
    unchecked, so a binding takes a node only when every input has the shape the scan reads."""
    return array.ndim == len(dims) and all(d is None or n == d for n, d in zip(array.shape, dims))


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
    dt, A, B, C = _array(node.src[2])[0], _array(node.src[3])[0, 0], _array(node.src[4]), _array(node.src[5])
    ids = _array(node.src[6]).reshape(-1)
    ng, ds = B.shape[2], s_all.shape[3]
    if not (_shaped(s_all, None, nh, dim, ds) and _shaped(dt, ns, nt, nh) and _shaped(A, nh, None)
            and A.shape[1] in (1, ds) and _shaped(B, ns, nt, ng, ds) and _shaped(C, ns, nt, ng, ds)
            and ng and nh % ng == 0 and ids.shape[0] >= ns):
        return None
    scan = recurrent_kernels().ssm_scan

    def bound(_node):
        # the state slots are picked by the ids' values: data, checked at each call
        used = ids[:ns]
        if used.size and (used.min() < 0 or used.max() >= s_all.shape[0]):
            raise IndexError(f"SSM_SCAN: a state id outside [0, {s_all.shape[0]}) in {node.src[6].describe()} "
                             f"for {node.describe()}")
        scan(s_all, xs, dt, A, B, C, ids, y, slots)
    return bound


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
    if not all(_shaped(t, *k.shape) for t in (v, r, w, y)):
        return None
    u = _array(node.src[3]).reshape(k.shape[2], k.shape[3])
    return _call(recurrent_kernels().rwkv_wkv6, k, v, r, u, w, state, y, new_state)


def bind_wkv7(node):
    if not numba_available():
        return None
    n, state, y, new_state = _linear_attn_out(node, 6)
    inputs = [_by_sequence(node.src[i], n) for i in range(6)]
    if not all(_shaped(t, *inputs[2].shape) for t in inputs + [y]):
        return None
    return _call(recurrent_kernels().rwkv_wkv7, *inputs, state, y, new_state)


def bind_gated_delta_net(node):
    if not numba_available():
        return None
    v = _array(node.src[2])
    ns, T, H, S = v.shape
    out = _flat(node)
    y = out[:ns * T * H * S].reshape(ns, T, H, S)
    slots = out[ns * T * H * S:].reshape(get_op_params_i32(node, 0), ns, H, S, S)
    q, k, g, beta, state = (_array(node.src[i]) for i in (0, 1, 3, 4, 5))
    nsq = q.shape[0]
    if not (_shaped(q, None, T, None, S) and _shaped(k, *q.shape) and 0 < nsq <= ns and ns % nsq == 0
            and q.shape[2] > 0 and _shaped(g, ns, T, H, None) and g.shape[3] in (1, S)
            and _shaped(beta, ns, T, H, None) and beta.shape[3] >= 1 and _shaped(state, ns, H, S, S)):
        return None
    return _call(recurrent_kernels().gated_delta_net, q, k, v, g, beta, state, y, slots, 1.0 / math.sqrt(S))
