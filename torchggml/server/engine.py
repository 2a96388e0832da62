"""Continuous batching: one thread decodes every active sequence together on the model's unified KV
cache, as llama-server's slots do.

Each step builds one `Model.eval_batch` call (logits="last"): the next token of every decoding
sequence, then prompt chunks of newly admitted sequences in the room left in the micro-batch
(n_batch tokens in all), so a long prompt is processed in pieces beside running decodes instead
of stalling them. Requests join between steps when a slot is free; a finished, failed or cancelled
sequence leaves and `Model.reset(seq_id)` frees its cells. The KV cache is shared as llama.cpp
shares it: each of the `parallel` slots may use n_ctx // parallel cells, so the cache never
overflows; a sequence that reaches its slot's size ends with finish_reason "length".

Waiting requests sit in a bounded queue; past `max_queue` a submit raises QueueFull (the server
answers 503). Events go back to the submitter through its `emit` callback, called on the engine
thread: ("token", job, text, choices), ("done", job, text, None), ("error", job, message, status)
(status 400 when the client's grammar failed, 500 otherwise). A job with a `deadline`
(time.monotonic()) that passes ends with finish_reason "length".

With one slot every step is what Model.generate evaluates (the prompt in n_batch micro-batches,
then one token a step, on cells from 0), so temperature 0 gives generate's tokens exactly.
"""
from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..models.generation import Generation
from ..models.sampling import TokenChoice
from .grammar import GrammarError


class QueueFull(RuntimeError):
    """The waiting queue is full (the server answers 503)."""


@dataclass(eq=False)
class Job:
    """One sequence: a generation (gen set) or an embedding (gen None: pooled hidden states)."""
    prompt: list[int]
    emit: Callable
    gen: Generation | None = None
    pooling: str = "mean"
    index: int = 0                 # the choice (or input) index within its request
    cancelled: bool = False
    seq_id: int = -1
    n_prompt_done: int = 0
    submitted: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    deadline: float | None = None  # time.monotonic() past which the sequence ends ("length")

    def cancel(self) -> None:
        """Stop this sequence at the next step (a client that hung up); no more events."""
        self.cancelled = True

    @property
    def prefilling(self) -> bool:
        return self.n_prompt_done < len(self.prompt)


class Stats:
    """Counters for /metrics (written by the engine thread, read by the server)."""

    def __init__(self):
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.steps = 0
        self.batch_tokens = 0
        self.mixed_steps = 0        # steps that held prompt chunks beside running decodes
        self.sequences_finished = collections.Counter()   # by finish reason / outcome
        self.recent = collections.deque(maxlen=256)       # (time, generated tokens) per step

    def tokens_per_second(self, window: float = 10.0) -> float:
        now = time.perf_counter()
        recent = [(t, n) for t, n in list(self.recent) if now - t <= window]
        if len(recent) < 2:
            return 0.0
        span = recent[-1][0] - recent[0][0]
        return sum(n for _, n in recent[1:]) / span if span > 0 else 0.0


