"""One sequence's generation: sampling, end-of-generation, text, stop strings and limits, shared by
Model.generate and the server's continuous batching (torchggml.server.engine), which feed it
one row of logits per step.

    gen = Generation(tokenizer, prompt_ids, SamplingParams(temperature=0), max_tokens=16, stop=["\\n"])
    while not gen.finish_reason:
        text = gen.step(logits_row)      # the text this token completes ("" while held back)
        logits_row = eval(gen.last_token)
    text += gen.flush()

finish_reason is OpenAI's: "stop" (an end-of-generation token, a stop string, or a grammar that
is complete) or "length" (max_tokens, or the caller's `finish("length")` when the context is full).
A constraint (a grammar, e.g. torchggml.server.grammar's) is any object of the Constraint
protocol below. ignore_eos (llama.cpp's, for benchmarks)
never samples an end-of-generation token.
"""
from __future__ import annotations

from typing import Protocol, Sequence

import torch

from .sampling import Sampler, SamplingParams, StopStrings, TokenChoice


class Constraint(Protocol):
    """What the sampler asks of a grammar, each step: the tokens allowed next, the token taken,
    and whether the text is complete (the generation then ends with "stop")."""

    def allowed(self) -> torch.Tensor | None:
        """A bool mask [n_vocab] of the tokens allowed next, or None: any token."""

    def accept(self, token: int) -> None:
        """The token sampled."""

    def is_complete(self) -> bool:
        """The text so far is a whole sentence of the grammar."""


class Generation:
    def __init__(self, tokenizer, prompt: Sequence[int], params: SamplingParams | None = None,
                 max_tokens: int = 128, stop: Sequence[str] = (), constraint: Constraint | None = None,
                 ignore_eos: bool = False):
        self.tokenizer = tokenizer
        self.prompt = [int(t) for t in prompt]
        self.sampler = Sampler(params, history=self.prompt)
        self.max_tokens = int(max_tokens)
        self.constraint = constraint
        self.ignore_eos = ignore_eos  # end-of-generation tokens are never sampled (llama.cpp's ignore_eos)
        self.decoder = tokenizer.stream_decoder()
        self.stops = StopStrings(stop)
        self.choices: list[TokenChoice] = []  # the generated tokens (end-of-generation excluded)
        self.finish_reason: str | None = None if self.max_tokens > 0 else "length"
        # a prompt with embeddings (an image's rows): the parts that fill the cache before the decode
        # loop starts from the prompt's last token (prompt ids hold 0 for each embedding row)
        self.prefix: list | None = None

    @property
    def last_token(self) -> int:
        return self.choices[-1].token

    @property
    def n_generated(self) -> int:
        return len(self.choices)

    def finish(self, reason: str) -> None:
        if self.finish_reason is None:
            self.finish_reason = reason

    def step(self, logits: torch.Tensor) -> str:
        """Sample the next token from `logits` [n_vocab] and return the text it completes."""
        if self.finish_reason is not None:
            raise RuntimeError(f"generation already finished ({self.finish_reason})")
        allowed = self.constraint.allowed() if self.constraint is not None else None
        if self.ignore_eos and self.tokenizer.eog_ids:
            allowed = torch.ones(logits.numel(), dtype=torch.bool) if allowed is None else allowed.clone()
            allowed[list(self.tokenizer.eog_ids)] = False
        choice = self.sampler.sample(logits, allowed)
        if self.constraint is not None:
            self.constraint.accept(choice.token)
        if self.tokenizer.is_eog(choice.token):
            self.finish("stop")
            return ""
        self.sampler.accept(choice.token)
        self.choices.append(choice)
        text = self.stops.push(self.decoder.push(choice.token))
        if self.stops.stopped or (self.constraint is not None and self.constraint.is_complete()):
            self.finish("stop")
        elif len(self.choices) >= self.max_tokens:
            self.finish("length")
        return text

    def flush(self) -> str:
        """The text still held (an incomplete character, a possible stop string's start)."""
        return self.stops.push(self.decoder.flush()) + self.stops.flush()
