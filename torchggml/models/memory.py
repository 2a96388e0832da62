"""The model's memory, stated once (llama.cpp's llama_memory_i): what a KV cache, the recurrent
states and the hybrid of both offer to `Model` and to the graph builder.

Members are marked as in backend/impl.py:
- REQUIRED: abstract; every kind defines it.
- OPTIONAL, None: the attribute is None where the kind has no such part (`attention` on a
  recurrent memory, `recurrent` on a KV cache); the builder asks before it uses one.

A batch goes through the memory in four steps, so that a failed evaluation leaves it as it was:
`plan(seq_ids)` (cells, positions, slots; nothing changes), `mark_written(batch)` before the graph
runs, the graph, then `commit(batch)`; on failure `restore(snapshot())` taken before the first.
Sequences are ids (llama.cpp's seq_id): `clear(seq_id)`, `copy(src, dst)` and `seq_len(seq_id)`
act on one.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


class Memory(ABC):
    #: OPTIONAL, None: the attention part (a KVCache), where the kind has one
    attention = None
    #: OPTIONAL, None: the recurrent part (a RecurrentState), where the kind has one
    recurrent = None
    #: OPTIONAL, None: keep_prefix(seq_id, n), sequence seq_id keeps its first n positions and
    #: forgets the rest (llama.cpp's seq_rm from n); None where a state cannot go back (recurrent)
    keep_prefix = None
    #: OPTIONAL, None: rope_positions(seq_ids, positions), the rotary positions of tokens at these
    #: positions: theirs plus the jumps add_rope_jump(seq_id, at, delta) recorded (an M-RoPE image
    #: takes max(width, height) rotary positions for its width x height tokens); None: the same
    rope_positions = None
    #: OPTIONAL, None: save_seq(seq_id) -> SeqCells, a copy of sequence seq_id's cells (and
    #: recurrent states) in host memory, and load_seq(seq_id, cells, n) putting the first n
    #: positions back (llama.cpp's state_seq_get/set_data); a recurrent state is the one after
    #: all its positions, so it loads only whole (n = cells.n)
    save_seq = None
    load_seq = None
    #: the backend buffers that hold the memory's tensors
    buffers: list

    # ------------------------------------------------------------ what it holds

    @abstractmethod
    def tensors(self) -> list:
        """REQUIRED: the memory's tensors (K and V, r and s), for placement and inspection."""

    @abstractmethod
    def nbytes(self) -> int:
        """REQUIRED: bytes of its buffers."""

    # ------------------------------------------------------------ sequences

    @property
    @abstractmethod
    def n_past(self) -> int:
        """REQUIRED: tokens held, of every sequence."""

    @abstractmethod
    def seq_len(self, seq_id: int = 0) -> int:
        """REQUIRED: the next position of sequence seq_id (its tokens so far)."""

    @abstractmethod
    def clear(self, seq_id: int | None = None) -> None:
        """REQUIRED: forget every sequence, or one (llama.cpp's seq_rm of all its positions)."""

    @abstractmethod
    def copy(self, src: int, dst: int) -> None:
        """REQUIRED: sequence dst continues from src's state (llama.cpp's seq_cp)."""

    @abstractmethod
    def snapshot(self):
        """REQUIRED: the bookkeeping's state, for restore() after a failed evaluation."""

    @abstractmethod
    def restore(self, snapshot) -> None:
        """REQUIRED: back to `snapshot`, leaving nothing a failed evaluation wrote readable."""

    # ------------------------------------------------------------ one batch

    @abstractmethod
    def ubatches(self, seq_ids: np.ndarray, n_batch: int) -> list:
        """REQUIRED: the batch's micro-batches (index sets into seq_ids) of at most n_batch tokens."""

    @abstractmethod
    def plan(self, seq_ids):
        """REQUIRED: where a micro-batch's tokens go (seq_ids[i]: token i's sequence), without
        changing the memory; ValueError when it cannot hold them."""

    @abstractmethod
    def mark_written(self, batch) -> None:
        """REQUIRED: the planned batch is about to be written."""

    @abstractmethod
    def commit(self, batch) -> None:
        """REQUIRED: record the batch's tokens after its graph ran."""

    @abstractmethod
    def set_inputs(self, g, batch) -> None:
        """REQUIRED: the graph's memory inputs for the batch (cells, masks, state slots)."""
