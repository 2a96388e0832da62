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

Speculative decoding (`draft`, see speculative.py): a decoding sequence's step holds its last
token and up to n_draft drafted tokens, with the logits of every row; its Generation samples from
those rows in order while each token equals the draft's, so one step may give several tokens, and
the cells of the rejected drafts are dropped (memories that cannot drop cells do not draft).
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
    drafted: int = 0   # draft tokens evaluated
    accepted: int = 0  # of them, taken by the sampler


class BatchGenerator:
    def __init__(self, model, n_batch: int | None = None, keep_finished: bool = False, draft=None,
                 n_draft: int = 8):
        """keep_finished: a finished sequence keeps its cells (Model.generate leaves the cache
        holding the text, as llama.cpp's context does); otherwise they are freed. draft: a
        speculative.NgramDraft or ModelDraft (None: no drafting), proposing up to n_draft tokens."""
        self.model = model
        self.n_batch = int(n_batch or model.n_batch)
        self.keep_finished = keep_finished
        self.draft = draft if model.memory.keep_prefix is not None else None
        self.n_draft = int(n_draft)
        self.active: list[BatchSequence] = []
        self.last = StepCounts()

    def add(self, gen: Generation, seq_id: int, limit: int | None = None, owner=None,
            n_cached: int = 0) -> BatchSequence:
        """Start `gen` as memory sequence `seq_id`, whose cells hold exactly the first n_cached
        tokens of its prompt (a prompt cache's hit; 0: the caller cleared them). A prompt with
        embeddings (gen.prefix) is evaluated here up to its last token, on cleared cells."""
        if gen.prefix is not None:
            if n_cached:
                raise ValueError("a prompt with embeddings starts on cleared cells (n_cached must be 0)")
            self.model.eval_parts(gen.prefix, seq_id)
            n_cached = len(gen.prompt) - 1
        if not 0 <= n_cached < max(len(gen.prompt), 1):
            raise ValueError(f"n_cached={n_cached}: at least the prompt's last token must be evaluated "
                             f"(the prompt has {len(gen.prompt)})")
        seq = BatchSequence(gen, int(seq_id), int(limit or self.model.n_ctx), n_prompt_done=int(n_cached),
                            owner=owner)
        self.active.append(seq)
        return seq

    def remove(self, seq: BatchSequence, free: bool = True) -> None:
        """Take `seq` out of the batch (finished or cancelled); free its cells unless asked not to."""
        if seq in self.active:
            self.active.remove(seq)
            if free:
                self.model.reset(seq.seq_id)
            if self.draft is not None:
                self.draft.forget(seq.seq_id)

    def step(self) -> list[Update]:
        """Evaluate one batch and sample every sequence that reached its next token."""
        batch: list[tuple[BatchSequence, list[int]]] = []
        drafts: dict[int, list[int]] = {}  # id(seq) -> its draft
        budget = self.n_batch
        for seq in self.active:  # every decoding sequence's next token (and its draft) first
            if not seq.prefilling and seq.gen.finish_reason is None:
                drafts[id(seq)] = draft = self._propose(seq, budget - 1)
                batch.append((seq, [seq.gen.last_token] + draft))
                budget -= 1 + len(draft)
        for seq in self.active:  # then prompt chunks in the room left
            if seq.prefilling and budget > 0:
                chunk = seq.prompt[seq.n_prompt_done: seq.n_prompt_done + budget]
                batch.append((seq, chunk))
                budget -= len(chunk)
        self.last = counts = StepCounts()
        if not batch:
            return [self._finish(seq, "") for seq in list(self.active) if seq.gen.finish_reason is not None]
        logits = ["all" if drafts.get(id(s)) else "last" for s, _ in batch]
        rows = self.model.eval_batch([tokens for _, tokens in batch], [s.seq_id for s, _ in batch], logits=logits)
        updates = []
        for (seq, tokens), row in zip(batch, rows):
            if seq.prefilling:
                seq.n_prompt_done += len(tokens)
                counts.prompt_tokens += len(tokens)
                if seq.prefilling:
                    continue
                seq.prompt_done_at = time.perf_counter()
            else:
                counts.decode_tokens += len(tokens)
            updates.append(self._sample(seq, row, drafts.get(id(seq), [])))
        counts.generated = sum(len(u.choices) for u in updates)
        return updates

    def _propose(self, seq: BatchSequence, room: int) -> list[int]:
        """A draft for `seq` that fits its cell limit, its max_tokens and the batch's room (none
        for a prompt with embeddings: its ids hold no text to look up)."""
        if self.draft is None or seq.gen.prefix is not None:
            return []
        gen = seq.gen
        k = min(self.n_draft, room, seq.limit - len(seq.prompt) - gen.n_generated,
                gen.max_tokens - gen.n_generated - 1)
        if k <= 0:
            return []
        return self.draft.propose(seq.seq_id, seq.prompt + [c.token for c in gen.choices], k)

    def _sample(self, seq: BatchSequence, rows, draft: list[int]) -> Update:
        """The sequence's tokens from its rows: one, or with a draft, as many as the sampler takes
        equal to the draft's (and the one after); the rejected drafts' cells dropped."""
        gen = seq.gen
        before = gen.n_generated
        text, accepted = "", 0
        try:
            for i in range(len(draft) + 1):
                if gen.finish_reason is not None:  # max_tokens 0: done at once
                    break
                text += gen.step(rows[i])
                if gen.finish_reason is not None or i == len(draft) or gen.last_token != draft[i]:
                    break
                accepted += 1
        except Exception as e:  # this sequence's own failure (its grammar, its sampler): it alone ends
            gen.finish("error")
            self.remove(seq)
            return Update(seq, "", [], True, error=e)
        if draft:
            # the batch wrote the last token at position L and the draft after it: keep L + accepted
            self.model.keep_prefix(seq.seq_id, self.model.memory.seq_len(seq.seq_id) - len(draft) + accepted)
            self.last.drafted += len(draft)
            self.last.accepted += accepted
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
