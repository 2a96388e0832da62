"""The memory of recurrent layers (llama.cpp's llama-memory-recurrent) and of hybrid models
(llama-memory-hybrid: a KV cache for the attention layers beside it). `memory_for` picks the
kind the architecture asks for (Arch.memory: "kv", "recurrent" or "hybrid").

A recurrent layer keeps, per sequence, two F32 state rows: r [n_embd_r] (the last inputs of its
short convolution, or RWKV's token shift) and s [n_embd_s] (the SSM / WKV / delta-rule state).
Layer il's states are two tensors r_l [n_embd_r, n_seq_max] and s_l [n_embd_s, n_seq_max]; each
sequence owns one slot (column) of them while it lives. A graph reads the slots of its
micro-batch's sequences through the I32 input `inp_s_ids` (get_rows, or ssm_scan's ids) and
writes the new states back into the same slots with set_rows. A slot is zeroed when its sequence
is cleared, so a new sequence starts from zero states.

The states fold a whole sequence into one row, so a micro-batch must hold the same number of
tokens of each of its sequences, grouped by sequence ([n_seq_tokens, n_seqs]): `ubatches` splits
a batch that way (llama.cpp's split_equal). Any split gives the same states as one batch, since
each micro-batch continues from the states the previous one left.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..alloc import backend_alloc_ctx_tensors_from_buft
from ..backend.buffer import backend_buffer_clear
from ..backend.tensor_io import backend_tensor_get, backend_tensor_memset, backend_tensor_set
from ..context import Context, new_tensor_2d
from ..tensor import Tensor, set_name
from ..types import Type
from .kv_cache import KVCache, KVBatch, SeqCells, kv_type_from_name
from .memory import Memory

MEMORY_KINDS = ("kv", "recurrent", "hybrid")


@dataclass
class RSBatch:
    """Where a micro-batch's tokens go in the recurrent state: the sequences in the order their
    tokens appear (n_seq_tokens each, grouped), their slots, the tokens' positions and each
    sequence's next position afterwards. n_kv is 0: no attention cells."""
    seq_ids: np.ndarray          # int64
    positions: np.ndarray
    seqs: list
    slots: torch.Tensor          # I32 [n_seqs]
    n_seq_tokens: int
    seq_next: dict
    new_slots: dict = field(default_factory=dict)
    n_kv: int = 0

    @property
    def n_seqs(self) -> int:
        return len(self.seqs)


