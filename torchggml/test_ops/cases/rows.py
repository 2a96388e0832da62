"""Cases: GET_ROWS (every readable type -> F32, I32 -> I32, batched ids, strided sources) and
SET_ROWS (F32/F16 rows into float and quantized destinations at I64/I32 indices, indices
tiled over dims 2 and 3, a KV-cache view as destination).

Quantized SET_ROWS references quantize with the gguf package (the types gguf cannot quantize
with torchggml's quants: copy.quantized_roundtrip)."""
from __future__ import annotations

import torch

import torchggml as ggml
from .values import randint, ggml_permute, quantized_roundtrip
from .table import CaseTable
from .matmul import BLOCK_TYPES, inits_for

CASES = CaseTable()
case = CASES.case

T = ggml.Type


def get_rows_ref(a, ids):
    """out[i3, i2, j] = a[i3, i2, ids[i3, i2, j]] (torch order; ids as read: [1, a3, a2, n])."""
    idx = ids[0].unsqueeze(-1).expand(*ids.shape[1:], a.shape[-1])
    return torch.gather(a, 2, idx)


def _get_rows_case(type, ne0, n_rows, n, batch=(1, 1), permuted=False):
    def build(ctx):
        if permuted:  # a is heads-tokens permuted: rows strided by a whole [ne0, batch0] slab
            a0 = ggml.new_tensor_4d(ctx, type, ne0, batch[0], n_rows, batch[1])
            a = ggml.permute(ctx, a0, 0, 2, 1, 3)
        else:
            a0 = a = ggml.new_tensor_4d(ctx, type, ne0, n_rows, batch[0], batch[1])
        ids = ggml.new_tensor_3d(ctx, T.I32, n, batch[0], batch[1])
        return ggml.get_rows(ctx, a, ids), [a0, ids]
    ref = (lambda a0, ids: get_rows_ref(ggml_permute(a0, (0, 2, 1, 3)), ids)) if permuted else get_rows_ref
    init = {1: randint(0, n_rows), **inits_for({0: type})}
    if type == T.I32:
        init[0] = randint(-1000, 1000)
    case("get_rows", f"type={type.name},ne0={ne0},n_rows={n_rows},n={n},batch={list(batch)}"
         + (",permuted" if permuted else ""), build, ref, max_nmse=0.0, init=init)


for _type in (T.F32, T.F16, T.BF16, T.I32):
    _get_rows_case(_type, 16, 10, 5)
    _get_rows_case(_type, 33, 7, 12, (3, 2))  # ids repeat rows
_get_rows_case(T.F32, 16, 5, 3, (4, 2), permuted=True)
_get_rows_case(T.F16, 8, 6, 4, (3, 1), permuted=True)
for _type in BLOCK_TYPES:
    _get_rows_case(_type, max(256, ggml.blck_size(_type)), 6, 4)
for _type in (T.Q4_0, T.Q8_0, T.Q4_K):
    _get_rows_case(_type, 256, 5, 3, (2, 2))


def _get_rows_strided_ids(ctx):
    """ids a strided view (columns 1..2 of a [4, 3] I32 matrix): non-contiguous ids."""
    a = ggml.new_tensor_3d(ctx, T.F32, 12, 9, 3)
    ids0 = ggml.new_tensor_2d(ctx, T.I32, 4, 3)
    ids = ggml.view_2d(ctx, ids0, 2, 3, ids0.nb[1], ids0.nb[0])
    return ggml.get_rows(ctx, a, ids), [a, ids0]


case("get_rows", "strided ids", _get_rows_strided_ids, lambda a, ids0: get_rows_ref(a, ids0[..., 1:3]),
     max_nmse=0.0, init={1: randint(0, 9)})


# ---------------------------------------------------------------- SET_ROWS

def _store(type, rows: torch.Tensor) -> torch.Tensor:
    """rows [..., ne0] float64 as `type` stores them, read back as float64."""
    if type == T.F32:
        return rows.float().double()
    if type in (T.F16, T.BF16):
        return rows.to(ggml.type_to_dtype(type)).double()
    return quantized_roundtrip(type, rows)


