"""The CPU device's kernels for the recurrent ops: numba scans (cpu_recurrent_kernels.py) over
numpy views of the nodes' memory, layered over the torch kernels (kernels/recurrent.py), which
still run where numba is missing (TORCHGGML_CPU_FAST_OPS=0 or no numba) and for GATED_LINEAR_ATTN
and SSM_CONV (a few torch ops already)."""
from __future__ import annotations

import functools
import math
import os

from ..enums import Op
from ..tensor import get_op_params_i32, nelements
from .cpu_ops import as_numpy
from .cpu_quant.kernels import numba_available
from .kernels import KernelTable
from .kernels.common import view


@functools.cache
def _kernels():
    from . import cpu_recurrent_kernels
    return cpu_recurrent_kernels


def _flat(node):
    return as_numpy(view(node)).reshape(-1)


def _ssm_scan(node):
    x = node.src[1]
    nx = nelements(x)
    xs = as_numpy(view(x))
    ns, nt, nh, dim = xs.shape
    s_all = as_numpy(view(node.src[0]))
    out = _flat(node)
    y = out[:nx].reshape(ns, nt, nh, dim)
    slots = out[nx:].reshape(get_op_params_i32(node, 0), ns, nh, dim, s_all.shape[3])
    _kernels().ssm_scan(s_all, xs, as_numpy(view(node.src[2]))[0], as_numpy(view(node.src[3]))[0, 0],
                        as_numpy(view(node.src[4])), as_numpy(view(node.src[5])),
                        as_numpy(view(node.src[6])).reshape(-1), y, slots)


def _by_sequence(t, n_seqs):
    a = as_numpy(view(t))[0]
    return a.reshape(n_seqs, -1, *a.shape[1:])


def _linear_attn_out(node, state_src: int):
    S, H, n_tokens = node.src[0].ne[0], node.src[0].ne[1], node.src[0].ne[2]
    n_seqs = node.src[state_src].ne[1]
    out = _flat(node)
    y = out[:n_tokens * H * S].reshape(n_seqs, n_tokens // n_seqs, H, S)
    new_state = out[n_tokens * H * S:].reshape(n_seqs, H, S, S)
    state = as_numpy(view(node.src[state_src])).reshape(n_seqs, H, S, S)
    return n_seqs, state, y, new_state


def _wkv6(node):
    n, state, y, new_state = _linear_attn_out(node, 5)
    k, v, r, w = (_by_sequence(node.src[i], n) for i in (0, 1, 2, 4))
    u = as_numpy(view(node.src[3])).reshape(k.shape[2], k.shape[3])
    _kernels().rwkv_wkv6(k, v, r, u, w, state, y, new_state)


def _wkv7(node):
    n, state, y, new_state = _linear_attn_out(node, 6)
    _kernels().rwkv_wkv7(*(_by_sequence(node.src[i], n) for i in range(6)), state, y, new_state)


def _gated_delta_net(node):
    v = as_numpy(view(node.src[2]))
    ns, T, H, S = v.shape
    out = _flat(node)
    y = out[:ns * T * H * S].reshape(ns, T, H, S)
    slots = out[ns * T * H * S:].reshape(get_op_params_i32(node, 0), ns, H, S, S)
    _kernels().gated_delta_net(as_numpy(view(node.src[0])), as_numpy(view(node.src[1])), v,
                               as_numpy(view(node.src[3])), as_numpy(view(node.src[4])),
                               as_numpy(view(node.src[5])), y, slots, 1.0 / math.sqrt(S))


FAST = {Op.SSM_SCAN: _ssm_scan, Op.RWKV_WKV6: _wkv6, Op.RWKV_WKV7: _wkv7, Op.GATED_DELTA_NET: _gated_delta_net}


def _layered(fast, generic):
    def kernel(node):
        (fast if _enabled() else generic)(node)
    return kernel


@functools.cache
def _enabled() -> bool:
    return numba_available() and os.environ.get("TORCHGGML_CPU_FAST_OPS", "1") != "0"


def register_recurrent_kernels(table: KernelTable) -> None:
    """Layer the numba scans over the table's recurrent entries, keeping their supports()."""
    for op, fast in FAST.items():
        generic, supports = table.entries[op]
        table.register(op, supports=supports)(_layered(fast, generic))
