"""Continuous batching: one thread decodes every active sequence together on the model's unified KV
cache, as llama-server's slots do.

Each step is one step of the decode loop Model.generate runs (models/batch_generator.py): one
`Model.eval_batch` call with the next token of every decoding sequence, then prompt chunks of
newly admitted sequences in the room left (n_batch tokens in all), then each sequence's sampling.
Requests join between steps when a slot is free; a failed or cancelled sequence leaves and its
cells are freed.

Prompt cache (llama-server's cache_prompt, on by default): a slot keeps its prompt's cells after its
request ends, and a new request goes to the free slot whose cells share the longest prefix with its
prompt; only the rest of the prompt is evaluated (at least its last token, for the logits). The
generated tokens' cells are not kept: a decode step's products round differently from a prompt
batch's, so they are evaluated again with the next prompt, and the cache changes no token. A request with
cache_prompt false, an embedding, and every request on a memory that cannot drop a sequence's tail
(recurrent and hybrid models: their states hold no positions to go back to) start from cleared
cells. The KV cache is shared as llama.cpp
shares it: each of the `parallel` slots may use n_ctx // parallel cells, so the cache never
overflows; a sequence that reaches its slot's size ends with finish_reason "length".

Waiting requests sit in a bounded queue; past `max_queue` a submit raises QueueFull (the server
answers 503). Events go back to the submitter through its `emit` callback, called on the engine
thread: ("token", job, text, choices), ("done", job, text, None), ("error", job, message, status)
(status 400 when the client's grammar failed, 500 otherwise). A job with a `deadline`
(time.monotonic()) that passes ends with finish_reason "length".

A job may name its slot (id_slot: it waits while that slot is busy) and its LoRA scales: sequences
with other scales than the running ones wait until those end (they are not batched together, as
in llama-server); then the scales change (the server's set_lora) and the slots' cells are cleared.

With one slot every step is what Model.generate evaluates, so temperature 0 gives generate's
tokens exactly.
"""
from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from ..models.batch_generator import BatchGenerator, BatchSequence
from ..models.generation import Generation
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
    cache_prompt: bool = True      # reuse a slot's cells that hold a prefix of the prompt
    n_cached: int = 0              # prompt tokens found in the slot's cells
    cancelled: bool = False
    seq_id: int = -1
    seq: BatchSequence | None = None  # its place in the decode loop, once admitted
    submitted: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    deadline: float | None = None  # time.monotonic() past which the sequence ends ("length")
    id_slot: int = -1              # the slot it must run in (-1: any), llama-server's id_slot
    lora: tuple | None = None      # the LoRA scales it runs with (None: whatever the model has)

    def cancel(self) -> None:
        """Stop this sequence at the next step (a client that hung up); no more events."""
        self.cancelled = True


