"""Which thread changed which sequence of a Model's KV cache last: a thread that continues a
sequence another thread has changed since gets InterleavedSequenceError, not logits computed
after someone else's tokens.

Every eval and reset of a sequence bumps its version, and the calling thread remembers the
version it left the sequence at. A thread whose remembered version is no longer current, and
which does not hold `model.lock` around its calls, has been interleaved with: it raises before
evaluating. A thread's first use of a sequence (continuing what another thread left there, a
hand-over) and every reset are allowed.
"""
from __future__ import annotations

import numbers
import threading

import numpy as np
import torch


class InterleavedSequenceError(RuntimeError):
    """Two threads interleaved their calls on one sequence of a Model: the cache no longer holds
    what this thread put there."""


class ModelLock:
    """A reentrant lock that counts how deeply its owner holds it: inside a model call, a depth
    above 1 means the caller holds `model.lock` around a sequence of calls on purpose."""

    def __init__(self):
        self._lock = threading.RLock()
        self.depth = 0  # changed only by the owner, while it holds the lock

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not self._lock.acquire(blocking, timeout):
            return False
        self.depth += 1
        return True

    def release(self) -> None:
        self.depth -= 1
        self._lock.release()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class SequenceGuard:
    """Versions of the sequences and the version each thread last left them at (see the module
    doc). Called with the model's lock held."""

    MAX_RECORDS = 4096  # beyond this, the records of threads that ended are dropped

    def __init__(self, path: str):
        self.path = path
        self.version: dict[int, int] = {}
        self.seen: dict[tuple[int, int], int] = {}

    def check(self, seq_ids, held: bool) -> None:
        """InterleavedSequenceError when another thread changed one of `seq_ids` since this
        thread last did (held: the caller holds model.lock around its calls, no check)."""
        if held:
            return
        me = threading.get_ident()
        for s in seq_ids:
            mine = self.seen.get((me, s))
            if mine is not None and mine != self.version.get(s, 0):
                raise InterleavedSequenceError(
                    f"{self.path}: sequence {s} was changed by another thread since this thread last used it "
                    f"(two threads interleave one sequence): give each thread its own seq_id, or hold "
                    f"model.lock around each thread's reset and evals")

    def changed(self, seq_ids) -> None:
        """This thread changed `seq_ids` (None: every sequence, a reset of the whole cache)."""
        me = threading.get_ident()
        for s in (list(self.version) if seq_ids is None else set(seq_ids)):
            self.version[s] = self.version.get(s, 0) + 1
            self.seen[(me, s)] = self.version[s]
        if len(self.seen) > self.MAX_RECORDS:
            alive = {t.ident for t in threading.enumerate()}
            self.seen = {k: v for k, v in self.seen.items() if k[0] in alive}


def token_id_array(tokens, where: str) -> np.ndarray:
    """The token ids of one sequence as numpy int64 [n]: a 1-D integer tensor or array, or a
    sequence of integers. Float ids (which would be truncated) and 2-D batches (which would be
    flattened into one sequence; eval_batch takes several) raise naming `where`."""
    if isinstance(tokens, np.ndarray):
        tokens = torch.from_numpy(tokens)
    if isinstance(tokens, torch.Tensor):
        if tokens.dim() > 1:
            raise ValueError(f"{where}: token ids must be 1-D, got a tensor of shape {tuple(tokens.shape)} "
                             f"(use eval_batch for several sequences)")
        if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
            raise TypeError(f"{where}: token ids must be integers, got a {tokens.dtype} tensor")
        return tokens.detach().cpu().reshape(-1).to(torch.int64).numpy()
    tokens = list(tokens)
    for t in tokens:
        if type(t) is not int and (isinstance(t, bool) or not isinstance(t, numbers.Integral)):
            kind = "a list" if isinstance(t, (list, tuple)) else repr(t)
            raise TypeError(f"{where}: token ids must be integers, got {kind} (use eval_batch for several "
                            f"sequences)")
    return np.array(tokens, dtype=np.int64).reshape(-1)
