"""Drafts for speculative decoding: tokens proposed cheaply, then checked by the model in one batch
(batch_generator.py): the model evaluates the sequence's last token and the draft together, the
sampler takes its tokens from those rows in order while each equals the draft's, and the cells of
the rejected tail are dropped. Every token is still sampled from the model's own logits, so the
text is what plain decoding gives (greedy: the same tokens, up to the rounding of a batch's
products against a single token's).

    NgramDraft(n_max=3)           prompt lookup (llama.cpp's --lookup / ngram drafting): the tokens
                                  that followed the last earlier occurrence of the context's tail
    ModelDraft(draft_model)       a small model of the same vocabulary, run greedily (llama.cpp's -md)

A draft is `propose(seq_id, context, k) -> list[int]` (at most k tokens; [] for none).
"""
from __future__ import annotations

import numpy as np


class NgramDraft:
    def __init__(self, n_max: int = 3, n_min: int = 1):
        if not 1 <= n_min <= n_max:
            raise ValueError(f"NgramDraft: need 1 <= n_min ({n_min}) <= n_max ({n_max})")
        self.n_max, self.n_min = n_max, n_min

    def propose(self, seq_id: int, context: list[int], k: int) -> list[int]:
        """The k tokens after the last earlier occurrence of the context's last n tokens (the
        longest n from n_max down to n_min that occurs)."""
        ctx = np.asarray(context, dtype=np.int64)
        for n in range(min(self.n_max, len(ctx) - 1), self.n_min - 1, -1):
            tail = ctx[-n:]
            # starts i < len - n with ctx[i:i+n] == tail, found with one comparison per offset
            windows = np.lib.stride_tricks.sliding_window_view(ctx[:-1], n)
            hits = np.flatnonzero((windows == tail).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return ctx[start:start + k].tolist()
        return []

    def forget(self, seq_id: int) -> None:
        pass


# catching up by at most this many tokens goes token by token: the model keeps one graph per shape,
# and a catch-up of 2 tokens between single-token drafts would rebuild it twice a step
SINGLE_STEPS = 4


class ModelDraft:
    """A draft model run greedily on its own memory, one sequence per target sequence (same ids);
    its cells follow the context (the prefix it shares with what it last drafted is kept)."""

    def __init__(self, model, target=None):
        self.model = model
        self.held: dict[int, list[int]] = {}  # seq_id -> the tokens in the draft model's cells
        if model.memory.keep_prefix is None:
            raise ValueError(f"draft model {model.path}: its memory cannot drop tokens (recurrent): "
                             f"it cannot draft")
        if target is not None:
            check_same_vocabulary(target, model)

    def propose(self, seq_id: int, context: list[int], k: int) -> list[int]:
        m, held = self.model, self.held.get(seq_id)
        if held is None:  # a new sequence: whatever the draft model's cells hold of it is not its context
            m.reset(seq_id)
            held = []
        common = 0
        for a, b in zip(held, context):
            if a != b:
                break
            common += 1
        common = min(common, len(context) - 1)  # at least the last token is evaluated, for its logits
        if common < len(held):
            m.keep_prefix(seq_id, common)
        if len(context) + k > m.n_ctx:
            k = m.n_ctx - len(context)
        draft: list[int] = []
        if k <= 0:
            self.held[seq_id] = context[:common]
            return draft
        new = context[common:]
        if len(new) <= SINGLE_STEPS:  # one token at a time: the draft model keeps its one decode graph
            for token in new:
                logits = m.eval([token], seq_id=seq_id, logits="last")[0]
        else:  # (a prompt: one batch)
            logits = m.eval(new, seq_id=seq_id, logits="last")[0]
        while True:
            draft.append(int(logits.argmax()))
            if len(draft) == k:
                break
            logits = m.eval(draft[-1:], seq_id=seq_id, logits="last")[0]
        self.held[seq_id] = list(context) + draft[:-1]
        return draft

    def forget(self, seq_id: int) -> None:
        """The target sequence ended: its draft cells go too."""
        if self.held.pop(seq_id, None) is not None:
            self.model.reset(seq_id)


def check_same_vocabulary(target, draft) -> None:
    """ValueError naming both files unless the draft model's vocabulary is the target's (size and
    every token's text), as llama.cpp requires of -md."""
    a, b = target.tokenizer, draft.tokenizer
    if target.n_vocab != draft.n_vocab:
        raise ValueError(f"draft model {draft.path} has {draft.n_vocab} tokens, the model {target.path} "
                         f"{target.n_vocab}: a draft model needs the same vocabulary")
    differ = next((i for i in range(target.n_vocab) if a.token_text(i) != b.token_text(i)), None)
    if differ is not None:
        raise ValueError(f"draft model {draft.path}: token {differ} is {b.token_text(differ)!r}, "
                         f"{a.token_text(differ)!r} in {target.path}: a draft model needs the same vocabulary")


def make_draft(draft, target):
    """A draft from what a caller gives: None, "ngram", a draft Model, or a draft object."""
    if draft is None or hasattr(draft, "propose"):
        return draft
    if draft == "ngram":
        return NgramDraft()
    if hasattr(draft, "eval") and hasattr(draft, "memory"):
        return ModelDraft(draft, target)
    raise ValueError(f"draft={draft!r}: give None, 'ngram', a draft Model or an object with propose()")