def set_rows_ref(type):
    def ref(a, b, c):
        """a[i3, i2, c[i3 % c3, i2 % c2, j]] = b[i3, i2, j] (torch order; c as read: [1, c3, c2, n])."""
        ne3, ne2 = b.shape[0], b.shape[1]
        idx = c[0].repeat(ne3 // c.shape[1], ne2 // c.shape[2], 1)
        out = a.clone()
        i3 = torch.arange(ne3).view(-1, 1, 1)
        i2 = torch.arange(ne2).view(1, -1, 1)
        out[i3, i2, idx] = _store(type, b)
        return out
    return ref


def distinct_rows(n_rows: int):
    """An `init` entry for indices [n, c2, c3]: distinct rows in [0, n_rows) per (c2, c3)."""
    def make(t, gen):
        n, c2, c3 = t.ne[0], t.ne[1], t.ne[2]
        return torch.rand(c3, c2, n_rows, generator=gen).argsort(-1)[..., :n].reshape(1, c3, c2, n)
    return make


def _set_rows_case(type, ne0, n_rows, n, batch=(1, 1), idx_batch=None, idx_type=T.I64, b_type=T.F32):
    idx_batch = idx_batch or batch

    def build(ctx):
        a = ggml.new_tensor_4d(ctx, type, ne0, n_rows, batch[0], batch[1])
        b = ggml.new_tensor_4d(ctx, b_type, ne0, n, batch[0], batch[1])
        c = ggml.new_tensor_3d(ctx, idx_type, n, idx_batch[0], idx_batch[1])
        return ggml.set_rows(ctx, a, b, c), [a, b, c]
    case("set_rows", f"type={type.name},ne0={ne0},n_rows={n_rows},n={n},batch={list(batch)},"
         f"idx={idx_type.name}{list(idx_batch)},b={b_type.name}", build, set_rows_ref(type),
         max_nmse=0.0 if type in (T.F32, T.F16, T.BF16) else 1e-7, init={2: distinct_rows(n_rows)})


for _type in (T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.IQ4_NL, T.MXFP4,
              T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS):
    _ne0 = max(64, ggml.blck_size(_type))
    _set_rows_case(_type, _ne0, 10, 4)
    _set_rows_case(_type, _ne0, 8, 3, (3, 2), idx_type=T.I32)
    _set_rows_case(_type, _ne0, 8, 3, (3, 2), idx_batch=(1, 1))  # one index list for every batch
_set_rows_case(T.F32, 32, 9, 5, (4, 3), idx_batch=(2, 1))       # indices tiled over dim 2
_set_rows_case(T.F16, 32, 9, 5, (2, 2), b_type=T.F16)
_set_rows_case(T.Q8_0, 32, 9, 5, b_type=T.F16)


def _set_rows_kv_cache(ctx):
    """New K rows into the cells of one layer's slice of a 2-layer F16 cache (a view)."""
    cache = ggml.new_tensor_3d(ctx, T.F16, 128, 16, 2)
    layer1 = ggml.view_2d(ctx, cache, 128, 16, cache.nb[1], cache.nb[2])
    k_cur = ggml.new_tensor_2d(ctx, T.F32, 128, 3)
    cells = ggml.new_tensor_1d(ctx, T.I64, 3)
    return ggml.set_rows(ctx, layer1, k_cur, cells), [cache, k_cur, cells]


def _kv_cache_ref(cache, k_cur, cells):
    out = cache[0, 1].clone()
    out[cells.reshape(-1)] = k_cur[0, 0].to(torch.float16).double()
    return out


case("set_rows", "F16 cache layer view", _set_rows_kv_cache, _kv_cache_ref, max_nmse=0.0,
     init={2: distinct_rows(16)})


# decode shapes: one row of K or V into a cache (the CPU's numba kernel)
_set_rows_case(T.F16, 1024, 168, 1)
_set_rows_case(T.F32, 1024, 168, 1, idx_type=T.I32)
