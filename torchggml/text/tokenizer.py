"""Tokenizer built from a GGUF file's ``tokenizer.ggml.*`` metadata.

It reproduces llama.cpp's vocabulary code (``src/llama-vocab.cpp``): the same token
ids for the same text, the same pieces and the same detokenized text. This module does the
parts around the vocabulary model (special-token splitting, BOS/EOS/SEP, pieces, clean-up
of spaces); ``tokenizer_models`` has the models and ``tokenizer_pre`` the BPE regex splits.

Supported ``tokenizer.ggml.model`` values (llama_vocab_type):

- ``"llama"`` (SPM): SentencePiece-style BPE driven by token scores.
- ``"gpt2"``, ``"gemma4"``, ``"whitespace"`` (BPE): ranked merges behind the regex splits
  llama.cpp defines for ``tokenizer.ggml.pre`` (every name llama.cpp knows).
- ``"bert"`` (WPM): WordPiece, ``"t5"`` (UGM): Unigram, ``"rwkv"``: greedy byte matching.
- ``"none"`` / ``"no_vocab"``: a model without a tokenizer; only ``n_vocab`` is known and
  tokenizing raises.

The model is built on first use: a vocabulary whose pre-tokenizer is unknown still loads
(ids, pieces, end-of-generation tokens work) and says which pre-tokenizer and file when text
has to be tokenized.
"""
from __future__ import annotations

import codecs
import os
import re
from enum import IntEnum, IntFlag
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from .tokenizer_models import (SPACE_MARK, BpeEncoder, RwkvEncoder, UgmEncoder, spm_encoder,
                               WpmEncoder, unescape_rwkv)
from .tokenizer_pre import PRE_TOKENIZERS, PreTokenizer
from .vocab_types import VOCAB_TYPES

__all__ = [
    "Tokenizer",
    "TokenizerError",
    "TokenType",
    "TokenAttr",
    "StreamDecoder",
    "PRE_TOKENIZERS",
    "VOCAB_TYPES",
]


class TokenizerError(ValueError):
    """Bad tokenizer metadata, or an operation the vocabulary cannot do."""


class TokenType(IntEnum):
    """``tokenizer.ggml.token_type`` values (llama_token_type)."""
    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


class TokenAttr(IntFlag):
    """llama_token_attr: per-token flags derived from the token type."""
    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    NORMALIZED = 1 << 6
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8


_ATTR_OF_TYPE = {
    TokenType.UNDEFINED: TokenAttr.UNDEFINED,
    TokenType.NORMAL: TokenAttr.NORMAL,
    TokenType.UNKNOWN: TokenAttr.UNKNOWN,
    TokenType.CONTROL: TokenAttr.CONTROL,
    TokenType.USER_DEFINED: TokenAttr.USER_DEFINED,
    TokenType.UNUSED: TokenAttr.UNUSED,
    TokenType.BYTE: TokenAttr.BYTE,
}

# tokens that are rendered verbatim and may be matched as whole special tokens
_SPECIAL_ATTRS = TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN
# tokens that only parse_special=True matches and only special=True renders
_HIDDEN_ATTRS = TokenAttr.CONTROL | TokenAttr.UNKNOWN



def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable bytes map to themselves, the other bytes to
    code points 256, 257, ... in byte order."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in keep}
    extra = (b for b in range(256) if b not in table)
    table.update({b: chr(256 + n) for n, b in enumerate(extra)})
    return table


def _c_strtol_hex(digits: bytes) -> int:
    """C's strtol(digits, NULL, 16), as llama.cpp reads a byte token's "HH" (a malformed one,
    e.g. "<0xZZ>", reads as 0 instead of failing)."""
    s = digits.lstrip(b" \t\n\v\f\r")
    sign = -1 if s[:1] == b"-" else 1
    s = s[1:] if s[:1] in (b"-", b"+") else s
    hex_digits = re.match(rb"[0-9A-Fa-f]*", s).group()
    return sign * int(hex_digits, 16) if hex_digits else 0