class Engine:
    def __init__(self, model, parallel: int = 1, max_queue: int = 64):
        if parallel < 1:
            raise ValueError(f"parallel={parallel} must be at least 1")
        if max_queue < 0:
            raise ValueError(f"max_queue={max_queue} must not be negative")
        self.model = model
        self.parallel = int(parallel)
        self.max_queue = int(max_queue)
        self.slot_ctx = model.n_ctx // self.parallel
        if self.slot_ctx < 2:
            raise ValueError(f"n_ctx={model.n_ctx} is too small for {parallel} parallel sequences")
        self.stats = Stats()
        self.waiting: collections.deque[Job] = collections.deque()
        self.active: list[Job] = []
        self.free_slots = list(range(self.parallel))
        self._cond = threading.Condition()
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="torchggml-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the submitter's side

    def submit(self, jobs: list[Job]) -> None:
        """Queue the jobs of one request (all or none); QueueFull past the bound."""
        with self._cond:
            if not self._running:
                raise RuntimeError("the engine was stopped")
            if len(self.waiting) + len(jobs) > self.max_queue + len(self.free_slots):
                raise QueueFull(f"the server is busy: {len(self.active)} sequences running and "
                                f"{len(self.waiting)} waiting (queue size {self.max_queue}); retry later")
            self.waiting.extend(jobs)
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._running = False
            self._cond.notify()
        self._thread.join(timeout=30)

    @property
    def n_waiting(self) -> int:
        return len(self.waiting)

    # ------------------------------------------------------------ the engine thread

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._running and not self.waiting and not self.active:
                    self._cond.wait()
                if not self._running:
                    break
                self._admit()
            try:
                self._step()
            except Exception as e:  # a failed step fails its sequences, never the engine
                for job in list(self.active):
                    self._release(job, "error")
                    job.emit(("error", job, f"{type(e).__name__}: {e}", 500))

    def _admit(self) -> None:
        while self.free_slots and self.waiting:
            job = self.waiting.popleft()
            if job.cancelled:  # its client left while it waited
                self.stats.sequences_finished["cancelled"] += 1
                continue
            job.seq_id = self.free_slots.pop(0)
            self.active.append(job)

    def _release(self, job: Job, outcome: str) -> None:
        if job in self.active:
            self.model.reset(job.seq_id)
            with self._cond:
                self.active.remove(job)
                self.free_slots.append(job.seq_id)
                self.free_slots.sort()
            self.stats.sequences_finished[outcome] += 1

    def _step(self) -> None:
        for job in [j for j in self.active if j.cancelled]:
            self._release(job, "cancelled")
        for job in [j for j in self.active if j.gen is None]:
            self._embed(job)
        batch: list[tuple[Job, list[int]]] = []
        budget = self.model.n_batch
        for job in self.active:  # every decoding sequence's next token first
            if not job.prefilling:
                batch.append((job, [job.gen.last_token]))
                budget -= 1
        for job in self.active:  # then prompt chunks in the room left
            if job.prefilling and budget > 0:
                chunk = job.prompt[job.n_prompt_done: job.n_prompt_done + budget]
                batch.append((job, chunk))
                budget -= len(chunk)
        if not batch:
            return
        rows = self.model.eval_batch([tokens for _, tokens in batch], [j.seq_id for j, _ in batch], logits="last")
        self.stats.steps += 1
        self.stats.batch_tokens += sum(len(t) for _, t in batch)
        n_decodes = sum(1 for j, _ in batch if not j.prefilling)
        self.stats.mixed_steps += 0 < n_decodes < len(batch)
        generated = 0
        for (job, tokens), row in zip(batch, rows):
            if job.prefilling:
                job.n_prompt_done += len(tokens)
                self.stats.prompt_tokens += len(tokens)
                if job.prefilling:
                    continue
            if job.cancelled:
                self._release(job, "cancelled")
                continue
            try:
                generated += self._sample(job, row[0])
            except Exception as e:  # this sequence's own failure (its grammar, its sampler): it alone ends
                self._release(job, "error")
                job.emit(("error", job, f"{type(e).__name__}: {e}", 400 if isinstance(e, GrammarError) else 500))
        self.stats.generated_tokens += generated
        self.stats.recent.append((time.perf_counter(), generated))

    def _sample(self, job: Job, logits: torch.Tensor) -> int:
        """One token for `job`; its events; its release when it ends. Returns the tokens kept."""
        gen = job.gen
        before = gen.n_generated
        text = gen.step(logits) if gen.finish_reason is None else ""  # max_tokens 0: done at once
        if gen.finish_reason is None and len(job.prompt) + gen.n_generated >= self.slot_ctx:
            gen.finish("length")  # the slot's cells are used up
        if gen.finish_reason is None and job.deadline is not None and time.monotonic() >= job.deadline:
            gen.finish("length")  # --request-timeout
        if job.first_token is None:
            job.first_token = time.perf_counter()
        new: list[TokenChoice] = gen.choices[before:]
        if text or new:
            job.emit(("token", job, text, new))
        if gen.finish_reason is not None:
            self._release(job, gen.finish_reason)
            job.emit(("done", job, gen.flush(), None))
        return len(new)

    def _embed(self, job: Job) -> None:
        try:
            vector = self.model.embed(job.prompt, pooling=job.pooling, seq_id=job.seq_id)
        except Exception as e:
            self._release(job, "error")
            job.emit(("error", job, f"{type(e).__name__}: {e}", 500))
            return
        self.stats.prompt_tokens += len(job.prompt)
        self._release(job, "embedding")
        job.emit(("done", job, vector, None))
