"""MUL_MAT (every broadcast rule; src0 of any readable type, block types dequantized; src1
F32/F16/BF16), MUL_MAT_ID (mixture of experts) and OUT_PROD.

Products run in float32 on dequantized weights. 2-D F16/BF16 weights keep float32 results as
in ggml (f32 accumulation and output), never a half-rounded product: where torch has a half GEMM
with float32 output for the device (torch.mm's out_dtype: CUDA) the activations are rounded to
the weight's type for it, as ggml's CUDA backend does; elsewhere the weight is converted to
float32 at each call and the activations are not rounded. So a product split into partial sums
(the meta device) matches one device to float32 summation order: on the F16 golden models
Meta(SIM0,SIM1) vs SIM0 moves from 6.6e-4 (half results) to 1e-5 relative L2 (rounding the
activations to F16 would leave 2.3e-4: summation-order differences flip their roundings). The
CPU table chooses its own faster half GEMM (devices/cpu/products.py).
Broadcasting a over b's dims 2 and 3 never copies a: b's matrices are regrouped by the a matrix
they share, so each a matrix meets all its b rows in one product. Large converted weights are
dequantized in row chunks to bound memory.
MUL_MAT binds its views and the conversion once; weights are read (converted) at every call.
A device may bind its own product for 2-D weights (`bind_mul_mat(node, weight_product)`): the CPU
multiplies weights in its repack buffers through torch's int4 GEMM that way (devices/cpu/products.py).
"""
from __future__ import annotations

import functools

import torch

from ...enums import Op
from ...types import Type, type_traits
from .table import KernelTable, binds
from .common import view, as_float, write, is_float

KERNELS = KernelTable("matmul")

# weights that need converting (block types, F16, BF16) are converted this many values at a time
CHUNK_VALUES = 1 << 22
@functools.lru_cache(maxsize=None)
def _readable_types() -> frozenset:
    from ...quants import dequantize_types
    return frozenset(dequantize_types())


def is_readable(t) -> bool:
    """F32/F16/BF16 or a block type the quants can dequantize."""
    return t is not None and t.type in _readable_types()


def float_reader(t):
    """fn(a slice of t's torch view) -> float32 values: a dequantize for block types, a cast
    otherwise. Chosen once per tensor; the values are read at each call."""
    if type_traits(t.type).is_quantized:
        from ...quants import dequantize
        block_type = t.type
        return lambda raw: dequantize(block_type, raw)
    return torch.Tensor.float


# ---------------------------------------------------------------- MUL_MAT

def _supports_mul_mat(node) -> bool:
    return is_readable(node.src[0]) and is_float(node.src[1]) and node.type == Type.F32


def _times_weight_t(weight_t, rows, out) -> None:
    torch.matmul(rows, weight_t, out=out)


def _times_converted(raw, to_float, rows, out) -> None:
    torch.matmul(rows, to_float(raw).T, out=out)


@functools.lru_cache(maxsize=None)
def _has_half_gemm_to_f32(device_type: str, dtype: torch.dtype) -> bool:
    """Whether torch.mm(half, half, out_dtype=float32, out=...) runs on this device type."""
    try:
        a = torch.zeros(1, 1, dtype=dtype, device=device_type)
        torch.mm(a, a, out_dtype=torch.float32, out=torch.empty(1, 1, device=device_type))
        return True
    except (RuntimeError, TypeError, NotImplementedError):
        return False


def _times_half_to_f32(weight_t, rows, out) -> None:
    """ggml's F16/BF16 product: activations rounded to the weight's type, float32 results."""
    torch.mm(rows.to(weight_t.dtype), weight_t, out_dtype=torch.float32, out=out)


def _times_half_converted(weight_t, rows, out) -> None:
    """Where torch has no half GEMM with float32 output: the weight in float32 (exact values)."""
    torch.matmul(rows, weight_t.float(), out=out)


def _times_chunks(chunks, to_float, rows, out) -> None:
    for cols, part in chunks:
        out[:, cols] = rows @ to_float(part).T


