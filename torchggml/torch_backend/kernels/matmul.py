"""MUL_MAT (every broadcast rule; src0 of any readable type, block types dequantized; src1
F32/F16/BF16), MUL_MAT_ID (mixture of experts) and OUT_PROD.

Products run in float32 on dequantized weights. Broadcasting a over b's dims 2 and 3 never
copies a: b's matrices are regrouped by the a matrix they share, so each a matrix meets all its
b rows in one product. Large converted weights are dequantized in row chunks to bound memory.
"""
from __future__ import annotations

import functools

import torch

from ...enums import Op
from ...types import type_traits
from . import CPU_KERNELS
from .common import view, as_float, write, is_float

# weights that need converting (block types, F16, BF16) are converted this many values at a time
CHUNK_VALUES = 1 << 22


@functools.lru_cache(maxsize=None)
def _readable_types() -> frozenset:
    from ...quants import dequantize_types
    return frozenset(dequantize_types())


def is_readable(t) -> bool:
    """F32/F16/BF16 or a block type the quants can dequantize."""
    return t is not None and t.type in _readable_types()


def rows_as_float(t, raw: torch.Tensor) -> torch.Tensor:
    """A slice of t's torch view (uint8 blocks for block types) as float32 values."""
    if type_traits(t.type).is_quantized:
        from ...quants import dequantize
        return dequantize(t.type, raw)
    return raw.float()


# ---------------------------------------------------------------- MUL_MAT

def _supports_mul_mat(node) -> bool:
    return is_readable(node.src[0]) and is_float(node.src[1]) and node.type.name == "F32"


def _weight_product(a, rows: torch.Tensor, out: torch.Tensor) -> None:
    """out [R, N] = rows [R, K] @ a^T for a 2-D weight a (N rows of K), converted chunk by
    chunk when big."""
    n, k = a.ne[1], a.ne[0]
    raw = view(a)[0, 0]
    if a.type.name == "F32" or n * k <= CHUNK_VALUES:
        torch.matmul(rows, rows_as_float(a, raw).T, out=out)
        return
    step = max(1, CHUNK_VALUES // k)
    for n0 in range(0, n, step):
        out[:, n0:n0 + step] = rows @ rows_as_float(a, raw[n0:n0 + step]).T


@CPU_KERNELS.register(Op.MUL_MAT, supports=_supports_mul_mat)
def mul_mat(node):
    a, b = node.src[0], node.src[1]
    k, n, a2, a3 = a.ne
    m, b2, b3 = b.ne[1], b.ne[2], b.ne[3]
    r2, r3 = b2 // a2, b3 // a3
    # b matrix (i2, i3) uses a matrix (i2 // r2, i3 // r3): group b's rows by their a matrix
    rows = as_float(b).reshape(a3, r3, a2, r2 * m, k).transpose(1, 2).reshape(a3, a2, r3 * r2 * m, k)
    dst = view(node).view(a3, r3, a2, r2 * m, n)  # a new node: always contiguous
    # with r3 == 1 the grouped order is the node's order: write straight into it
    grouped = dst.view(a3, a2, r2 * m, n) if r3 == 1 else torch.empty(
        a3, a2, r3 * r2 * m, n, dtype=torch.float32, device=rows.device)
    if a2 == 1 and a3 == 1:
        _weight_product(a, rows[0, 0], grouped.view(-1, n))
    else:
        torch.matmul(rows, as_float(a).transpose(-1, -2), out=grouped)
    if r3 > 1:  # [a3, a2, r3, r2*m, n] -> [a3, r3, a2, r2*m, n] = [b3, b2, m, n]
        dst.copy_(grouped.view(a3, a2, r3, r2 * m, n).transpose(1, 2))


# ---------------------------------------------------------------- MUL_MAT_ID

def _supports_mul_mat_id(node) -> bool:
    ids = node.src[2]
    return (is_readable(node.src[0]) and is_float(node.src[1]) and ids is not None
            and ids.type.name == "I32" and node.type.name == "F32")


@CPU_KERNELS.register(Op.MUL_MAT_ID, supports=_supports_mul_mat_id)
def mul_mat_id(node):
    """out[:, e, t] = experts[ids[e, t]] @ b[:, e % b.ne1, t], grouped by expert so that each
    used expert is dequantized once and meets all its rows in one product."""
    experts, b, ids = node.src[0], node.src[1], node.src[2]
    k, n, n_expert = experts.ne[0], experts.ne[1], experts.ne[2]
    n_used, n_tokens, b_used = ids.ne[0], ids.ne[1], b.ne[1]
    chosen = view(ids)[0, 0].long().reshape(-1)  # [n_tokens * n_used], token-major
    if chosen.numel() and (int(chosen.min()) < 0 or int(chosen.max()) >= n_expert):
        raise IndexError(f"mul_mat_id: expert ids outside [0, {n_expert}) in {ids.describe()} "
                         f"for {node.describe()}")
    acts = as_float(b)[0]  # [n_tokens, b_used, k]
    if b_used != n_used:
        acts = acts[:, torch.arange(n_used, device=acts.device) % b_used]
    acts = acts.reshape(-1, k)
    order = torch.argsort(chosen, stable=True)
    used, counts = torch.unique_consecutive(chosen[order], return_counts=True)
    result = torch.empty(chosen.numel(), n, dtype=torch.float32, device=acts.device)
    raw = view(experts)[0]  # [n_expert, n, row]
    start = 0
    for expert, count in zip(used.tolist(), counts.tolist()):
        sel = order[start:start + count]
        start += count
        result[sel] = acts[sel] @ rows_as_float(experts, raw[expert]).T
    write(node, result.view(1, n_tokens, n_used, n))


# ---------------------------------------------------------------- OUT_PROD

def _supports_out_prod(node) -> bool:
    return is_readable(node.src[0]) and is_float(node.src[1]) and node.type.name == "F32"


@CPU_KERNELS.register(Op.OUT_PROD, supports=_supports_out_prod)
def out_prod(node):
    """out[i3, i2] = b[i3, i2]^T @ a[i3 // r3, i2 // r2] (torch order: [.., K, M] and [.., K, N])."""
    a, b = node.src[0], node.src[1]
    va, vb = as_float(a), as_float(b)
    r2, r3 = b.ne[2] // a.ne[2], b.ne[3] // a.ne[3]
    va = va.repeat_interleave(r2, dim=1).repeat_interleave(r3, dim=0) if r2 * r3 > 1 else va
    write(node, vb.transpose(-1, -2) @ va)
