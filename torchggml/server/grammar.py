"""Constrained decoding through llguidance (guidance-ai's maintained Rust library): JSON schemas,
GBNF or Lark grammars and regular expressions turned into a mask of the tokens allowed next.

llguidance needs the vocabulary as byte strings: each token's bytes as the project's tokenizer
renders them, special (control) tokens marked with a leading 0xFF byte as llguidance expects, and
the tokenizer itself for text it must tokenize. `Vocabulary(tokenizer)` builds that once per model;
`Constraint(vocab, grammar)` is one sequence's matcher, with the interface of
torchggml.models.generation (allowed, accept, is_complete).

JSON from a schema is compact (no whitespace between tokens, "," and ":" separators, whatever the
schema's "x-guidance" asks), so a sequence cannot wander in whitespace; and its numbers are bounded
as llama.cpp's json-schema-to-grammar bounds them (integer part, fraction and exponent at most 16
digits each: `MAX_DIGITS`), so that output always ends. llguidance's JSON compiler has no such
option: `Constraint(json_bounds=True)` masks the tokens that would make a run of digits outside a
string longer (unless nothing else is allowed, e.g. a schema whose minimum needs more digits).

Errors never echo the grammar (llguidance's verbose errors are off): a client's 10 MB grammar is
not sent back to it.
"""
from __future__ import annotations

import json

import numpy as np
import torch

# the JSON compiler's options: compact output (overrides: a schema's x-guidance cannot change them)
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
# llama.cpp's integral-part ([0-9]{1,16}), decimal-part ([0-9]{1,16}) and exponent bounds
MAX_DIGITS = 16
_DIGITS = frozenset(b"0123456789")


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
        tokens, self.pieces, lead = [], [], np.zeros(self.n_vocab, np.int32)
        for i in range(self.n_vocab):
            piece = tokenizer.token_to_piece_bytes(i)
            self.pieces.append(piece)
            lead[i] = next((k for k, b in enumerate(piece) if b not in _DIGITS), len(piece))
            if tokenizer.token_attr(i) & TokenAttr.CONTROL:
                piece = b"\xff" + piece
            tokens.append(piece)
        self.leading_digits = torch.from_numpy(lead)  # digits each token starts with
        self.limits = llg.LLParserLimits(verbose_errors=False)

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
                grammar = llg.LLMatcher.grammar_from_json_schema(json.dumps(source), overrides=JSON_OPTIONS)
            elif kind in ("grammar", "regex"):
                grammar = llg.grammar_from(kind, source)
            else:
                raise GrammarError(f"unknown grammar kind {kind!r}")
        except (ValueError, TypeError) as e:
            raise GrammarError(f"invalid {kind}: {e}") from None
        error = llg.LLMatcher.validate_grammar(grammar, self.lltok, limits=self.limits)
        if error:
            raise GrammarError(f"invalid {kind}: {error}")
        return grammar


class Constraint:
    """One sequence's grammar state; json_bounds: JSON output whose numbers are bounded (MAX_DIGITS)."""

    def __init__(self, vocab: Vocabulary, grammar: str, json_bounds: bool = False):
        llg = _llguidance()
        self.vocab, self.json_bounds = vocab, json_bounds
        self.matcher = llg.LLMatcher(vocab.lltok, grammar, log_level=0, limits=vocab.limits)
        self.in_string = self.escaped = False
        self.digit_run = 0  # digits at the end of the output, outside strings
        self._check()

    def _check(self) -> None:
        if self.matcher.is_error():
            raise GrammarError(f"grammar: {self.matcher.get_error().splitlines()[0][:300]}")

    def allowed(self) -> torch.Tensor:
        """Bool [n_vocab]: the tokens the grammar allows next; GrammarError when it allows none
        and is not complete (a grammar whose language is empty)."""
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        self._check()
        mask = torch.from_numpy(np.unpackbits(bits, bitorder="little")[: self.vocab.n_vocab].astype(bool))
        if not mask.any() and not self.matcher.is_accepting():
            raise GrammarError("the grammar allows no token here and is not complete: it matches no string")
        if self.json_bounds and not self.in_string:
            bounded = mask & (self.vocab.leading_digits <= MAX_DIGITS - self.digit_run)
            if bounded.any():
                mask = bounded
        return mask

    def accept(self, token: int) -> None:
        self.matcher.consume_token(int(token))
        self._check()
        if self.json_bounds:
            self._track(self.vocab.pieces[int(token)])

    def _track(self, piece: bytes) -> None:
        """Follow strings and digit runs through the token's bytes (JSON's lexical rules)."""
        for b in piece:
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif b == 0x5C:  # backslash
                    self.escaped = True
                elif b == 0x22:  # closing quote
                    self.in_string = False
            elif b == 0x22:
                self.in_string, self.digit_run = True, 0
            elif b in _DIGITS:
                self.digit_run += 1
            else:
                self.digit_run = 0

    def is_complete(self) -> bool:
        """The grammar is satisfied and allows nothing more."""
        return self.matcher.is_stopped()
