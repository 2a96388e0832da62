"""The KV cache: per layer, K and V rows [n_embd_k_gqa, n_ctx] on the layer's device.

Cells are used in order: the token at position p is stored in cell p, so a sequence of n
tokens occupies cells [0, n). Graph builders write new rows with set_rows (converting F32 to
the cache type: F16 by default, any of KV_TYPES when asked) and read the first n_kv cells back
as [head_dim, n_kv, n_head_kv] views.
"""
from __future__ import annotations

from ..alloc import backend_alloc_ctx_tensors_from_buft
from ..backend.buffer import backend_buffer_clear
from ..backend.tensor_io import backend_tensor_memset
from ..context import Context, new_tensor_2d
from ..ops import set_rows, view_3d, reshape_2d
from ..tensor import Tensor, round_up, set_name
from ..types import Type, as_type, row_size, blck_size

# llama.cpp's cache types (-ctk/-ctv), plus the K types and IQ4_XS, whose 256-value blocks
# need a head size that is a multiple of 256
KV_TYPES = {t.name.lower(): t for t in (
    Type.F32, Type.F16, Type.BF16, Type.Q8_0, Type.Q4_0, Type.Q4_1, Type.IQ4_NL, Type.Q5_0, Type.Q5_1,
    Type.Q2_K, Type.Q3_K, Type.Q4_K, Type.Q5_K, Type.Q6_K, Type.IQ4_XS)}

# the number of cells a graph attends to is padded to this, so decode steps reuse one graph
KV_PAD = 256


def kv_type_from_name(name) -> Type:
    if isinstance(name, str) and name.lower() in KV_TYPES:
        return KV_TYPES[name.lower()]
    try:
        t = as_type(name)
    except ValueError:
        t = None
    if t not in KV_TYPES.values():
        raise ValueError(f"kv_type {name!r} is not supported; choose one of {sorted(KV_TYPES)}")
    return t


class KVCache:
    """K and V tensors per layer. `bufts[il]` is the buffer type of layer il's cache."""

    def __init__(self, n_layer: int, n_ctx: int, head_dim_k: int, head_dim_v: int, n_head_kv: int,
                 kv_type: Type, bufts):
        if len(bufts) != n_layer:
            raise ValueError(f"KVCache: {len(bufts)} buffer types for {n_layer} layers")
        for head_dim in (head_dim_k, head_dim_v):
            if head_dim % blck_size(kv_type):
                raise ValueError(f"KVCache: head size {head_dim} is not a multiple of "
                                 f"{kv_type.name}'s block size {blck_size(kv_type)}")
        self.n_ctx = n_ctx
        self.type = kv_type
        self.head_dim_k, self.head_dim_v, self.n_head_kv = head_dim_k, head_dim_v, n_head_kv
        self.n_past = 0  # cells in use
        self.n_written = 0  # cells written since the last clear (the ones clear() zeroes)
        self.k: list[Tensor] = []
        self.v: list[Tensor] = []
        self.buffers = []
        ctxs: dict[int, tuple[object, Context]] = {}
        for il, buft in enumerate(bufts):
            _, ctx = ctxs.setdefault(id(buft), (buft, Context(no_alloc=True)))
            self.k.append(set_name(new_tensor_2d(ctx, kv_type, head_dim_k * n_head_kv, n_ctx), f"cache_k_l{il}"))
            self.v.append(set_name(new_tensor_2d(ctx, kv_type, head_dim_v * n_head_kv, n_ctx), f"cache_v_l{il}"))
        for buft, ctx in ctxs.values():
            buffer = backend_alloc_ctx_tensors_from_buft(ctx, buft)
            # unused cells must hold finite values: masked scores are 0 after softmax, 0 * NaN is not
            backend_buffer_clear(buffer, 0)
            self.buffers.append(buffer)
        self._contexts = [ctx for _, ctx in ctxs.values()]

    def nbytes(self) -> int:
        return sum(b.size for b in self.buffers)

    def clear(self) -> None:
        """Forget every cell and zero the ones written since the last clear: masked cells are
        still read (their softmax weight is 0, and 0 * NaN is NaN), so no old value may stay."""
        self.zero_cells(0, self.n_written)
        self.n_past = self.n_written = 0

    def zero_cells(self, start: int, end: int) -> None:
        """Zero cells [start, end) of every layer's K and V."""
        if end > start:
            for t in (*self.k, *self.v):
                backend_tensor_memset(t, 0, start * t.nb[1], (end - start) * t.nb[1])

    def n_kv_for(self, n_tokens: int) -> int:
        """Cells a batch of n_tokens after n_past attends to, padded to KV_PAD (<= n_ctx)."""
        need = self.n_past + n_tokens
        if need > self.n_ctx:
            raise ValueError(f"the KV cache is full: {self.n_past} tokens cached + {n_tokens} new > "
                             f"n_ctx={self.n_ctx} (call reset() or load the model with a larger n_ctx)")
        return min(self.n_ctx, round_up(need, KV_PAD))

    def store(self, ctx, il: int, k_cur: Tensor, v_cur: Tensor, kv_idx: Tensor, n_kv: int):
        """Write this batch's K and V rows into cells kv_idx and return views of the first n_kv
        cells, K [head_dim_k, n_kv, n_head_kv] and V [head_dim_v, n_kv, n_head_kv]. The views
        are built on the set_rows results, so attention depends on the writes."""
        n_tokens = k_cur.ne[2]
        k_rows = reshape_2d(ctx, k_cur, self.head_dim_k * self.n_head_kv, n_tokens)
        v_rows = reshape_2d(ctx, v_cur, self.head_dim_v * self.n_head_kv, n_tokens)
        k_set = set_rows(ctx, self.k[il], k_rows, kv_idx)
        v_set = set_rows(ctx, self.v[il], v_rows, kv_idx)
        return self._cells(ctx, k_set, self.head_dim_k, n_kv), self._cells(ctx, v_set, self.head_dim_v, n_kv)

    def _cells(self, ctx, cache: Tensor, head_dim: int, n_kv: int) -> Tensor:
        return view_3d(ctx, cache, head_dim, n_kv, self.n_head_kv,
                       cache.nb[1], row_size(self.type, head_dim), 0)
