"""Constrained decoding through llguidance (guidance-ai's maintained Rust library): JSON schemas,
GBNF or Lark grammars and regular expressions turned into a mask of the tokens allowed next.

llguidance needs the vocabulary as byte strings: each token's bytes as the project's tokenizer
renders them, special (control) tokens marked with a leading 0xFF byte as llguidance expects, and
the tokenizer itself for text it must tokenize. `Vocabulary(tokenizer)` builds that once per model;
`Constraint(vocab, grammar)` is one sequence's matcher, with the interface of
torchggml.models.generation (allowed, accept, is_complete).

JSON from a schema is compact (no whitespace between tokens, "," and ":" separators), so a
sequence cannot wander in whitespace.
"""
from __future__ import annotations

import json

import numpy as np
import torch

# the JSON compiler's options: compact output
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


class GrammarError(ValueError):
    """A schema or grammar llguidance cannot compile (the server answers 400)."""


def _llguidance():
    try:
        import llguidance
    except ImportError as e:  # pragma: no cover - an optional extra
        raise GrammarError("grammars and JSON schemas need llguidance: pip install 'torchggml[server]'") from e
    return llguidance


class Vocabulary:
    """A model's vocabulary for llguidance (an LLTokenizer)."""

    def __init__(self, tokenizer):
        llg = _llguidance()
        from ..text.tokenizer import TokenAttr
        self.n_vocab = tokenizer.n_vocab
        tokens = []
        for i in range(self.n_vocab):
            piece = tokenizer.token_to_piece_bytes(i)
            if tokenizer.token_attr(i) & TokenAttr.CONTROL:
                piece = b"\xff" + piece
            tokens.append(piece)

        class Wrapped:  # what llguidance.TokenizerWrapper reads
            eos_token_id = tokenizer.eos_id
            bos_token_id = tokenizer.bos_id

            def __call__(self, text: bytes):
                return tokenizer.tokenize(text.decode("utf-8", errors="replace"), add_special=False)

        wrapped = Wrapped()
        wrapped.tokens = tokens
        eog = sorted(tokenizer.eog_ids) or [tokenizer.eos_id]
        self.lltok = llg.LLTokenizer(llg.TokenizerWrapper(wrapped), n_vocab=self.n_vocab, eos_token=eog)

    def compile(self, kind: str, source) -> str:
        """An llguidance grammar from ("json_schema", dict), ("grammar", GBNF or Lark text) or
        ("regex", text); GrammarError when it does not compile."""
        llg = _llguidance()
        try:
            if kind == "json_schema":
                grammar = llg.LLMatcher.grammar_from_json_schema(json.dumps(source), defaults=JSON_OPTIONS)
            elif kind in ("grammar", "regex"):
                grammar = llg.grammar_from(kind, source)
            else:
                raise GrammarError(f"unknown grammar kind {kind!r}")
        except (ValueError, TypeError) as e:
            raise GrammarError(f"invalid {kind}: {e}") from None
        error = llg.LLMatcher.validate_grammar(grammar, self.lltok)
        if error:
            raise GrammarError(f"invalid {kind}: {error}")
        return grammar


class Constraint:
    """One sequence's grammar state."""

    def __init__(self, vocab: Vocabulary, grammar: str):
        llg = _llguidance()
        self.vocab = vocab
        self.matcher = llg.LLMatcher(vocab.lltok, grammar, log_level=0)
        self._check()

    def _check(self) -> None:
        if self.matcher.is_error():
            raise GrammarError(f"grammar: {self.matcher.get_error()}")

    def allowed(self) -> torch.Tensor:
        """Bool [n_vocab]: the tokens the grammar allows next."""
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        mask = np.unpackbits(bits, bitorder="little")[: self.vocab.n_vocab].astype(bool)
        return torch.from_numpy(mask)

    def accept(self, token: int) -> None:
        self.matcher.consume_token(int(token))
        self._check()

    def is_complete(self) -> bool:
        """The grammar is satisfied and allows nothing more."""
        return self.matcher.is_stopped()