def bind_weight_product(a):
    """fn(rows [R, K], out [R, N]): out = rows @ a^T for a 2-D weight a (N rows of K). An F32
    weight is used in place; F16/BF16 ones by a half GEMM with float32 output where torch has one;
    others are converted at each call, chunk by chunk when big."""
    n, k = a.ne[1], a.ne[0]
    raw = view(a)[0, 0]
    if a.type == Type.F32:
        return functools.partial(_times_weight_t, raw.T)
    if a.type in (Type.F16, Type.BF16):
        half_gemm = _has_half_gemm_to_f32(raw.device.type, raw.dtype)
        return functools.partial(_times_half_to_f32 if half_gemm else _times_half_converted, raw.T)
    if n * k <= CHUNK_VALUES:
        return functools.partial(_times_converted, raw, float_reader(a))
    step = max(1, CHUNK_VALUES // k)
    chunks = tuple((slice(n0, n0 + step), raw[n0:n0 + step]) for n0 in range(0, n, step))
    return functools.partial(_times_chunks, chunks, float_reader(a))


def _reshaped(v, shape, regroup) -> torch.Tensor:
    rows = v.reshape(shape)
    return (rows if regroup is None else regroup(rows)).float()


def _bind_reshaped(v: torch.Tensor, shape, regroup=None):
    """fn() -> float32 values of v (its view reshaped to `shape`, then `regroup`ed). A contiguous
    v without a regroup is viewed now; anything else is reshaped at each call (a view when the
    strides allow, else a copy: never a copy taken now)."""
    if v.is_contiguous() and regroup is None:
        return v.view(shape).float
    return functools.partial(_reshaped, v, shape, regroup)


def _weight_times_rows(product, rows, out, _node) -> None:
    product(rows(), out)


def _batched_product(va, to_float, rows, out, _node) -> None:
    torch.matmul(rows(), to_float(va).transpose(-1, -2), out=out)


def _regrouped_product(va, to_float, rows, out, _node) -> None:
    """[a3, a2, r3, r2*m, n] products -> out [a3, r3, a2, r2*m, n] = [b3, b2, m, n]."""
    a3, r3, a2, r2m, n = out.shape
    product = torch.matmul(rows(), to_float(va).transpose(-1, -2))
    out.copy_(product.view(a3, a2, r3, r2m, n).transpose(1, 2))


def bind_mul_mat(node, weight_product=bind_weight_product):
    """b matrix (i2, i3) uses a matrix (i2 // r2, i3 // r3): b's rows are grouped by their a
    matrix, so each a matrix meets all its rows in one product and a is never repeated."""
    a, b = node.src[0], node.src[1]
    k, n, a2, a3 = a.ne
    m, b2, b3 = b.ne[1], b.ne[2], b.ne[3]
    r2, r3 = b2 // a2, b3 // a3
    vb, dst = view(b), view(node)  # the node is new: always contiguous
    if a2 == 1 and a3 == 1:  # one weight matrix meets every row of b, in the node's order
        return functools.partial(_weight_times_rows, weight_product(a), _bind_reshaped(vb, (-1, k)),
                                 dst.view(-1, n))
    if r3 == 1 or a2 == 1:  # the grouped order is b's order: regrouping is a reshape
        return functools.partial(_batched_product, view(a), float_reader(a), _bind_reshaped(vb, (a3, a2, -1, k)),
                                 dst.view(a3, a2, -1, n))
    # [b3, b2, m, k] -> [a3, r3, a2, r2*m, k] -> [a3, a2, r3 * r2*m, k]
    rows = _bind_reshaped(vb, (a3, r3, a2, r2 * m, k), lambda v: v.transpose(1, 2).reshape(a3, a2, -1, k))
    return functools.partial(_regrouped_product, view(a), float_reader(a), rows, dst.view(a3, r3, a2, r2 * m, n))


@KERNELS.register(Op.MUL_MAT, supports=_supports_mul_mat)
@binds(bind_mul_mat)
def mul_mat(node):
    bind_mul_mat(node)(node)


# ---------------------------------------------------------------- MUL_MAT_ID

def _supports_mul_mat_id(node) -> bool:
    ids = node.src[2]
    return (is_readable(node.src[0]) and is_float(node.src[1]) and ids is not None
            and ids.type == Type.I32 and node.type == Type.F32)


def experts_grouped(pair_experts: torch.Tensor):
    """(expert, indices of its pairs) for each used expert, in expert order."""
    order = torch.argsort(pair_experts, stable=True)
    used, counts = torch.unique_consecutive(pair_experts[order], return_counts=True)
    return zip(used.tolist(), torch.split(order, counts.tolist()))


def _dequantized_experts(raw, to_float, acts, pair_rows, pair_experts, out) -> None:
    """Each used expert dequantized once, meeting all its rows in one product."""
    for expert, sel in experts_grouped(pair_experts):
        out[sel] = acts[pair_rows[sel]] @ to_float(raw[expert]).T


def bind_expert_product(a):
    """fn(acts [R, K], pair_rows [P], pair_experts [P], out [P, N]): out[i] = expert
    pair_experts[i] of a (K x N x n_expert) @ acts[pair_rows[i]]."""
    return functools.partial(_dequantized_experts, view(a)[0], float_reader(a))


def _mul_mat_id(product, vb, vids, n_expert, pair_rows, dst, node) -> None:
    pair_experts = vids.reshape(-1).long()  # [n_tokens * n_used], token-major
    if pair_experts.numel() and (int(pair_experts.min()) < 0 or int(pair_experts.max()) >= n_expert):
        raise IndexError(f"mul_mat_id: expert ids outside [0, {n_expert}) in {node.src[2].describe()} "
                         f"for {node.describe()}")
    product(vb(), pair_rows, pair_experts, dst)


def bind_mul_mat_id(node, expert_product=bind_expert_product):
    """out[:, e, t] = experts[ids[e, t]] @ b[:, e % b.ne1, t]: the (token t, slot e) pairs read
    row t * b.ne1 + e % b.ne1 of b's rows; `expert_product` (a device may bind its own) runs them."""
    experts, b, ids = node.src[0], node.src[1], node.src[2]
    k, n, n_expert = experts.ne[0], experts.ne[1], experts.ne[2]
    n_used, n_tokens, b_used = ids.ne[0], ids.ne[1], b.ne[1]
    slots = torch.arange(n_used) % b_used
    pair_rows = (torch.arange(n_tokens)[:, None] * b_used + slots).reshape(-1).to(view(b).device)
    return functools.partial(_mul_mat_id, expert_product(experts), _bind_reshaped(view(b), (-1, k)),
                             view(ids)[0, 0], n_expert, pair_rows, view(node).view(-1, n))


@KERNELS.register(Op.MUL_MAT_ID, supports=_supports_mul_mat_id)
@binds(bind_mul_mat_id)
def mul_mat_id(node):
    bind_mul_mat_id(node)(node)


# ---------------------------------------------------------------- OUT_PROD

def _supports_out_prod(node) -> bool:
    return is_readable(node.src[0]) and is_float(node.src[1]) and node.type == Type.F32


@KERNELS.register(Op.OUT_PROD, supports=_supports_out_prod)
def out_prod(node):
    """out[i3, i2] = b[i3, i2]^T @ a[i3 // r3, i2 // r2] (torch order: [.., K, M] and [.., K, N])."""
    a, b = node.src[0], node.src[1]
    va, vb = as_float(a), as_float(b)
    r2, r3 = b.ne[2] // a.ne[2], b.ne[3] // a.ne[3]
    va = va.repeat_interleave(r2, dim=1).repeat_interleave(r3, dim=0) if r2 * r3 > 1 else va
    write(node, vb.transpose(-1, -2) @ va)