class RecurrentState(Memory):
    """r and s state tensors of the recurrent layers (`layers`: the layer ids), n_seq_max slots
    each; `bufts[il]` is layer il's buffer type."""

    def __init__(self, layers, n_embd_r: int, n_embd_s: int, n_seq_max: int, bufts):
        if n_seq_max < 1:
            raise ValueError(f"RecurrentState: n_seq_max={n_seq_max} must be at least 1")
        self.layers = sorted(int(il) for il in layers)
        self.n_embd_r, self.n_embd_s, self.n_seq_max = n_embd_r, n_embd_s, n_seq_max
        self.slot_of: dict[int, int] = {}    # sequence -> slot
        self.seq_next: dict[int, int] = {}   # sequence -> its next position
        self.touched: dict[int, int] = {}    # sequence -> slot, written since the last snapshot
        self.r: dict[int, Tensor] = {}
        self.s: dict[int, Tensor] = {}
        self.buffers = []
        ctxs: dict[int, tuple[object, Context]] = {}
        for il in self.layers:
            buft = bufts[il]
            _, ctx = ctxs.setdefault(id(buft), (buft, Context(no_alloc=True)))
            if n_embd_r:  # (a layer may keep only one of the two: LFM2's short convolution has no s)
                self.r[il] = set_name(new_tensor_2d(ctx, Type.F32, n_embd_r, n_seq_max), f"cache_r_l{il}")
            if n_embd_s:
                self.s[il] = set_name(new_tensor_2d(ctx, Type.F32, n_embd_s, n_seq_max), f"cache_s_l{il}")
        for buft, ctx in ctxs.values():
            buffer = backend_alloc_ctx_tensors_from_buft(ctx, buft)
            backend_buffer_clear(buffer, 0)
            self.buffers.append(buffer)
        self._contexts = [ctx for _, ctx in ctxs.values()]

    @property
    def recurrent(self) -> "RecurrentState":
        return self

    def tensors(self) -> list[Tensor]:
        """The memory's tensors: every recurrent layer's r and s."""
        return [*self.r.values(), *self.s.values()]

    def nbytes(self) -> int:
        return sum(b.size for b in self.buffers)

    @property
    def n_past(self) -> int:
        """Tokens seen (of every sequence)."""
        return sum(self.seq_next.values())

    def seq_len(self, seq_id: int = 0) -> int:
        return self.seq_next.get(int(seq_id), 0)

    def clear(self, seq_id: int | None = None) -> None:
        """Forget every sequence, or one, zeroing its slot so that it starts again from zeros."""
        seqs = list(self.slot_of) if seq_id is None else [int(seq_id)] if int(seq_id) in self.slot_of else []
        for s in seqs:
            self.zero_slot(self.slot_of.pop(s))
            self.seq_next.pop(s, None)
        if seq_id is None:
            self.seq_next.clear()

    def copy(self, src: int, dst: int) -> None:
        """Sequence dst continues from sequence src's states (llama.cpp's seq_cp): dst gets a
        slot (its old states are dropped) holding a copy of src's."""
        src, dst = int(src), int(dst)
        if src not in self.slot_of:
            raise ValueError(f"recurrent state: sequence {src} has no state to copy")
        self.clear(dst)
        slot = self._free_slots(1)[0]
        self.slot_of[dst], self.seq_next[dst] = slot, self.seq_next[src]
        for tensors in (self.r, self.s):
            for t in tensors.values():
                row = t.nb[1]
                data = torch.empty(row, dtype=torch.uint8)
                backend_tensor_get(t, data, self.slot_of[src] * row, row)
                backend_tensor_set(t, data, slot * row, row)

    def save_seq(self, seq_id: int) -> SeqCells:
        """A host copy of sequence seq_id's states: after its seq_len positions, one row of each
        state tensor (none for a sequence without a state)."""
        seq_id = int(seq_id)
        if seq_id not in self.slot_of:
            return SeqCells(0, [])
        slot, state = self.slot_of[seq_id], []
        for t in self.tensors():
            row = torch.empty((1, t.nb[1]), dtype=torch.uint8)
            backend_tensor_get(t, row[0], slot * t.nb[1], t.nb[1])
            state.append(row)
        return SeqCells(self.seq_next.get(seq_id, 0), [], state)

    def load_seq(self, seq_id: int, saved: SeqCells, n: int | None = None) -> None:
        """Sequence seq_id continues from a save_seq copy (its own state dropped); a state holds
        all its positions: n must be saved.n (0 or a copy without a state: a cleared sequence)."""
        n = saved.n if n is None else int(n)
        if n != saved.n:
            raise ValueError(f"load_seq: a recurrent state is the one after all its {saved.n} positions; "
                             f"{n} cannot be loaded")
        widths = [t.nb[1] for t in self.tensors()]
        if saved.state and [r.shape[1] for r in saved.state] != widths:
            raise ValueError(f"load_seq: the saved states are {[r.shape[1] for r in saved.state]} bytes wide, "
                             f"this memory's are {widths}")
        self.clear(seq_id)
        if n == 0 or not saved.state:
            return
        slot = self._free_slots(1)[0]
        for t, row in zip(self.tensors(), saved.state):
            backend_tensor_set(t, row[0].contiguous(), slot * t.nb[1], t.nb[1])
        self.slot_of[int(seq_id)], self.seq_next[int(seq_id)] = slot, n

    def zero_slot(self, slot: int) -> None:
        for tensors in (self.r, self.s):
            for t in tensors.values():
                backend_tensor_memset(t, 0, slot * t.nb[1], t.nb[1])

    def _free_slots(self, n: int) -> list[int]:
        used = set(self.slot_of.values())
        free = [i for i in range(self.n_seq_max) if i not in used]
        if len(free) < n:
            raise ValueError(f"the recurrent state holds {self.n_seq_max} sequences at once (n_seq_max): "
                             f"{len(self.slot_of)} are live and {n} more were asked for (reset() finished "
                             f"sequences or load the model with a larger n_seq_max)")
        return free[:n]

    def snapshot(self):
        self.touched = {}
        return dict(self.slot_of), dict(self.seq_next)

    def restore(self, snapshot) -> None:
        """After a failed evaluation: the sequences it wrote lose their states (the graph wrote
        them in place, possibly NaN), so they are cleared; the others stay as they were."""
        slot_of, seq_next = snapshot
        for slot in self.touched.values():
            self.zero_slot(slot)
        self.slot_of = {s: i for s, i in slot_of.items() if s not in self.touched}
        self.seq_next = {s: n for s, n in seq_next.items() if s not in self.touched}

    def ubatches(self, seq_ids, n_batch: int) -> list[np.ndarray]:
        """The batch's token indices (int64 arrays) as micro-batches of at most n_batch tokens,
        each holding the same number of consecutive tokens of each of its sequences, grouped by
        sequence."""
        order = {}
        for i, s in enumerate(np.asarray(seq_ids).tolist()):
            order.setdefault(s, []).append(i)
        queues = [np.array(idx, dtype=np.int64) for idx in order.values()]
        taken = [0] * len(queues)
        out = []
        while True:
            live = [q for q, (idx, t) in enumerate(zip(queues, taken)) if t < idx.size][:n_batch]
            if not live:
                return out
            n = min(min(queues[q].size - taken[q] for q in live), max(1, n_batch // len(live)))
            out.append(np.concatenate([queues[q][taken[q]: taken[q] + n] for q in live]))
            for q in live:
                taken[q] += n

    def plan(self, seq_ids) -> RSBatch:
        """Slots and positions for a batch (grouped as ubatches makes them), without changing the
        state; ValueError when there are more sequences than slots."""
        seq_ids = np.asarray(seq_ids, dtype=np.int64)
        seqs = list(dict.fromkeys(seq_ids.tolist()))
        new = [s for s in seqs if s not in self.slot_of]
        new_slots = dict(zip(new, self._free_slots(len(new))))
        slots = torch.tensor([self.slot_of.get(s, new_slots.get(s)) for s in seqs], dtype=torch.int32)
        positions = np.empty(seq_ids.size, dtype=np.int64)
        next_pos = dict(self.seq_next)
        for i, s in enumerate(seq_ids.tolist()):
            positions[i] = next_pos.get(s, 0)
            next_pos[s] = int(positions[i]) + 1
        counts = {s: int(np.count_nonzero(seq_ids == s)) for s in seqs}
        n_seq_tokens = counts[seqs[0]] if seqs else 0
        return RSBatch(seq_ids, positions, seqs, slots, n_seq_tokens, next_pos, new_slots)

    def mark_written(self, batch: RSBatch) -> None:
        self.touched.update(zip(batch.seqs, batch.slots.tolist()))

    def commit(self, batch: RSBatch) -> None:
        self.slot_of.update(batch.new_slots)
        self.seq_next = batch.seq_next

    def set_inputs(self, g, batch: RSBatch) -> None:
        if g.s_ids is not None:
            g.io.set(g.s_ids, batch.slots)


@dataclass
class HybridBatch:
    """A micro-batch's place in both memories of a hybrid model."""
    kv: KVBatch
    rs: RSBatch

    @property
    def positions(self):
        return self.kv.positions

    @property
    def n_kv(self) -> int:
        return self.kv.n_kv

    @property
    def n_seqs(self) -> int:
        return self.rs.n_seqs


class HybridMemory(Memory):
    """A KV cache for the attention layers and recurrent states for the others (llama.cpp's
    llama-memory-hybrid): every sequence operation applies to both; micro-batches are split
    equally, as the recurrent layers need."""

    def __init__(self, kv: KVCache, rs: RecurrentState):
        self.kv, self.rs = kv, rs
        self.buffers = kv.buffers + rs.buffers

    @property
    def attention(self) -> KVCache:
        return self.kv

    def tensors(self) -> list[Tensor]:
        return self.kv.tensors() + self.rs.tensors()

    @property
    def recurrent(self) -> RecurrentState:
        return self.rs

    def nbytes(self) -> int:
        return self.kv.nbytes() + self.rs.nbytes()

    @property
    def n_past(self) -> int:
        return self.kv.n_past

    def seq_len(self, seq_id: int = 0) -> int:
        return self.kv.seq_len(seq_id)

    def clear(self, seq_id: int | None = None) -> None:
        self.kv.clear(seq_id)
        self.rs.clear(seq_id)

    def copy(self, src: int, dst: int) -> None:
        """Sequence dst continues from src: its KV cells and its recurrent states copied."""
        self.kv.copy(src, dst)
        self.rs.copy(src, dst)

    def save_seq(self, seq_id: int) -> SeqCells:
        """Sequence seq_id's KV cells and its recurrent states after them."""
        cells = self.kv.save_seq(seq_id)
        state = self.rs.save_seq(seq_id)
        if state.n != cells.n:
            raise ValueError(f"sequence {seq_id}: its recurrent state holds {state.n} positions, its cells {cells.n}")
        return SeqCells(cells.n, cells.rows, state.state)

    def load_seq(self, seq_id: int, saved: SeqCells, n: int | None = None) -> None:
        """Both parts back (whole: a recurrent state cannot go back); nothing changed on failure."""
        n = saved.n if n is None else int(n)
        if n != saved.n:
            raise ValueError(f"load_seq: a recurrent state is the one after all its {saved.n} positions; "
                             f"{n} cannot be loaded")
        self.rs.load_seq(seq_id, SeqCells(saved.n, [], saved.state), n)
        try:
            self.kv.load_seq(seq_id, saved, n)
        except ValueError:
            self.rs.clear(seq_id)
            raise

    def snapshot(self):
        return self.kv.snapshot(), self.rs.snapshot()

    def restore(self, snapshot) -> None:
        """The KV cache back to the snapshot; the sequences the failed call wrote are cleared in
        both memories (their recurrent states cannot be restored)."""
        kv_snap, rs_snap = snapshot
        self.kv.restore(kv_snap)
        touched = set(self.rs.touched)
        self.rs.restore(rs_snap)
        for s in touched:
            self.kv.clear(s)

    def ubatches(self, seq_ids, n_batch: int):
        return self.rs.ubatches(seq_ids, n_batch)

    def plan(self, seq_ids) -> HybridBatch:
        return HybridBatch(self.kv.plan(seq_ids), self.rs.plan(seq_ids))

    def mark_written(self, batch: HybridBatch) -> None:
        self.kv.mark_written(batch.kv)
        self.rs.mark_written(batch.rs)

    def commit(self, batch: HybridBatch) -> None:
        self.kv.commit(batch.kv)
        self.rs.commit(batch.rs)

    def mask(self, batch: HybridBatch, n_swa: int = 0) -> torch.Tensor:
        return self.kv.mask(batch.kv, n_swa)

    def store(self, *args):
        return self.kv.store(*args)

    def set_inputs(self, g, batch: HybridBatch) -> None:
        self.kv.set_inputs(g, batch.kv)
        self.rs.set_inputs(g, batch.rs)


def memory_for(arch, hp, n_ctx: int, kv_type, bufts, n_seq_max: int):
    """The memory the architecture asks for (arch.memory): a KVCache over every layer ("kv"),
    recurrent states for arch.recurrent_layers ("recurrent"), or both ("hybrid": the KV cache
    only on the layers with attention)."""
    kind = getattr(arch, "memory", "kv")
    if kind not in MEMORY_KINDS:
        raise ValueError(f"{hp.arch}: unknown memory kind {kind!r} (one of {MEMORY_KINDS})")
    kv_type = kv_type_from_name(kv_type) if isinstance(kv_type, str) else kv_type
    if kind == "kv":
        bufts = [buft if hp.has_kv(il) else None for il, buft in enumerate(bufts)]  # shared KV: none
        kv = KVCache(hp.n_layer, n_ctx, hp.head_dim_k, hp.head_dim_v, hp.n_head_kv, kv_type, bufts,
                     v_in_k=getattr(arch, "v_in_k", False), layer_dims=[hp.kv_dims(il) for il in range(hp.n_layer)])
        kv.alibi, kv.chunked, kv.causal = hp.max_alibi_bias > 0, hp.swa_chunked, hp.causal_attn
        kv.symmetric = hp.swa_symmetric
        return kv
    recurrent = [il for il in range(hp.n_layer) if arch.is_recurrent(hp, il)]
    rs = RecurrentState(recurrent, arch.n_embd_r(hp), arch.n_embd_s(hp), n_seq_max, bufts)
    if kind == "recurrent":
        return rs
    attn_bufts = [buft if arch.has_attention(hp, il) else None for il, buft in enumerate(bufts)]
    kv = KVCache(hp.n_layer, n_ctx, hp.head_dim_k, hp.head_dim_v, hp.n_head_kv, kv_type, attn_bufts,
                 v_in_k=getattr(arch, "v_in_k", False))
    return HybridMemory(kv, rs)
