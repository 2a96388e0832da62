"""Continuous batching: one thread decodes every active sequence together on the model's unified KV
cache, as llama-server's slots do.

Each step is one step of the decode loop Model.generate runs (models/batch_generator.py): one
`Model.eval_batch` call with the next token of every decoding sequence, then prompt chunks of
newly admitted sequences in the room left (n_batch tokens in all), then each sequence's sampling.
Requests join between steps when a slot is free; a failed or cancelled sequence leaves and its
cells are freed.

Slots (llama-server's, 4 by default) share ONE KV cache of n_ctx cells, as llama-server's unified
cache: any slot may use the whole context while the others are idle. Each running request reserves
the cells it may ever need, its prompt and max_tokens (a request without max_tokens may fill the
context: it reserves all of it), and is admitted only when the reservations of the running ones
leave room for it; otherwise it waits, first come first served, until cells are freed. So the
cache never overflows and no running request is cut short by another; one that can never fit
(prompt + max_tokens > n_ctx) is refused by the server before it queues.

Prompt cache (llama-server's cache_prompt, on by default): a slot keeps its prompt's cells after its
request ends, and a new request goes to the free slot whose cells share the longest prefix with its
prompt (among equals an empty slot, else the least recently used); only the rest of the prompt is
evaluated (at least its last token, for the logits). The generated tokens' cells are not kept: a decode step's products
round differently from a prompt batch's, so they are evaluated again with the next prompt, and the
cache changes no token. Idle slots' cells are given up when a running request needs the room
(least recently used first) or when the slot is taken for another prompt; with a host-memory
prompt cache (`cache_ram` bytes, llama-server's --cache-ram; prompt_cache.py) the prompt and a copy
of its cells go there first, and a request whose prompt shares a longer prefix with an entry than
with any idle slot gets that prefix copied back. A request with cache_prompt false or an
embedding starts from cleared cells.

Recurrent and hybrid models: their states fold every position and cannot go back, so a slot keeps
a copy of its sequence's memory taken when the prompt was evaluated (Memory.save_seq: the states,
and a hybrid's KV cells), put back when the request ends; a later prompt reuses it only when it
begins with that whole prompt (then only the rest is evaluated). The host-memory cache holds no
such copies (its entries are prefixes).

Slot actions (llama-server's /slots/{id}?action=save|restore|erase; slot_files.py) run on the
engine thread between steps, once their slot is idle.

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
import os
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..models.batch_generator import BatchGenerator, BatchSequence
from ..models.generation import Generation
from . import slot_files
from .grammar import GrammarError
from .prompt_cache import PromptCache, common_prefix


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
    prompt_state: object = None    # a recurrent memory's copy at the prompt's end (SeqCells), to keep

    @property
    def need(self) -> int:
        """The cells it may ever use: its prompt and max_tokens (an embedding: its input)."""
        return len(self.prompt) + (self.gen.max_tokens if self.gen is not None else 0)

    def cancel(self) -> None:
        """Stop this sequence at the next step (a client that hung up); no more events."""
        self.cancelled = True


class Stats:
    """Counters for /metrics (written by the engine thread, read by the server)."""

    def __init__(self):
        self.prompt_tokens = 0         # evaluated (prompt cache hits excluded)
        self.cached_prompt_tokens = 0  # found in a slot's cells, not evaluated again
        self.reused_tokens = 0         # of them, moved to another position (--cache-reuse)
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


class SlotError(RuntimeError):
    """A slot action that failed: the HTTP status and the reason."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Engine:
    def __init__(self, model, parallel: int = 4, max_queue: int = 64, draft=None, n_draft: int = 16,
                 cache_ram: int = 0, cache_reuse: int = 0):
        """parallel: slots; cache_ram: bytes of the host-memory prompt cache (0: none); cache_reuse:
        llama-server's --cache-reuse, the shortest chunk of a slot's cells moved to a new position
        after the prompts diverge (0: off; ignored, as by llama-server, where K cannot be shifted:
        cache_reuse_off says why)."""
        if parallel < 1:
            raise ValueError(f"parallel={parallel} must be at least 1")
        if cache_reuse < 0:
            raise ValueError(f"cache_reuse={cache_reuse} must not be negative")
        self.cache_reuse_off = model.can_shift() if cache_reuse else None
        self.cache_reuse = int(cache_reuse) if self.cache_reuse_off is None else 0
        if max_queue < 0:
            raise ValueError(f"max_queue={max_queue} must not be negative")
        self.model = model
        self.parallel = int(parallel)
        self.max_queue = int(max_queue)
        self.slot_ctx = model.n_ctx  # one unified cache: any slot may use all of it
        if self.slot_ctx < 2:
            raise ValueError(f"n_ctx={model.n_ctx} is too small to serve")
        self.stats = Stats()
        self.batch = BatchGenerator(model, keep_finished=True, draft=draft, n_draft=n_draft)
        self.slot_tokens: dict[int, list[int]] = {}  # an idle slot -> the tokens its cells hold
        self.last_used: dict[int, int] = {}           # slot -> when it was last released (a count)
        self._uses = 0
        self.prompt_cache = PromptCache(cache_ram) if cache_ram else None
        self.waiting: collections.deque[Job] = collections.deque()
        self.active: list[Job] = []
        self.free_slots = list(range(self.parallel))
        self.lora: tuple | None = None   # the model's LoRA scales now, and how to change them (the server's)
        self.set_lora: Callable[[tuple], None] | None = None
        self.actions: list[tuple[int, Callable, Future]] = []  # slot actions waiting for their slot
        self._cond = threading.Condition()
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="torchggml-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the submitter's side

    def submit(self, jobs: list[Job]) -> None:
        """Queue the jobs of one request (all or none); QueueFull past the bound."""
        too_big = [j for j in jobs if j.need > self.model.n_ctx]
        if too_big:
            raise ValueError(f"a sequence needs {too_big[0].need} cells (its prompt and max_tokens), more than "
                             f"the context's n_ctx={self.model.n_ctx}")
        with self._cond:
            if not self._running:
                raise RuntimeError("the engine was stopped")
            if len(self.waiting) + len(jobs) > self.max_queue + len(self.free_slots):
                raise QueueFull(f"the server is busy: {len(self.active)} sequences running and "
                                f"{len(self.waiting)} waiting (queue size {self.max_queue}); retry later")
            self.waiting.extend(jobs)
            self._cond.notify()

    def slot_action(self, slot: int, action: str, path: str | None = None) -> Future:
        """Save, restore or erase a slot's prompt cache (llama-server's /slots/{id}?action=...) once
        the slot is idle: a Future of llama-server's JSON reply, or of a SlotError."""
        if not 0 <= slot < self.parallel:
            raise SlotError(400, f"Invalid slot ID {slot}: this server has slots 0..{self.parallel - 1}")
        run = {"save": self._save_slot, "restore": self._restore_slot, "erase": self._erase_slot}.get(action)
        if run is None:
            raise SlotError(400, f"Invalid action {action!r}: one of save, restore, erase")
        if action != "erase" and self.model.memory.save_seq is None:
            raise SlotError(501, f"slot {action}: this model's memory ({type(self.model.memory).__name__}) cannot "
                                 f"copy a sequence out")
        done = Future()
        with self._cond:
            if not self._running:
                raise RuntimeError("the engine was stopped")
            self.actions.append((slot, lambda: run(slot, path), done))
            self._cond.notify()
        return done

    def stop(self) -> None:
        with self._cond:
            self._running = False
            self._cond.notify()
        self._thread.join(timeout=30)
        for _, _, done in self.actions:  # slot actions that never got their slot
            done.set_exception(SlotError(503, "the server is stopping"))
        self.actions = []

    @property
    def n_waiting(self) -> int:
        return len(self.waiting)

    # ------------------------------------------------------------ the engine thread

    def _loop(self) -> None:
        self.model.reset()  # the engine (its thread) owns the memory: no cells of earlier work
        while True:
            with self._cond:
                while self._running and not self.waiting and not self.active and not self.actions:
                    self._cond.wait()
                if not self._running:
                    break
                self._admit()
                ready = [a for a in self.actions if a[0] in self.free_slots]
                self.actions = [a for a in self.actions if a[0] not in self.free_slots]
            for _, run, done in ready:
                try:
                    done.set_result(run())
                except SlotError as e:
                    done.set_exception(e)
                except Exception as e:  # noqa: BLE001 - the client hears why, the engine goes on
                    done.set_exception(SlotError(500, f"{type(e).__name__}: {e}"))
            try:
                self._step()
            except Exception as e:  # a failed step fails its sequences, never the engine
                for job in list(self.active):
                    self._release(job, "error")
                    job.emit(("error", job, f"{type(e).__name__}: {e}", 500))

    def _admit(self) -> None:
        """Start waiting jobs, in order, while a slot is free and the reservations leave room; a job
        for a busy slot (id_slot) waits without holding back the jobs behind it."""
        held = []  # jobs waiting for their busy slot, in their order
        while self.free_slots and self.waiting:
            job = self.waiting[0]
            if job.cancelled:  # its client left while it waited
                self.waiting.popleft()
                self.stats.sequences_finished["cancelled"] += 1
                continue
            if job.id_slot >= 0 and job.id_slot not in self.free_slots:
                held.append(self.waiting.popleft())  # its slot is busy
                continue
            if sum(j.need for j in self.active) + job.need > self.model.n_ctx:
                break  # it waits for cells (and the ones behind it with it: first come, first served)
            if job.lora is not None and job.lora != self.lora:
                if self.active:  # other LoRA scales: not batched with the running sequences (as llama-server)
                    break
                try:
                    self._use_lora(job.lora)
                except Exception as e:  # the adapters could not be set: this request fails, not the engine
                    self.waiting.popleft()
                    job.emit(("error", job, f"{type(e).__name__}: {e}", 500))
                    continue
            self.waiting.popleft()
            self.active.append(job)
            try:
                job.seq_id = self._take_slot(job)
                if job.gen is not None:
                    job.seq = self.batch.add(job.gen, job.seq_id, job.need, owner=job, n_cached=job.n_cached)
                    self.stats.cached_prompt_tokens += job.n_cached
            except Exception as e:  # noqa: BLE001 - this job fails (its slot cleared), the engine goes on
                if job.seq_id >= 0:
                    self.slot_tokens.pop(job.seq_id, None)
                    self._release(job, "error")
                else:
                    self.active.remove(job)
                job.emit(("error", job, f"{type(e).__name__}: {e}", 500))
        self.waiting.extendleft(reversed(held))

    def _use_lora(self, scales: tuple) -> None:
        """Give the model these LoRA scales (set_lora, the server's); the cached prompts, computed
        with the others, are dropped."""
        self.set_lora(scales)
        for slot in list(self.slot_tokens):
            self.model.reset(slot)
        self.slot_tokens.clear()
        if self.prompt_cache is not None:
            self.prompt_cache.clear()
        self.lora = scales

    def _take_slot(self, job: Job) -> int:
        """The free slot whose cells share the longest prefix with the job's prompt (an empty one,
        else the least recently used, among equals; the asked one with id_slot), holding that
        prefix, or a longer one from the host-memory cache; the rest is given up, and idle slots'
        cells too where the job needs the room."""
        reuse = job.cache_prompt and job.gen is not None and self.model.memory.save_seq is not None
        limit = len(job.prompt) - 1  # the prompt's last token is always evaluated, for its logits

        def usable(tokens) -> int:  # (a recurrent state: only the whole of its prompt)
            n = min(common_prefix(tokens, job.prompt), limit) if reuse else 0
            return n if not self._whole_only or n == len(tokens) else 0
        common = {s: usable(self.slot_tokens.get(s, ())) for s in self.free_slots}
        # the longest prefix; among equals an empty slot, then the least recently used
        slot = job.id_slot if job.id_slot >= 0 else max(
            self.free_slots, key=lambda s: (common[s], s not in self.slot_tokens, -self.last_used.get(s, -1), -s))
        self.free_slots.remove(slot)
        job.seq_id = slot
        n = common[slot]
        entry, n_ram = self.prompt_cache.best(job.prompt) if reuse and self._ram_cache else (None, 0)
        n_ram = min(n_ram, limit)
        if n_ram > n:
            n = 0
        held = self.slot_tokens.get(slot)
        if held is not None and n < len(held):
            self._stash(slot, held)
        self.slot_tokens.pop(slot, None)
        if self.cache_reuse and reuse and held and n_ram <= n:
            n = self._reuse_chunks(slot, held, job.prompt, n, limit)
        if n == 0 or (n < len(held) and not self.model.keep_prefix(slot, n)):
            n = 0
            self.model.reset(slot)
        self._make_room(job.need - n, keep=slot)
        if n_ram > n:
            self.model.load_seq(slot, entry.cells, n_ram)
            self.prompt_cache.take(entry, n_ram)
            n = n_ram
        job.n_cached = n
        return slot

    def _reuse_chunks(self, slot: int, held: list[int], prompt: list[int], n: int, limit: int) -> int:
        """llama-server's --cache-reuse: after the common prefix (n tokens), each run of at least
        cache_reuse cached tokens that continues the prompt is moved to its place in it (the cells
        between dropped, the run's K re-rotated: Model.shift); the prompt tokens now held."""
        head_c = head_p = n
        while head_c < len(held) and head_p < limit:
            m = 0
            while head_c + m < len(held) and head_p + m < limit and held[head_c + m] == prompt[head_p + m]:
                m += 1
            if m >= self.cache_reuse:
                self.model.remove(slot, head_p, head_c)
                self.model.shift(slot, head_c, head_c + m, head_p - head_c)
                head_c += m
                head_p += m
            else:
                head_c += 1
        if head_p > n:
            self.stats.reused_tokens += head_p - n
        return head_p

    @property
    def _whole_only(self) -> bool:
        """The memory cannot go back (recurrent states): a kept prompt is reused whole or not at all."""
        return self.model.memory.keep_prefix is None

    @property
    def _ram_cache(self) -> bool:
        return self.prompt_cache is not None and not self._whole_only

    def _stash(self, slot: int, tokens: list[int]) -> None:
        """Put an idle slot's prompt and a copy of its cells in the host-memory cache (if on)."""
        if self._ram_cache and self.prompt_cache.wants(tokens):
            self.prompt_cache.add(tokens, self.model.save_seq(slot))

    def _room(self) -> int:
        """Free cells beyond those the running jobs may still write (their reservations' rest)."""
        kv = self.model.memory.attention
        if kv is None:  # recurrent states only: no cells to run out of
            return self.model.n_ctx
        owed = sum(max(j.need - self.model.memory.seq_len(j.seq_id), 0) for j in self.active)
        return int(np.count_nonzero(kv.cell_seq < 0)) - owed

    def _make_room(self, cells: int, keep: int) -> None:
        """Free idle slots' cells (least recently used first, never slot `keep`'s) until the room
        holds `cells`."""
        if self.model.memory.attention is None:
            return
        for slot in sorted((s for s in self.slot_tokens if s != keep), key=lambda s: self.last_used.get(s, -1)):
            if self._room() >= cells:
                return
            self._stash(slot, self.slot_tokens.pop(slot))
            self.model.reset(slot)

    def _release(self, job: Job, outcome: str) -> None:
        if job in self.active:
            # a finished request's slot keeps its prompt's cells, where the memory can drop the rest
            keep = (job.seq is not None and job.cache_prompt and outcome in ("stop", "length")
                    and self._keep_prompt(job))
            if job.seq is not None:
                self.batch.remove(job.seq, free=not keep)  # (nothing to do when the loop let it go)
            if keep:
                self.slot_tokens[job.seq_id] = job.prompt
            else:
                self.model.reset(job.seq_id)
            self._uses += 1
            self.last_used[job.seq_id] = self._uses
            with self._cond:
                self.active.remove(job)
                self.free_slots.append(job.seq_id)
                self.free_slots.sort()
            self.stats.sequences_finished[outcome] += 1

    def _keep_prompt(self, job: Job) -> bool:
        """The slot's memory back to the prompt's end: its tail dropped, or (recurrent states) the
        copy taken there put back; False where neither can be done."""
        if self.model.keep_prefix(job.seq_id, len(job.prompt)):
            return True
        if job.prompt_state is None:
            return False
        self.model.load_seq(job.seq_id, job.prompt_state)
        return True

    # ------------------------------------------------------------ slot actions (engine thread, slot idle)

    def _save_slot(self, slot: int, path: str) -> dict:
        start = time.perf_counter()
        tokens = self.slot_tokens.get(slot, [])
        n_bytes = slot_files.write(path, self.model, tokens, self.model.save_seq(slot))
        return {"id_slot": slot, "filename": os.path.basename(path), "n_saved": len(tokens), "n_written": n_bytes,
                "timings": {"save_ms": (time.perf_counter() - start) * 1e3}}

    def _restore_slot(self, slot: int, path: str) -> dict:
        start = time.perf_counter()
        try:
            tokens, cells, n_bytes = slot_files.read(path, self.model)
        except slot_files.SlotFileError as e:
            raise SlotError(400, f"Unable to restore slot: {e}") from None
        if len(tokens) >= self.model.n_ctx:
            raise SlotError(400, f"Unable to restore slot: its {len(tokens)} tokens do not fit the context "
                                 f"(n_ctx {self.model.n_ctx})")
        self.slot_tokens.pop(slot, None)
        self.model.reset(slot)
        self._make_room(len(tokens), keep=slot)
        if self._room() < len(tokens):
            raise SlotError(503, f"Unable to restore slot: {len(tokens)} cells are needed and the running requests "
                                 f"leave {max(self._room(), 0)} of n_ctx {self.model.n_ctx}; retry later")
        self.model.load_seq(slot, cells)
        if tokens:
            self.slot_tokens[slot] = tokens
        self._uses += 1
        self.last_used[slot] = self._uses
        return {"id_slot": slot, "filename": os.path.basename(path), "n_restored": len(tokens), "n_read": n_bytes,
                "timings": {"restore_ms": (time.perf_counter() - start) * 1e3}}

    def _erase_slot(self, slot: int, path=None) -> dict:
        n = len(self.slot_tokens.pop(slot, ()))
        self.model.reset(slot)
        return {"id_slot": slot, "n_erased": n}

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
            if job.first_token is None:  # its prompt was evaluated in this step
                job.first_token = time.perf_counter()
                if self._whole_only and job.cache_prompt and job.gen.prefix is None:
                    state = self.model.save_seq(job.seq_id)  # the memory at the prompt's end, to keep
                    job.prompt_state = state if state.n == len(job.prompt) else None
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
