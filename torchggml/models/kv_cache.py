"""The KV cache: per layer, K and V rows [n_embd_k_gqa, n_ctx] on the layer's device.

One cache holds every sequence, as llama.cpp's unified cache does: each cell records the
sequence and the position of the token stored there (-1: free). A batch takes the first free
cells in order, so one sequence of n tokens occupies cells [0, n). A token attends to the cells
of its own sequence at positions up to its own (within the sliding window where the layer has
one): `mask` builds that from the cells. Graph builders write new rows with set_rows
(converting F32 to the cache type: F16 by default, any of KV_TYPES when asked) and read the first
n_kv cells back as [head_dim, n_kv, n_head_kv] views.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from ..alloc import backend_alloc_ctx_tensors_from_buft
from ..backend.buffer import backend_buffer_clear
from ..backend.tensor_io import backend_tensor_get, backend_tensor_memset, backend_tensor_set
from ..context import Context, new_tensor_2d
from ..ops import cont, set_rows, view_3d, reshape_2d
from ..tensor import Tensor, is_contiguous, nbytes, round_up, set_name
from ..types import Type, as_type, row_size, blck_size
from .memory import Memory

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


class KVCache(Memory):
    """K and V tensors per layer. `bufts[il]` is the buffer type of layer il's cache (None: the
    layer has no attention, as a hybrid model's recurrent layers; its K and V are None)."""

    def __init__(self, n_layer: int, n_ctx: int, head_dim_k: int, head_dim_v: int, n_head_kv: int,
                 kv_type: Type, bufts, v_in_k: bool = False, layer_dims: list | None = None):
        """v_in_k: V is the first head_dim_v values of each K row, not stored apart (multi-head
        latent attention: K holds the compressed latent and its rotary part, V the latent).
        layer_dims: (head_dim_k, head_dim_v, n_head_kv) of each layer where they differ between
        layers (gemma4's windowed and dense layers); head_dim_k... otherwise."""
        if len(bufts) != n_layer:
            raise ValueError(f"KVCache: {len(bufts)} buffer types for {n_layer} layers")
        layer_dims = layer_dims or [(head_dim_k, head_dim_v, n_head_kv)] * n_layer
        for head_dim in {d for dims in layer_dims for d in dims[:2]}:
            if head_dim % blck_size(kv_type):
                raise ValueError(f"KVCache: head size {head_dim} is not a multiple of "
                                 f"{kv_type.name}'s block size {blck_size(kv_type)}")
        self.n_ctx = n_ctx
        self.type = kv_type
        # llama_set_causal_attn: False while a chunk whose tokens attend to each other both ways
        # (a Gemma 3 image's embeddings) is evaluated, and always for encoders (attention.causal false)
        self.causal = True
        self.head_dim_k, self.head_dim_v, self.n_head_kv = head_dim_k, head_dim_v, n_head_kv
        if v_in_k and (head_dim_v > head_dim_k or n_head_kv != 1):
            raise ValueError(f"KVCache: V inside K needs one K/V head and head_dim_v {head_dim_v} <= head_dim_k "
                             f"{head_dim_k}")
        self.v_in_k = v_in_k
        self.alibi = False  # masks hold -|p - p0| (set for ALiBi architectures)
        self.chunked = False  # windowed layers attend within chunks of n_swa positions (llama4)
        self.symmetric = False  # windowed layers see |p - p0| <= n_swa // 2 (modern-bert)
        self.k: list[Tensor] = []
        self.v: list[Tensor] = []
        self.buffers = []
        ctxs: dict[int, tuple[object, Context]] = {}
        for il, (buft, (dk, dv, n_kv_heads)) in enumerate(zip(bufts, layer_dims)):
            if buft is None:
                self.k.append(None)
                self.v.append(None)
                continue
            _, ctx = ctxs.setdefault(id(buft), (buft, Context(no_alloc=True)))
            self.k.append(set_name(new_tensor_2d(ctx, kv_type, dk * n_kv_heads, n_ctx), f"cache_k_l{il}"))
            self.v.append(None if v_in_k else
                          set_name(new_tensor_2d(ctx, kv_type, dv * n_kv_heads, n_ctx), f"cache_v_l{il}"))
        for buft, ctx in ctxs.values():
            try:
                buffer = backend_alloc_ctx_tensors_from_buft(ctx, buft)
            except (MemoryError, RuntimeError) as e:
                need = sum(nbytes(t) for t in (*self.k, *self.v))
                raise MemoryError(f"KV cache: n_ctx={n_ctx} needs {need} bytes ({need / 2**30:.2f} GiB) of "
                                  f"{kv_type.name} K and V for {n_layer} layers, and the allocation on "
                                  f"{buft.get_name()} failed: choose a smaller n_ctx ({e})") from None
            # unused cells must hold finite values: masked scores are 0 after softmax, 0 * NaN is not;
            # fresh anonymous pages are zero already (left untouched, they cost no memory until used)
            if not getattr(buffer, "zero_filled", False):
                backend_buffer_clear(buffer, 0)
            self.buffers.append(buffer)
        self._contexts = [ctx for _, ctx in ctxs.values()]
        # the cells' bookkeeping, after the cache itself so that a too large n_ctx fails there first
        # numpy, not torch: a decode step's bookkeeping is a few small operations, each cheaper
        # in numpy than in torch
        self.cell_seq = np.full(n_ctx, -1, dtype=np.int64)  # -1: free
        self.cell_pos = np.zeros(n_ctx, dtype=np.int64)
        self.seq_next: dict[int, int] = {}  # the next position of each sequence
        self.rope_jumps: dict[int, list[tuple[int, int]]] = {}  # sequence -> (from position, rotary shift)
        self.written = np.zeros(n_ctx, dtype=bool)  # cells written since they were last zeroed

    def nbytes(self) -> int:
        return sum(b.size for b in self.buffers)

    def tensors(self) -> list[Tensor]:
        """The memory's tensors: every attention layer's K and V."""
        return [t for t in (*self.k, *self.v) if t is not None]

    @property
    def attention(self) -> "KVCache":
        return self

    @staticmethod
    def ubatches(seq_ids: np.ndarray, n_batch: int) -> list[slice]:
        """The batch's micro-batches: consecutive runs of n_batch tokens."""
        n = len(seq_ids)  # the last slice ends at n: a batch in one piece is slice(0, n)
        return [slice(start, min(start + n_batch, n)) for start in range(0, n, n_batch)]

    def set_inputs(self, g, batch: "KVBatch") -> None:
        """The graph's cache inputs for this batch: the cells its tokens write, the masks."""
        if g.kv_idx is not None:
            g.io.set(g.kv_idx, batch.cells)
        for window, mask in g.masks.items():
            g.io.set(mask, self._mask_values(batch, window))
        if g.buckets is not None:
            tensor, n_buckets, bidirectional = g.buckets
            g.io.set(tensor, self.relative_buckets(batch, n_buckets, bidirectional))

    @property
    def n_past(self) -> int:
        """Cells in use (tokens of every sequence)."""
        return int(np.count_nonzero(self.cell_seq >= 0))

    def seq_len(self, seq_id: int = 0) -> int:
        """The next position of sequence seq_id (its tokens so far)."""
        return self.seq_next.get(int(seq_id), 0)

    def clear(self, seq_id: int | None = None) -> None:
        """Forget every cell, or the cells of one sequence, and zero them: masked cells are still
        read (their softmax weight is 0, and 0 * NaN is NaN), so no old value may stay."""
        if seq_id is None:
            self.zero_cells(np.flatnonzero(self.written))
            self.cell_seq.fill(-1)
            self.seq_next.clear()
            self.rope_jumps.clear()
        else:
            cells = np.flatnonzero(self.cell_seq == int(seq_id))
            self.zero_cells(cells)
            self.cell_seq[cells] = -1
            self.seq_next.pop(int(seq_id), None)
            self.rope_jumps.pop(int(seq_id), None)

    def keep_prefix(self, seq_id: int, n: int) -> None:
        """Sequence seq_id keeps its first n positions and forgets the rest (llama.cpp's seq_rm
        from position n): the next token it evaluates is at position n."""
        seq_id = int(seq_id)
        cells = np.flatnonzero((self.cell_seq == seq_id) & (self.cell_pos >= n))
        self.zero_cells(cells)
        self.cell_seq[cells] = -1
        if seq_id in self.seq_next:
            self.seq_next[seq_id] = min(self.seq_next[seq_id], int(n))
        if seq_id in self.rope_jumps:
            self.rope_jumps[seq_id] = [(at, d) for at, d in self.rope_jumps[seq_id] if at <= n]

    def remove(self, seq_id: int, p0: int, p1: int) -> None:
        """Sequence seq_id forgets its positions [p0, p1) (llama.cpp's seq_rm of a range)."""
        cells = np.flatnonzero((self.cell_seq == int(seq_id)) & (self.cell_pos >= p0) & (self.cell_pos < p1))
        self.zero_cells(cells)
        self.cell_seq[cells] = -1
        mine = self.cell_seq == int(seq_id)
        if int(seq_id) in self.seq_next:
            self.seq_next[int(seq_id)] = int(self.cell_pos[mine].max()) + 1 if mine.any() else 0

    def shift(self, seq_id: int, p0: int, p1: int, delta: int, rotate) -> None:
        """Sequence seq_id's cells at positions [p0, p1) move to p + delta (llama.cpp's seq_add),
        their K rows rotated by delta (rotate(il, f32 rows, delta): kv_shift.k_rotation's);
        the caller keeps positions unique. F16 or F32 K only."""
        cells = np.flatnonzero((self.cell_seq == int(seq_id)) & (self.cell_pos >= p0) & (self.cell_pos < p1))
        if cells.size == 0 or delta == 0:
            return
        if int(seq_id) in self.rope_jumps:
            raise ValueError(f"sequence {seq_id}'s rotary positions jump (an image's): it cannot be shifted")
        dtype = {Type.F16: torch.float16, Type.F32: torch.float32}[self.type]
        for il, t in enumerate(self.k):
            if t is None:
                continue
            row = t.nb[1]
            raw = torch.empty((cells.size, row), dtype=torch.uint8)
            for src, dst in _runs(cells):
                backend_tensor_get(t, raw[dst], src.start * row, (src.stop - src.start) * row)
            rows = rotate(il, raw.view(dtype).float(), int(delta)).to(dtype).view(torch.uint8)
            for dst, src in _runs(cells):
                backend_tensor_set(t, rows[src].contiguous(), dst.start * row, (dst.stop - dst.start) * row)
        self.cell_pos[cells] += int(delta)
        mine = self.cell_seq == int(seq_id)
        self.seq_next[int(seq_id)] = int(self.cell_pos[mine].max()) + 1  # (llama.cpp: the next position follows)

    def copy(self, src: int, dst: int) -> None:
        """Sequence dst continues from sequence src's cells (llama.cpp's seq_cp): dst's own cells
        are cleared and src's K and V rows copied into free cells tagged dst, same positions."""
        src, dst = int(src), int(dst)
        self.clear(dst)
        cells = np.flatnonzero(self.cell_seq == src)
        free = np.flatnonzero(self.cell_seq < 0)
        if free.size < cells.size:
            raise ValueError(f"the KV cache is full: copying sequence {src} needs {cells.size} free cells, "
                             f"{free.size} are left")
        targets = free[:cells.size]
        for t in filter(None, (*self.k, *self.v)):
            row = t.nb[1]
            for a, b in zip(cells.tolist(), targets.tolist()):
                data = torch.empty(row, dtype=torch.uint8)
                backend_tensor_get(t, data, a * row, row)
                backend_tensor_set(t, data, b * row, row)
        self.cell_seq[targets], self.cell_pos[targets] = dst, self.cell_pos[cells]
        self.written[targets] = True
        if src in self.seq_next:
            self.seq_next[dst] = self.seq_next[src]
        if src in self.rope_jumps:
            self.rope_jumps[dst] = list(self.rope_jumps[src])

    def add_rope_jump(self, seq_id: int, at: int, delta: int) -> None:
        """Tokens of seq_id from position `at` on rotate at their position + delta (and earlier jumps)."""
        self.rope_jumps.setdefault(int(seq_id), []).append((int(at), int(delta)))

    def rope_positions(self, seq_ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """The rotary positions (int32) of tokens at `positions` of sequences `seq_ids`."""
        if not self.rope_jumps:
            return positions
        out = positions.astype(np.int64)
        for s, jumps in self.rope_jumps.items():
            mine = seq_ids == s
            for at, delta in jumps:
                out[mine & (positions >= at)] += delta
        return out.astype(np.int32)

    def save_seq(self, seq_id: int) -> "SeqCells":
        """A host copy of sequence seq_id's cells: its K and V rows in position order. Its
        positions must run 0..n-1 (a prompt's cells, as the server's slots hold)."""
        cells = np.flatnonzero(self.cell_seq == int(seq_id))
        cells = cells[np.argsort(self.cell_pos[cells], kind="stable")]
        n = int(cells.size)
        if not np.array_equal(self.cell_pos[cells], np.arange(n)):
            raise ValueError(f"sequence {seq_id}'s cells do not hold positions 0..{n - 1}: they cannot be saved")
        rows = []
        for t in self.tensors():
            out = torch.empty((n, t.nb[1]), dtype=torch.uint8)
            for src, dst in _runs(cells):
                backend_tensor_get(t, out[dst], src.start * t.nb[1], (src.stop - src.start) * t.nb[1])
            rows.append(out)
        return SeqCells(n, rows)

    def load_seq(self, seq_id: int, saved: "SeqCells", n: int | None = None) -> None:
        """Sequence seq_id holds the first n positions of `saved` (all when n is None), in free
        cells: its own cells are cleared first; ValueError when too few cells are free."""
        n = saved.n if n is None else int(n)
        if not 0 <= n <= saved.n:
            raise ValueError(f"load_seq: {n} positions asked of a saved sequence of {saved.n}")
        widths = [t.nb[1] for t in self.tensors()]
        if [r.shape[1] for r in saved.rows] != widths:
            raise ValueError(f"load_seq: the saved rows are {[r.shape[1] for r in saved.rows]} bytes wide, this "
                             f"cache's are {widths}")
        self.clear(seq_id)
        free = np.flatnonzero(self.cell_seq < 0)
        if free.size < n:
            raise ValueError(f"the KV cache is full: {n} cells are needed, {free.size} are free")
        cells = free[:n]
        for t, rows in zip(self.tensors(), saved.rows):
            for dst, src in _runs(cells):
                backend_tensor_set(t, rows[src], dst.start * t.nb[1], (dst.stop - dst.start) * t.nb[1])
        self.cell_seq[cells], self.cell_pos[cells] = int(seq_id), np.arange(n)
        self.written[cells] = True
        if n:
            self.seq_next[int(seq_id)] = n

    def zero_cells(self, cells: np.ndarray) -> None:
        """Zero these cells of every layer's K and V (one memset per run of consecutive cells)."""
        cells = np.unique(np.asarray(cells, dtype=np.int64))
        if cells.size == 0:
            return
        breaks = np.flatnonzero(cells[1:] != cells[:-1] + 1) + 1
        for run in np.split(cells, breaks):
            start, end = int(run[0]), int(run[-1]) + 1
            for t in filter(None, (*self.k, *self.v)):
                backend_tensor_memset(t, 0, start * t.nb[1], (end - start) * t.nb[1])
        self.written[cells] = False

    def snapshot(self):
        """The cells' state, for `restore` after a failed evaluation."""
        return self.cell_seq.copy(), self.cell_pos.copy(), dict(self.seq_next)

    def restore(self, snapshot) -> None:
        """Back to `snapshot`, zeroing the cells written since (they may hold NaN)."""
        seq, pos, seq_next = snapshot
        self.zero_cells(np.flatnonzero(self.written & (seq < 0)))
        self.cell_seq, self.cell_pos, self.seq_next = seq, pos, seq_next

    def plan(self, seq_ids) -> "KVBatch":
        """Cells and positions for a batch of tokens (seq_ids[i]: token i's sequence, tokens of
        a sequence in order; int64 array or tensor), without changing the cache; ValueError when
        it is full."""
        seq_ids = np.asarray(seq_ids, dtype=np.int64)
        n_tokens = seq_ids.size
        free = self.cell_seq < 0
        if n_tokens == 1:  # a decode step: the first free cell, without listing them all
            cells = np.array([free.argmax()], dtype=np.int64)
            full = not free[cells[0]]
        else:
            cells = np.flatnonzero(free)[:n_tokens]
            full = cells.size < n_tokens
        if full:
            raise ValueError(f"the KV cache is full: {self.n_past} tokens cached + {n_tokens} new > "
                             f"n_ctx={self.n_ctx} (call reset() or load the model with a larger n_ctx)")
        positions, next_pos = [], dict(self.seq_next)
        for s in seq_ids.tolist():
            positions.append(next_pos.get(s, 0))
            next_pos[s] = positions[-1] + 1
        free_at_end = int(free[::-1].argmin())  # cells after the last one in use (all: every cell is free)
        used_end = 0 if free[-1 - free_at_end] else self.n_ctx - free_at_end
        n_used = max(int(cells[-1]) + 1 if n_tokens else 0, used_end)
        n_kv = min(self.n_ctx, round_up(n_used, KV_PAD))
        # int32 positions: the graph's input type
        return KVBatch(seq_ids, cells, np.array(positions, dtype=np.int32), n_kv, next_pos)

    def mark_written(self, batch: "KVBatch") -> None:
        """The batch's cells are about to be written (so clear/restore will zero them)."""
        self.written[batch.cells] = True

    def commit(self, batch: "KVBatch") -> None:
        """Record the batch's tokens in their cells (after its graph wrote them)."""
        if batch.cells.size == 1:  # (a decode step: scalars, not index arrays)
            cell = int(batch.cells[0])
            self.cell_seq[cell], self.cell_pos[cell] = batch.seq_ids[0], batch.positions[0]
        else:
            self.cell_seq[batch.cells] = batch.seq_ids
            self.cell_pos[batch.cells] = batch.positions
        self.seq_next = batch.seq_next

    def mask(self, batch: "KVBatch", n_swa: int = 0) -> torch.Tensor:
        """F16 [n_tokens, n_kv] (ggml ne [n_kv, n_tokens]): 0 where token i may attend to a cell
        (its own sequence, a position up to its own; with a sliding window n_swa only positions
        p0 with p - p0 < n_swa, llama.cpp's standard window), -inf elsewhere."""
        return torch.from_numpy(self._mask_values(batch, n_swa))

    def _mask_values(self, batch: "KVBatch", n_swa: int) -> np.ndarray:
        n_kv = batch.n_kv
        if batch.cells.size == 1:  # a decode step: the cells as they are, then its own cell
            cell = int(batch.cells[0])
            values = _mask_array(batch.positions, self.cell_pos[:n_kv], n_swa,
                                 self.cell_seq[None, :n_kv] == batch.seq_ids[0], self.alibi, self.chunked,
                                 self.causal, self.symmetric)
            if cell < n_kv:
                values[0, cell] = _VISIBLE  # a token sees itself under every rule (distance 0)
            return values
        seq, pos = self.cell_seq[:n_kv].copy(), self.cell_pos[:n_kv].copy()
        seq[batch.cells], pos[batch.cells] = batch.seq_ids, batch.positions  # this batch's own cells
        return _mask_array(batch.positions, pos, n_swa, seq[None, :] == batch.seq_ids[:, None], self.alibi,
                           self.chunked, self.causal, self.symmetric)

    def relative_buckets(self, batch: "KVBatch", n_buckets: int, bidirectional: bool) -> np.ndarray:
        """I32 [n_tokens, n_kv]: T5's bucket of each cell's position relative to each token's."""
        pos = self.cell_pos[:batch.n_kv].copy()
        pos[batch.cells] = batch.positions
        return relative_position_buckets(pos, batch.positions, n_buckets, bidirectional)

    def store(self, ctx, il: int, k_cur: Tensor, v_cur: Tensor, kv_idx: Tensor, n_kv: int):
        """Write this batch's K and V rows into cells kv_idx and return views of the first n_kv
        cells, K [head_dim_k, n_kv, n_head_kv] and V [head_dim_v, n_kv, n_head_kv]. The views
        are built on the set_rows results, so attention depends on the writes."""
        n_tokens, n_head_kv = k_cur.ne[2], k_cur.ne[1]
        k_cur, v_cur = (t if is_contiguous(t) else cont(ctx, t) for t in (k_cur, v_cur))  # views of a fused qkv
        k_rows = reshape_2d(ctx, k_cur, k_cur.ne[0] * n_head_kv, n_tokens)
        k_set = set_rows(ctx, self.k[il], k_rows, kv_idx)
        k_cells = self._cells(ctx, k_set, k_cur.ne[0], n_kv, n_head_kv)
        if self.v_in_k:  # V: the start of each K row, written with it (v_cur is that part of k_cur)
            return k_cells, self._cells(ctx, k_set, self.head_dim_v, n_kv, n_head_kv)
        v_rows = reshape_2d(ctx, v_cur, v_cur.ne[0] * n_head_kv, n_tokens)
        v_set = set_rows(ctx, self.v[il], v_rows, kv_idx)
        return k_cells, self._cells(ctx, v_set, v_cur.ne[0], n_kv, n_head_kv)

    def _cells(self, ctx, cache: Tensor, head_dim: int, n_kv: int, n_head_kv: int) -> Tensor:
        """[head_dim, n_kv, n_head_kv] of the cache's rows (head_dim may be shorter than a head:
        the V inside K)."""
        head_size = cache.ne[0] // n_head_kv
        return view_3d(ctx, cache, head_dim, n_kv, n_head_kv,
                       cache.nb[1], row_size(self.type, head_size), 0)


def attention_mask(token_pos: torch.Tensor, cell_pos: torch.Tensor, n_swa: int = 0,
                   same_seq: torch.Tensor | None = None, alibi: bool = False, chunked: bool = False,
                   causal: bool = True, symmetric: bool = False) -> torch.Tensor:
    """F16 [n_tokens, n_cells]: 0 where a token at token_pos[i] may attend to the cell holding
    position cell_pos[j] (a position up to its own, any position when not causal; of its own
    sequence when same_seq is given; with a sliding window n_swa only p - p0 < n_swa, a
    symmetric one |p - p0| <= n_swa // 2, or with chunked windows only the positions of p's own
    chunk of n_swa: p0 >= p - p % n_swa), -inf elsewhere. With alibi the visible cells hold
    -|p - p0| instead of 0: the softmax's max_bias scales it per head (ALiBi)."""
    return torch.from_numpy(_mask_array(token_pos, cell_pos, n_swa, same_seq, alibi, chunked, causal, symmetric))


def _mask_array(token_pos, cell_pos, n_swa: int = 0, same_seq=None, alibi: bool = False, chunked: bool = False,
                causal: bool = True, symmetric: bool = False) -> np.ndarray:
    """attention_mask's values as a numpy array."""
    token_pos, cell_pos = np.asarray(token_pos), np.asarray(cell_pos)  # numpy: µs, not tens of µs
    p = token_pos[:, None]
    visible = cell_pos[None, :] <= p if causal else np.ones((p.size, cell_pos.size), dtype=bool)
    if same_seq is not None:
        visible &= np.asarray(same_seq)
    if n_swa and symmetric:
        visible &= np.abs(p - cell_pos[None, :]) <= n_swa // 2
    elif n_swa and chunked:
        visible &= cell_pos[None, :] >= p - p % n_swa
    elif n_swa:
        visible &= p - cell_pos[None, :] < n_swa
    if alibi:
        return np.where(visible, -np.abs(p - cell_pos[None, :]).astype(np.float16), _HIDDEN)
    return np.where(visible, _VISIBLE, _HIDDEN)


def relative_position_buckets(key_pos, query_pos, n_buckets: int, bidirectional: bool,
                              max_distance: int = 128) -> np.ndarray:
    """I32 [n_queries, n_keys]: T5's relative position bucket of key_pos[j] - query_pos[i], as
    llama.cpp's llama_relative_position_bucket computes it (its float32 log included): exact
    below n_buckets / 2 (half of the buckets per direction when bidirectional), logarithmic up
    to max_distance, the last bucket beyond."""
    rel = np.asarray(key_pos, np.int64)[None, :] - np.asarray(query_pos, np.int64)[:, None]
    bucket = np.zeros(rel.shape, np.int64)
    if bidirectional:
        n_buckets //= 2
        bucket += (rel > 0) * n_buckets
        rel = np.abs(rel)
    else:
        rel = -np.minimum(rel, 0)
    exact = n_buckets // 2
    with np.errstate(divide="ignore"):
        log = np.log((rel / exact).astype(np.float32)) * np.float32(n_buckets - exact)
    large = np.floor((exact + log.astype(np.float64) / np.log(max_distance / exact)).astype(np.float32))
    large = np.minimum(np.where(rel < exact, 0, large), n_buckets - 1).astype(np.int64)
    return (bucket + np.where(rel < exact, rel, large)).astype(np.int32)


# 0-d arrays: np.where with these takes half the time it takes with numpy scalars
_VISIBLE, _HIDDEN = np.zeros((), np.float16), np.full((), -np.inf, np.float16)


def _runs(cells: np.ndarray):
    """(cell slice, index slice) for each run of consecutive cells in `cells`."""
    breaks = np.flatnonzero(np.diff(cells) != 1) + 1
    start = 0
    for end in [*breaks.tolist(), int(cells.size)]:
        if end > start:
            yield slice(int(cells[start]), int(cells[end - 1]) + 1), slice(start, end)
        start = end


@dataclass
class SeqCells:
    """A sequence's memory copied to host memory (Memory.save_seq): n positions, per KV cache
    tensor (KVCache.tensors() order) its rows as uint8 [n, row bytes], and a recurrent memory's
    states after those n positions: per state tensor (RecurrentState.tensors() order) its one
    row, uint8 [1, row bytes] (none for a KV cache alone, or n = 0)."""
    n: int
    rows: list
    state: list = field(default_factory=list)

    def nbytes(self) -> int:
        return sum(r.numel() for r in self.rows) + sum(r.numel() for r in self.state)


@dataclass
class KVBatch:
    """Where a batch's tokens go: their sequences, cells and positions, the cells the graph
    attends to (n_kv, padded to KV_PAD) and each sequence's next position afterwards. Numpy
    arrays: int64 sequences and cells, int32 positions (the graph's input type)."""
    seq_ids: np.ndarray
    cells: np.ndarray
    positions: np.ndarray
    n_kv: int
    seq_next: dict
    n_seqs: int = 1  # graphs over the KV cache only do not group tokens by sequence