class Stats:
    """Counters for /metrics (written by the engine thread, read by the server)."""

    def __init__(self):
        self.prompt_tokens = 0         # evaluated (prompt cache hits excluded)
        self.cached_prompt_tokens = 0  # found in a slot's cells, not evaluated again
        self.generated_tokens = 0
        self.drafted_tokens = 0        # speculative decoding: draft tokens evaluated
        self.accepted_tokens = 0       # and taken
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
    def __init__(self, model, parallel: int = 1, max_queue: int = 64, draft=None, n_draft: int = 16):
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
        self.batch = BatchGenerator(model, keep_finished=True, draft=draft, n_draft=n_draft)
        self.slot_tokens: dict[int, list[int]] = {}  # an idle slot -> the tokens its cells hold
        self.waiting: collections.deque[Job] = collections.deque()
        self.active: list[Job] = []
        self.free_slots = list(range(self.parallel))
        self.lora: tuple | None = None   # the model's LoRA scales now, and how to change them (the server's)
        self.set_lora: Callable[[tuple], None] | None = None
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
        self.model.reset()  # the engine (its thread) owns the memory: no cells of earlier work
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
        held = []  # jobs left waiting, in their order
        while self.free_slots and self.waiting:
            job = self.waiting.popleft()
            if job.cancelled:  # its client left while it waited
                self.stats.sequences_finished["cancelled"] += 1
                continue
            if job.id_slot >= 0 and job.id_slot not in self.free_slots:
                held.append(job)  # its slot is busy
                continue
            if job.lora is not None and job.lora != self.lora:
                if self.active:  # other LoRA scales: not batched with the running sequences (as llama-server)
                    held.append(job)
                    break
                try:
                    self._use_lora(job.lora)
                except Exception as e:  # the adapters could not be set: this request fails, not the engine
                    job.emit(("error", job, f"{type(e).__name__}: {e}", 500))
                    continue
            job.seq_id = self._take_slot(job)
            if job.gen is not None:
                job.seq = self.batch.add(job.gen, job.seq_id, self.slot_ctx, owner=job, n_cached=job.n_cached)
                self.stats.cached_prompt_tokens += job.n_cached
            self.active.append(job)
        self.waiting.extendleft(reversed(held))

    def _use_lora(self, scales: tuple) -> None:
        """Give the model these LoRA scales (set_lora, the server's); the slots' cells, computed with
        the others, are cleared."""
        self.set_lora(scales)
        for slot in list(self.slot_tokens):
            self.model.reset(slot)
        self.slot_tokens.clear()
        self.lora = scales

    def _take_slot(self, job: Job) -> int:
        """The free slot whose cells share the longest prefix with the job's prompt (the lowest
        such slot); its cells keep that prefix, the rest is cleared."""
        def common(slot: int) -> int:  # tokens of the slot's cells that begin the prompt
            held, n = self.slot_tokens.get(slot, ()), 0
            for a, b in zip(held, job.prompt):
                if a != b:
                    break
                n += 1
            return n
        reuse = job.cache_prompt and job.gen is not None
        slot = job.id_slot if job.id_slot >= 0 else max(self.free_slots, key=lambda s: (common(s) if reuse else 0, -s))
        self.free_slots.remove(slot)
        n = min(common(slot), len(job.prompt) - 1) if reuse else 0
        held = self.slot_tokens.pop(slot, None)
        if held is not None and not (n > 0 and self.model.keep_prefix(slot, n)):
            n = 0
            self.model.reset(slot)
        job.n_cached = n
        return slot

    def _release(self, job: Job, outcome: str) -> None:
        if job in self.active:
            # a finished request's slot keeps its prompt's cells, where the memory can drop the rest
            keep = (job.seq is not None and job.cache_prompt and outcome in ("stop", "length")
                    and self.model.keep_prefix(job.seq_id, len(job.prompt)))
            if job.seq is not None:
                self.batch.remove(job.seq, free=not keep)  # (nothing to do when the loop let it go)
            if keep:
                self.slot_tokens[job.seq_id] = job.prompt
            else:
                self.model.reset(job.seq_id)
            with self._cond:
                self.active.remove(job)
                self.free_slots.append(job.seq_id)
                self.free_slots.sort()
            self.stats.sequences_finished[outcome] += 1

    def _step(self) -> None:
        for job in [j for j in self.active if j.cancelled]:
            self._release(job, "cancelled")
        now = time.monotonic()
        for job in [j for j in self.active if j.gen is not None and j.deadline is not None and now >= j.deadline]:
            job.gen.finish("length")  # --request-timeout: it ends as a sequence out of room does
            rest = job.gen.flush()
            self._release(job, "length")
            job.emit(("done", job, rest, None))
        for job in [j for j in self.active if j.gen is None]:
            self._embed(job)
        if not self.batch.active:
            return
        n_decoding = sum(1 for s in self.batch.active if not s.prefilling)
        updates = self.batch.step()
        counts = self.batch.last
        if counts.prompt_tokens or counts.decode_tokens:
            self.stats.steps += 1
            self.stats.batch_tokens += counts.prompt_tokens + counts.decode_tokens
            self.stats.mixed_steps += n_decoding > 0 and counts.prompt_tokens > 0
        self.stats.prompt_tokens += counts.prompt_tokens
        self.stats.drafted_tokens += counts.drafted
        self.stats.accepted_tokens += counts.accepted
        for update in updates:
            job = update.seq.owner
            if job.cancelled:
                self._release(job, "cancelled")
                continue
            if update.error is not None:  # this sequence's own failure (its grammar, its sampler): it alone ends
                self._release(job, "error")
                status = 400 if isinstance(update.error, GrammarError) else 500  # the client's grammar: 400
                job.emit(("error", job, f"{type(update.error).__name__}: {update.error}", status))
                continue
            if job.first_token is None:
                job.first_token = time.perf_counter()
            if update.text or update.choices:
                job.emit(("token", job, update.text, update.choices))
            if update.finished:
                self._release(job, job.gen.finish_reason)
                job.emit(("done", job, update.rest, None))
        self.stats.generated_tokens += counts.generated
        self.stats.recent.append((time.perf_counter(), counts.generated))

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
