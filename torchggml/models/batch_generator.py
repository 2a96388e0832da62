"""Sequences generated together on one model: the one decode loop behind Model.generate,
Model.generate_batch and the server's engine (torchggml.server.engine), so every sampling option,
stop string and grammar works the same through each.

    batch = BatchGenerator(model)
    seq = batch.add(Generation(tokenizer, prompt_ids, params, max_tokens=16), seq_id=0)
    while batch.active:
        for update in batch.step():      # each sequence that moved: its text, tokens, end
            print(update.text, end="")

Each step evaluates one batch (`Model.eval_batch`, logits of each sequence's last token): the
next token of every decoding sequence first, then prompt chunks of the prefilling ones in the room
left, n_batch tokens in all, so a long prompt runs in pieces beside the decodes instead of
stalling them; then each sequence's Generation samples from its row. A sequence that finishes
(end of generation, a stop string, its grammar complete, max_tokens, or its cell limit) leaves
the batch and its cells are freed. No threads and no locks: the caller drives step() and holds the
model (Model.generate holds its lock; the server's engine thread owns the model).

A sequence may use `limit` cells of the unified KV cache (its prompt and generated tokens): it
ends with finish_reason "length" when its next token would not fit.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .generation import Generation
from .sampling import TokenChoice


@dataclass(eq=False)
class BatchSequence:
    """One sequence of the batch: its generation, its memory sequence id and its cell limit."""
    gen: Generation
    seq_id: int
    limit: int
    n_prompt_done: int = 0
    prompt_done_at: float | None = None  # perf_counter when its prompt was evaluated
    owner: object = None  # the caller's object for this sequence (the server's job)

    @property
    def prompt(self) -> list[int]:
        return self.gen.prompt

    @property
    def prefilling(self) -> bool:
        return self.n_prompt_done < len(self.gen.prompt)


@dataclass
class Update:
    """What one step did to one sequence: the text its token completed, its new tokens; when it
    finished, `rest` (the text held back until then: an incomplete character, a possible stop
    string's start), and `error` when its own sampling failed (its grammar)."""
    seq: BatchSequence
    text: str
    choices: list[TokenChoice] = field(default_factory=list)
    finished: bool = False
    rest: str = ""
    error: Exception | None = None


@dataclass
class StepCounts:
    prompt_tokens: int = 0
    decode_tokens: int = 0
    generated: int = 0


class BatchGenerator:
    def __init__(self, model, n_batch: int | None = None, keep_finished: bool = False):
        """keep_finished: a finished sequence keeps its cells (Model.generate leaves the cache
        holding the text, as llama.cpp's context does); otherwise they are freed."""
        self.model = model
        self.n_batch = int(n_batch or model.n_batch)
        self.keep_finished = keep_finished
        self.active: list[BatchSequence] = []
        self.last = StepCounts()

    def add(self, gen: Generation, seq_id: int, limit: int | None = None, owner=None) -> BatchSequence:
        """Start `gen` as memory sequence `seq_id` (whose cells the caller has cleared)."""
        seq = BatchSequence(gen, int(seq_id), int(limit or self.model.n_ctx), owner=owner)
        self.active.append(seq)
        return seq

    def remove(self, seq: BatchSequence, free: bool = True) -> None:
        """Take `seq` out of the batch (finished or cancelled); free its cells unless asked not to."""
        if seq in self.active:
            self.active.remove(seq)
            if free:
                self.model.reset(seq.seq_id)

    def step(self) -> list[Update]:
        """Evaluate one batch and sample every sequence that reached its next token."""
        batch: list[tuple[BatchSequence, list[int]]] = []
        budget = self.n_batch
        for seq in self.active:  # every decoding sequence's next token first
            if not seq.prefilling and seq.gen.finish_reason is None:
                batch.append((seq, [seq.gen.last_token]))
                budget -= 1
        for seq in self.active:  # then prompt chunks in the room left
            if seq.prefilling and budget > 0:
                chunk = seq.prompt[seq.n_prompt_done: seq.n_prompt_done + budget]
                batch.append((seq, chunk))
                budget -= len(chunk)
        self.last = counts = StepCounts()
        if not batch:
            return [self._finish(seq, "") for seq in list(self.active) if seq.gen.finish_reason is not None]
        rows = self.model.eval_batch([tokens for _, tokens in batch], [s.seq_id for s, _ in batch], logits="last")
        updates = []
        for (seq, tokens), row in zip(batch, rows):
            if seq.prefilling:
                seq.n_prompt_done += len(tokens)
                counts.prompt_tokens += len(tokens)
                if seq.prefilling:
                    continue
                seq.prompt_done_at = time.perf_counter()
            else:
                counts.decode_tokens += 1
            updates.append(self._sample(seq, row[0]))
        counts.generated = sum(len(u.choices) for u in updates)
        return updates

    def _sample(self, seq: BatchSequence, logits) -> Update:
        gen = seq.gen
        before = gen.n_generated
        try:
            text = gen.step(logits) if gen.finish_reason is None else ""  # max_tokens 0: done at once
        except Exception as e:  # this sequence's own failure (its grammar, its sampler): it alone ends
            gen.finish("error")
            self.remove(seq)
            return Update(seq, "", [], True, error=e)
        if gen.finish_reason is None and len(seq.prompt) + gen.n_generated > seq.limit:
            gen.finish("length")  # its next token has no cell left
        update = Update(seq, text, gen.choices[before:])
        if gen.finish_reason is not None:
            update.finished, update.rest = True, gen.flush()
            self.remove(seq, free=not self.keep_finished)
        return update

    def _finish(self, seq: BatchSequence, text: str) -> Update:
        self.remove(seq, free=not self.keep_finished)
        return Update(seq, text, [], True, seq.gen.flush())