_BYTE_TO_UNICODE = _byte_to_unicode()
_UNICODE_TO_BYTE = {c: b for b, c in _BYTE_TO_UNICODE.items()}


# llama.cpp's default special ids per vocabulary type (bos, eos, unk, sep, pad, mask)
_DEFAULT_IDS = {"SPM": dict(bos=1, eos=2, unk=0), "BPE": dict(bos=11, eos=11),
                "WPM": dict(bos=101, unk=100, sep=102, pad=0, mask=103), "UGM": dict(eos=1, unk=2, pad=0),
                "RWKV": {}}
_ID_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "eot": "eot_token_id", "eom": "eom_token_id",
            "unk": "unknown_token_id", "sep": "seperator_token_id", "pad": "padding_token_id",
            "mask": "mask_token_id"}


def _int_or_none(value) -> int | None:
    return None if value is None else int(value)


# ---------------------------------------------------------------------------------------
# the tokenizer
# ---------------------------------------------------------------------------------------

# token texts by which llama.cpp finds EOT, EOM and the FIM tokens that end generation
# (first match in this order wins), and the texts of all end-of-generation tokens
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>",
              "<end_of_utterance>")
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_END_TOKENS = {  # metadata key -> texts
    "fim_pad_token_id": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep_token_id": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep_token_id": ("<|file_sep|>",),
}
# the fill-in-the-middle tokens that do not end generation: metadata keys (the deprecated one
# second) -> texts, as llama.cpp finds them
_FIM_TOKENS = {
    "pre": (("fim_pre_token_id", "prefix_token_id"), ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
            "<\uff5cfim\u2581begin\uff5c>", "<PRE>", "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>")),
    "suf": (("fim_suf_token_id", "suffix_token_id"), ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
            "<\uff5cfim\u2581hole\uff5c>", "<SUF>", "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>")),
    "mid": (("fim_mid_token_id", "middle_token_id"), ("<|fim_middle|>", "<fim-middle>", "<fim_middle>",
            "<\uff5cfim\u2581end\uff5c>", "<MID>", "\u2581<MID>", "<|code_middle|>", "<|middle|>")),
}
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
})


class Tokenizer:
    """A llama.cpp-compatible tokenizer. Build it with :meth:`from_gguf` or
    :meth:`from_metadata`.

    Attributes: ``model`` (tokenizer.ggml.model), ``vocab_type`` (SPM, BPE, WPM, UGM, RWKV or
    NONE), ``pre`` (the PreTokenizer or None), ``n_vocab``, ``bos_id``, ``eos_id``, ``eot_id``,
    ``eom_id``, ``unk_id``, ``sep_id``, ``pad_id``, ``mask_id`` (None where absent),
    ``add_bos``, ``add_eos``, ``add_sep``, ``add_space_prefix``, ``clean_spaces`` (detokenize
    cleans " ," etc.), ``eog_ids``, ``fim_ids`` (the fill-in-the-middle tokens by name: pre, suf,
    mid, pad, rep, sep; None where absent), ``chat_template`` (tokenizer.chat_template or None).
    """

    def __init__(self, metadata: Mapping[str, Any], source: str = "metadata"):
        self.source = source
        self.model = str(metadata.get("tokenizer.ggml.model", ""))
        if not self.model:
            raise TokenizerError(f"{source}: metadata has no 'tokenizer.ggml.model'")
        if self.model not in VOCAB_TYPES:
            raise TokenizerError(f"{source}: tokenizer.ggml.model {self.model!r} is not supported "
                                 f"(supported: {sorted(VOCAB_TYPES)})")
        self.vocab_type = VOCAB_TYPES[self.model]
        self.pre: PreTokenizer | None = None
        self.pre_name: str | None = None
        self.bos_id = self.eos_id = self.eot_id = self.eom_id = None
        self.unk_id = self.sep_id = self.pad_id = self.mask_id = None
        self.add_bos = self.add_eos = self.add_sep = self.add_space_prefix = self.clean_spaces = False
        self.escape_whitespaces = False
        self.eog_ids: frozenset[int] = frozenset()
        self.fim_ids: dict[str, int | None] = {}  # pre, suf, mid, pad, rep, sep: the FIM tokens (None: absent)
        self.chat_template = metadata.get("tokenizer.chat_template")
        self._metadata = metadata
        self._encoder = None
        self._unsupported: str | None = None
        if self.vocab_type == "NONE":
            arch = metadata.get("general.architecture")
            self.n_vocab = int(metadata.get(f"{arch}.vocab_size", 0))
            self._texts: list[str] = []
            return
        self._load_vocab(metadata)
        self._check_byte_tokens(source)
        self._load_flags(metadata)
        self._load_special_ids(metadata)
        self._detect_end_of_generation(metadata)
        self._set_strip_attrs(metadata)
        self._pieces: list[bytes | None] = [None] * self.n_vocab
        self._special_order = self._special_tokens_longest_first()

    def _check_byte_tokens(self, source: str) -> None:
        """Byte tokens are "<0xHH>": llama.cpp renders every token while loading and fails on
        one shorter than 3 bytes; a WordPiece vocabulary cannot have them at all (it aborts)."""
        byte_ids = ((self._attrs & TokenAttr.BYTE) != 0).nonzero()[0]
        if self.vocab_type == "WPM" and len(byte_ids):
            first = int(byte_ids[0])
            raise TokenizerError(f"{source}: token {first} ({self._texts[first]!r}) is a byte token, which a "
                                 f"WordPiece vocabulary (tokenizer.ggml.model {self.model!r}) cannot have")
        if self.vocab_type in ("SPM", "UGM", "BPE"):
            for i in byte_ids:
                if len(self._texts[i].encode()) < 3:
                    raise TokenizerError(f"{source}: token {int(i)} ({self._texts[i]!r}) is a byte token but not "
                                         "of the form <0xHH>")

    # -- construction --------------------------------------------------------------------

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], source: str = "metadata") -> "Tokenizer":
        """From a dict of GGUF keys (``tokenizer.ggml.tokens``, ``.scores``,
        ``.token_type``, ``.merges``, ``.model``, ``.pre``, ``.bos_token_id`` ...)."""
        if not isinstance(metadata, Mapping):
            raise TypeError(f"metadata must be a mapping of GGUF keys, got {type(metadata).__name__}")
        return cls(metadata, source)

    @classmethod
    def from_gguf(cls, path_or_file) -> "Tokenizer":
        """From a GGUF file path or a file opened with ``torchggml.gguf.loader.open_gguf``."""
        from ..gguf.loader import GGUFFile, open_gguf
        if isinstance(path_or_file, (str, os.PathLike)):
            path_or_file = open_gguf(path_or_file)
        if not isinstance(path_or_file, GGUFFile):
            raise TypeError("from_gguf takes a path or a GGUFFile (torchggml.gguf.loader.open_gguf), "
                            f"got {type(path_or_file).__name__}")
        return cls(path_or_file.metadata, path_or_file.path)

    @property
    def is_spm(self) -> bool:
        return self.vocab_type == "SPM"

    def _load_vocab(self, metadata: Mapping[str, Any]) -> None:
        tokens = metadata.get("tokenizer.ggml.tokens")
        if tokens is None or len(tokens) == 0:
            raise TokenizerError(f"{self.source}: metadata has no 'tokenizer.ggml.tokens'")
        # llama.cpp renames empty tokens so that every text is a distinct key
        self._texts = [str(t) if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self.n_vocab = len(self._texts)
        self._ids: dict[str, int] = dict(zip(self._texts, range(self.n_vocab)))
        if len(self._ids) < self.n_vocab:  # a duplicate: name its first two ids
            first: dict[str, int] = {}
            for i, text in enumerate(self._texts):
                if first.setdefault(text, i) != i:
                    raise TokenizerError(f"{self.source}: duplicate token in vocabulary: {text!r} has ids "
                                         f"{first[text]} and {i}")
        self._scores = self._per_token_array(metadata, "tokenizer.ggml.scores", np.float32, 0.0)
        types = self._per_token_array(metadata, "tokenizer.ggml.token_type", np.int32,
                                      int(TokenType.NORMAL))
        attr_of_type = np.array([_ATTR_OF_TYPE[t] for t in TokenType], dtype=np.int32)
        known = (types >= 0) & (types < len(TokenType))
        # an unknown token type reads as UNDEFINED, as in llama.cpp
        self._attrs = np.where(known, attr_of_type[np.where(known, types, 0)], 0).astype(np.int32)

    def _per_token_array(self, metadata, key: str, dtype, default) -> np.ndarray:
        values = metadata.get(key)
        if values is None:
            return np.full(self.n_vocab, default, dtype=dtype)
        arr = np.asarray(values, dtype=dtype)
        if arr.ndim != 1 or arr.shape[0] < self.n_vocab:
            raise TokenizerError(f"{self.source}: {key} has shape {arr.shape}, expected ({self.n_vocab},)")
        return arr[:self.n_vocab]

    def _load_flags(self, metadata: Mapping[str, Any]) -> None:
        """llama.cpp's defaults per vocabulary type and pre-tokenizer, then the metadata's."""
        vt = self.vocab_type
        if vt == "SPM":
            self.add_space_prefix = self.add_bos = True
        elif vt == "WPM":
            self.add_bos = self.add_sep = self.clean_spaces = True
        elif vt == "UGM":
            self.add_eos = True
        elif vt == "BPE":
            name = "gemma4" if self.model == "gemma4" else str(metadata.get("tokenizer.ggml.pre") or "default")
            self.pre_name = name
            self.pre = PRE_TOKENIZERS.get(name)
            if self.pre is None:  # the vocabulary still loads: ids, pieces and EOG work
                self._unsupported = (f"{self.source}: tokenizer.ggml.pre {name!r} is not supported, so "
                                     "text cannot be tokenized (token ids work; supported: "
                                     f"{', '.join(sorted(PRE_TOKENIZERS))})")
            else:
                self.add_bos, self.clean_spaces = self.pre.add_bos, self.pre.clean_spaces
                self.add_sep, self.escape_whitespaces = self.pre.add_sep, self.pre.escape_whitespaces
        if vt in ("SPM", "UGM"):
            self.escape_whitespaces = True
        self.add_space_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", self.add_space_prefix))
        self.remove_extra_whitespaces = bool(metadata.get("tokenizer.ggml.remove_extra_whitespaces", False))
        self.add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", self.add_bos))
        self.add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", self.add_eos))
        self.add_sep = bool(metadata.get("tokenizer.ggml.add_sep_token", self.add_sep))
        if self.pre is not None and self.pre.name in ("gemma4", "granite-embed-multi-311m"):
            self.add_bos = True  # llama.cpp overrides add_bos for Gemma 4
        self.lowercase = bool(metadata.get("tokenizer.ggml.normalizer.lowercase", True))
        self.strip_accents = bool(metadata.get("tokenizer.ggml.normalizer.strip_accents", self.lowercase))

    def _load_special_ids(self, metadata: Mapping[str, Any]) -> None:
        # llama.cpp's defaults, dropped when outside the vocabulary, then the metadata's ids
        defaults = dict(_DEFAULT_IDS[self.vocab_type])
        if self.pre is not None and self.pre.no_bos:
            defaults.pop("bos", None)
        for name, key in _ID_KEYS.items():
            value = defaults.get(name)
            if value is not None and value >= self.n_vocab:
                value = None
            given = _int_or_none(metadata.get(f"tokenizer.ggml.{key}"))
            if given is not None and 0 <= given < self.n_vocab:
                value = given
            setattr(self, f"{name}_id", value)
        for flag, name in (("add_bos", "bos"), ("add_eos", "eos")):
            if getattr(self, flag) and getattr(self, f"{name}_id") is None:
                raise TokenizerError(f"{self.source}: tokenizer.ggml.{flag}_token is true, but there is "
                                     f"no {name.upper()} token")

    def _first_token(self, texts: Iterable[str]) -> int | None:
        return next((self._ids[t] for t in texts if t in self._ids), None)

    def _detect_end_of_generation(self, metadata: Mapping[str, Any]) -> None:
        """EOT/EOM by their text when the metadata has none; EOG = EOS, EOT, EOM, the FIM
        pad/repo/sep tokens and every token whose text ends a turn. Tokens found by their
        text become CONTROL tokens, as in llama.cpp (with its gpt-oss and gemma4 fixes)."""
        found = set()
        if self.eot_id is None:
            self.eot_id = self._first_token(_EOT_TEXTS)
            found.add(self.eot_id)
        if self.eom_id is None:
            self.eom_id = self._first_token(_EOM_TEXTS)
            found.add(self.eom_id)
        eog = {self._ids[t] for t in _EOG_TEXTS if t in self._ids}
        for key, texts in _FIM_END_TOKENS.items():
            fim_id = _int_or_none(metadata.get(f"tokenizer.ggml.{key}"))
            if fim_id is None or not 0 <= fim_id < self.n_vocab:
                fim_id = self._first_token(texts)
                found.add(fim_id)
            eog.add(fim_id)
            self.fim_ids[key.split("_")[1]] = fim_id
        for name, (keys, texts) in _FIM_TOKENS.items():
            given = [_int_or_none(metadata.get(f"tokenizer.ggml.{key}")) for key in keys]
            fim_id = next((i for i in given if i is not None and 0 <= i < self.n_vocab), None)
            if fim_id is None:
                fim_id = self._first_token(texts)
                found.add(fim_id)
            self.fim_ids[name] = fim_id
        for token_id in (found | eog) - {None}:
            self._attrs[token_id] |= TokenAttr.CONTROL
        for text in _ALWAYS_RENDERED:  # gpt-oss's channel tokens
            if text in self._ids:
                self._attrs[self._ids[text]] = TokenAttr.USER_DEFINED
        self._attrs[[i for i, t in enumerate(self._texts) if "unused" in t
                     and self._attrs[i] & TokenAttr.CONTROL]] |= TokenAttr.UNUSED
        eog.update((self.eos_id, self.eot_id, self.eom_id))
        eog.discard(None)
        texts = {self._texts[i]: i for i in eog}
        if "<|end|>" in texts and ({"<|return|>", "<|call|>"} <= texts.keys()
                                   or {"<|calls|>", "<|flush|>"} <= texts.keys()):
            eog.discard(texts["<|end|>"])  # o200k_harmony / solar-open: <|end|> does not end
            self._attrs[texts["<|end|>"]] = TokenAttr.USER_DEFINED
        if "<|tool_response>" in texts and "</s>" in texts:
            eog.discard(texts["</s>"])  # gemma4
            self._attrs[texts["</s>"]] = TokenAttr.NORMAL
        self.eog_ids = frozenset(eog)

    def _set_strip_attrs(self, metadata: Mapping[str, Any]) -> None:
        """llama.cpp's per-model LSTRIP/RSTRIP: spaces next to these special tokens are
        dropped when the token is matched in text."""
        pre = str(metadata.get("tokenizer.ggml.pre") or "")
        arch = str(metadata.get("general.architecture") or "")
        name = str(metadata.get("general.name") or "").lower()
        if any(k in pre for k in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or \
                any(k in arch for k in ("nomic-bert-moe", "jina-bert-v3")):
            if "<mask>" in self._ids:
                self._attrs[self._ids["<mask>"]] |= TokenAttr.LSTRIP
        elif "phi-3" in name or "phi3" in name:
            special = self._attrs & _SPECIAL_ATTRS != 0
            self._attrs[special] |= TokenAttr.RSTRIP
            for text, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
                if text in self._ids:
                    i = self._ids[text]
                    self._attrs[i] = self._attrs[i] | TokenAttr.RSTRIP if on else self._attrs[i] & ~TokenAttr.RSTRIP
        elif "modern-bert" in name and "[MASK]" in self._ids:
            self._attrs[self._ids["[MASK]"]] |= TokenAttr.LSTRIP

    def _build_encoder(self):
        """The vocabulary model, built on first use (seconds for large vocabularies)."""
        md, vt = self._metadata, self.vocab_type
        try:
            if vt == "SPM":
                return spm_encoder(self._texts, self._ids, self._scores, self.unk_id, self.source)
            if vt == "BPE":
                merges = md.get("tokenizer.ggml.merges")
                if merges is None:
                    raise TokenizerError(f"{self.source}: tokenizer.ggml.model {self.model!r} needs "
                                         "'tokenizer.ggml.merges'")
                return BpeEncoder(self._ids, merges, self.pre, drop_whitespace=self.model == "whitespace")
            if vt == "WPM":
                unk = self._texts[self.unk_id] if self.unk_id is not None else None
                return WpmEncoder(self._ids, unk, self.lowercase, self.strip_accents)
            if vt == "UGM":
                charsmap = md.get("tokenizer.ggml.precompiled_charsmap")
                charsmap = bytes(np.asarray(charsmap, dtype=np.uint8)) if charsmap is not None else b""
                has = lambda attr: (self._attrs & attr) != 0  # noqa: E731
                return UgmEncoder(self._texts, self._scores, has(TokenAttr.NORMAL), has(TokenAttr.USER_DEFINED),
                                  has(TokenAttr.NORMAL | TokenAttr.USER_DEFINED | TokenAttr.UNUSED),
                                  self.unk_id, charsmap, self.add_space_prefix, self.remove_extra_whitespaces)
            return RwkvEncoder(self._texts, self.unk_id, self.source)
        except ValueError as e:
            if isinstance(e, TokenizerError):
                raise
            message = str(e)
            raise TokenizerError(message if message.startswith(self.source) else f"{self.source}: {message}") from None

    def _special_tokens_longest_first(self) -> list[int]:
        special = np.nonzero(self._attrs & _SPECIAL_ATTRS)[0].tolist()
        return sorted(special, key=lambda i: -len(self._texts[i].encode()))

    # -- tokenize ------------------------------------------------------------------------

    def _require_vocab(self, what: str) -> None:
        if self.vocab_type == "NONE":
            raise TokenizerError(f"cannot {what}: {self.source} has no tokenizer "
                                 f"(tokenizer.ggml.model = {self.model!r}); use token ids")

    def _split_special(self, text: str, parse_special: bool) -> list[str | int]:
        """Cut ``text`` at special tokens, longest token first (llama.cpp's
        tokenizer_st_partition): returns text fragments and token ids. USER_DEFINED tokens
        are always matched, CONTROL/UNKNOWN ones only with parse_special."""
        fragments: list[str | int] = [text] if text else []
        for token_id in self._special_order:
            attr = self._attrs[token_id]
            if not parse_special and attr & _HIDDEN_ATTRS:
                continue
            token = self._texts[token_id]
            fragments = [piece for fragment in fragments
                         for piece in _cut_at_token(fragment, token, token_id, attr)]
        return fragments

    @property
    def encoder(self):
        """The vocabulary model (SpmEncoder, BpeEncoder, ...), built on first use."""
        self._require_vocab("tokenize")
        if self._unsupported:
            raise TokenizerError(self._unsupported)
        if self._encoder is None:
            self._encoder = self._build_encoder()
        return self._encoder

    def _encode_text(self, text: str) -> list[int]:
        if self.is_spm and self.add_space_prefix:
            text = " " + text  # every fragment starts the text or follows a special token
        return self.encoder.encode(text)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of ``text``, as llama.cpp's ``llama_tokenize``. ``add_special`` adds
        BOS/EOS where the model asks for them (``add_bos``/``add_eos``); ``parse_special``
        turns the text of CONTROL tokens (e.g. ``<|im_start|>``) into those tokens."""
        if not isinstance(text, str):
            raise TypeError(f"tokenize expects str, got {type(text).__name__}")
        self._require_vocab("tokenize")
        ids: list[int] = []
        wpm = self.vocab_type == "WPM"  # BERT: [CLS] text [SEP]
        if add_special and (self.add_bos or wpm) and self.vocab_type != "RWKV":
            ids.append(self.bos_id)
        for fragment in self._split_special(text, parse_special):
            if isinstance(fragment, int):
                ids.append(fragment)
            else:
                ids.extend(self._encode_text(fragment))
        if add_special and wpm:
            ids.append(self.sep_id)
        elif add_special and self.add_eos and self.vocab_type != "RWKV":
            ids.append(self.eos_id)
        return ids

    # -- pieces and detokenize -----------------------------------------------------------

    def _check_id(self, token_id) -> int:
        if not isinstance(token_id, (int, np.integer)) or isinstance(token_id, bool):
            raise TypeError(f"token id must be an int, got {type(token_id).__name__}")
        if not 0 <= token_id < self.n_vocab:
            raise TokenizerError(f"token id {token_id} is outside the vocabulary [0, {self.n_vocab})")
        return int(token_id)

    def _piece(self, token_id: int) -> bytes:
        """The bytes a token stands for when special tokens are rendered (cached)."""
        piece = self._pieces[token_id]
        if piece is None:
            piece = self._pieces[token_id] = self._make_piece(token_id)
        return piece

    def _make_piece(self, token_id: int) -> bytes:
        text, attr = self._texts[token_id], self._attrs[token_id]
        if self.vocab_type == "RWKV":
            return unescape_rwkv(text)
        if attr & _SPECIAL_ATTRS:
            return text.encode()
        if attr & TokenAttr.NORMAL:
            if self.escape_whitespaces or self.vocab_type == "WPM":
                return text.replace(SPACE_MARK, " ").encode()
            # byte-level alphabet back to bytes; llama.cpp marks a character outside it
            return b"".join(bytes([_UNICODE_TO_BYTE[c]]) if c in _UNICODE_TO_BYTE
                            else f"[UNK_BYTE_0x{c.encode().hex()}{text}]".encode() for c in text)
        if attr & TokenAttr.BYTE:
            return bytes([_c_strtol_hex(text.encode()[3:5]) & 0xFF])  # "<0xAB>"
        return b""  # unused / undefined tokens render as nothing

    def token_to_piece_bytes(self, token_id: int, special: bool = True) -> bytes:
        """The raw bytes of one token (may be part of a UTF-8 character). CONTROL and
        UNKNOWN tokens give their text when ``special`` and nothing otherwise."""
        self._require_vocab("render tokens")
        token_id = self._check_id(token_id)
        if not special and self._attrs[token_id] & _HIDDEN_ATTRS:
            return b""
        return self._piece(token_id)

    def token_to_piece(self, token_id: int, special: bool = True) -> str:
        """One token as text; an incomplete UTF-8 sequence shows as U+FFFD (use
        :meth:`stream_decoder` to join pieces of a character)."""
        return self.token_to_piece_bytes(token_id, special).decode("utf-8", errors="replace")

    def token_text(self, token_id: int) -> str:
        """The token's vocabulary entry, as stored in the GGUF."""
        self._require_vocab("look up tokens")
        return self._texts[self._check_id(token_id)]

    def text_to_token(self, text: str) -> int | None:
        """The id of the token whose vocabulary entry is ``text``, or None."""
        self._require_vocab("look up tokens")
        return self._ids.get(text)

    def token_attr(self, token_id: int) -> TokenAttr:
        self._require_vocab("look up tokens")
        return TokenAttr(int(self._attrs[self._check_id(token_id)]))

    def detokenize(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of a token sequence, as llama.cpp's ``llama_detokenize(remove_special=
        skip_special, unparse_special=not skip_special)``: the space SentencePiece adds
        before the first token is removed; vocabularies with ``clean_spaces`` (GPT-2
        style) turn " ," " 's" ... into "," "'s"."""
        self._require_vocab("detokenize")
        ids = [self._check_id(i) for i in ids]
        strip_space = self.add_space_prefix
        if skip_special and self.add_bos and ids and ids[0] == self.bos_id:
            strip_space, ids = False, ids[1:]
        if skip_special and self.add_eos and ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        pieces = [self.token_to_piece_bytes(i, special=not skip_special) for i in ids]
        if strip_space and pieces and pieces[0].startswith(b" "):
            pieces[0] = pieces[0][1:]  # only the first token's piece, as llama.cpp's lstrip
        text = b"".join(pieces)
        if self.clean_spaces:
            text = _clean_up_spaces(text)
        return text.decode("utf-8", errors="replace")

    def stream_decoder(self, skip_special: bool = False) -> "StreamDecoder":
        """An incremental decoder for generated tokens: ``push(id)`` returns the text of
        the characters completed so far, ``flush()`` the rest."""
        self._require_vocab("decode tokens")
        return StreamDecoder(self, skip_special)

    def decode_stream(self, ids: Iterable[int], skip_special: bool = False) -> Iterator[str]:
        """Yield text as complete characters arrive from ``ids`` (token pieces joined as
        llama.cpp's generation prints them: no space stripping, no clean-up)."""
        decoder = self.stream_decoder(skip_special)
        for token_id in ids:
            text = decoder.push(token_id)
            if text:
                yield text
        rest = decoder.flush()
        if rest:
            yield rest

    # -- queries -------------------------------------------------------------------------

    def is_eog(self, token_id: int) -> bool:
        """True for tokens that end generation (EOS, EOT, EOM, <|im_end|> ...)."""
        return token_id in self.eog_ids

    def __repr__(self) -> str:
        pre = f", pre={self.pre_name!r}" if self.pre_name else ""
        return f"Tokenizer(model={self.model!r}{pre}, n_vocab={self.n_vocab})"


def _cut_at_token(fragment: str | int, token: str, token_id: int, attr: int = 0) -> list[str | int]:
    """A text fragment cut at every occurrence of ``token`` (left to right), the
    occurrences replaced by ``token_id``; token ids pass through. LSTRIP/RSTRIP tokens
    take the ASCII spaces before/after them along (llama.cpp's isspace)."""
    if isinstance(fragment, int) or token not in fragment:
        return [fragment]
    parts = fragment.split(token)
    if attr & TokenAttr.LSTRIP:
        parts[:-1] = [p.rstrip(_ASCII_SPACE) for p in parts[:-1]]
    if attr & TokenAttr.RSTRIP:
        parts[1:] = [p.lstrip(_ASCII_SPACE) for p in parts[1:]]
    pieces: list[str | int] = []
    for k, part in enumerate(parts):
        if k:
            pieces.append(token_id)
        if part:
            pieces.append(part)
    return pieces


_ASCII_SPACE = " \t\n\v\f\r"


class StreamDecoder:
    """Turns a stream of token ids into text, holding back bytes of a UTF-8 character
    until the character is complete (invalid bytes become U+FFFD)."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self._tokenizer = tokenizer
        self._special = not skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._utf8.decode(self._tokenizer.token_to_piece_bytes(token_id, self._special))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


# llama.cpp's clean_spaces passes (HF's clean_up_tokenization_spaces), in order
_SPACE_BEFORE_PUNCT = re.compile(rb" (?=[?!.,])")
_SPACED_APOSTROPHE = re.compile(rb" ' ")
_SPACE_BEFORE_CONTRACTION = re.compile(rb" (?='(?:[sm]|re|ve))")


def _clean_up_spaces(text: bytes) -> bytes:
    """Drop the space in " ?", " !", " .", " ,"; turn " ' " into "'"; drop the space in
    " 's", " 'm", " 're", " 've" (left to right, as llama.cpp's detokenize)."""
    text = _SPACE_BEFORE_PUNCT.sub(b"", text)
    text = _SPACED_APOSTROPHE.sub(b"'", text)
    return _SPACE_BEFORE_CONTRACTION.sub(b"", text)
