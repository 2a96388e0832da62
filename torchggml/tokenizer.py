"""Tokenizer built from a GGUF file's ``tokenizer.ggml.*`` metadata.

It reproduces llama.cpp's vocabulary code (``src/llama-vocab.cpp``): the same token
ids for the same text, the same pieces and the same detokenized text. The merging itself
runs in HuggingFace ``tokenizers``; this module only translates llama.cpp's rules into a
``tokenizers`` pipeline and does the parts around it (special-token splitting, BOS/EOS,
pieces, clean-up of spaces).

Supported ``tokenizer.ggml.model`` values:

- ``"llama"``: SentencePiece-style BPE driven by token scores. llama.cpp merges the
  adjacent pair whose concatenation is the highest-scoring token; we hand
  ``tokenizers`` one merge per (left, right) split of every token, ranked by that token's
  score, which makes its lowest-rank-first BPE the same algorithm. Spaces become "▁",
  each text fragment gets a leading space, unknown characters fall back to ``<0xXX>``.
- ``"gpt2"``: byte-level BPE with ranked merges, preceded by the regex splits that
  llama.cpp defines for ``tokenizer.ggml.pre`` (``Split`` pre-tokenizers + ``ByteLevel``).
- ``"none"`` / ``"no_vocab"``: a model without a tokenizer; only ``n_vocab`` is known and
  tokenizing raises.
"""
from __future__ import annotations

import codecs
import mmap
import os
import re
import struct
from dataclasses import dataclass
from enum import IntEnum, IntFlag
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

__all__ = [
    "Tokenizer",
    "TokenizerError",
    "TokenType",
    "TokenAttr",
    "StreamDecoder",
    "PRE_TOKENIZERS",
    "read_gguf_metadata",
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

_SPACE_MARK = "\u2581"  # "▁", SentencePiece's escaped space


# ---------------------------------------------------------------------------------------
# pre-tokenizers: llama.cpp's regex splits per tokenizer.ggml.pre (llm_tokenizer_bpe)
# ---------------------------------------------------------------------------------------

_GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_REGEX = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
                 r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_REGEX = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
                r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class PreTokenizer:
    """One llama.cpp pre-tokenizer type: regexes applied one after the other (each
    splits the pieces of the previous one, keeping matches and the text between them),
    and the flags llama.cpp sets along with it."""
    name: str
    regexes: tuple[str, ...]
    clean_spaces: bool = True      # detokenize removes " ?", " 's" ... (clean_up_tokenization_spaces)
    ignore_merges: bool = False    # a pre-token that is a whole vocab token is taken as is
    add_bos: bool = False          # default of tokenizer.ggml.add_bos_token

    def hf_pre_tokenizers(self) -> list:
        """The regexes as ``tokenizers`` Split pre-tokenizers (matches and the text
        between them both become pieces, as in llama.cpp's unicode_regex_split)."""
        from tokenizers import Regex, pre_tokenizers
        return [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in self.regexes]

    def split(self, text: str) -> list[str]:
        """The pieces this pre-tokenizer cuts ``text`` into (before byte encoding)."""
        from tokenizers import pre_tokenizers
        pieces = pre_tokenizers.Sequence(self.hf_pre_tokenizers()).pre_tokenize_str(text)
        return [piece for piece, _ in pieces]


_PRE_TYPES = {
    "default": PreTokenizer("default", (r"[\p{P}\$\+<=>\^~\|]+", _GPT2_REGEX, r"\p{N}+",
                                        r"[0-9][0-9][0-9]")),
    "llama3": PreTokenizer("llama3", (_LLAMA3_REGEX,), ignore_merges=True, add_bos=True),
    "dbrx": PreTokenizer("dbrx", (_LLAMA3_REGEX,)),
    "qwen2": PreTokenizer("qwen2", (_QWEN2_REGEX,), clean_spaces=False),
    "stablelm2": PreTokenizer("stablelm2", (_QWEN2_REGEX,)),
    "gpt2": PreTokenizer("gpt2", (_GPT2_REGEX,)),
    "starcoder": PreTokenizer("starcoder", (r"\p{N}", _GPT2_REGEX)),
    "starcoder-keep-spaces": PreTokenizer("starcoder-keep-spaces", (r"\p{N}", _GPT2_REGEX),
                                          clean_spaces=False),
    "falcon": PreTokenizer("falcon", (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2_REGEX, r"[0-9][0-9][0-9]")),
}

#: tokenizer.ggml.pre -> PreTokenizer, as llama.cpp's llama_vocab::impl::load maps them
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": _PRE_TYPES["default"],
    **{name: _PRE_TYPES["llama3"] for name in ("llama3", "llama-v3", "llama-bpe", "falcon3",
                                                "falcon-h1", "pixtral", "midm-2.0", "lfm2")},
    "dbrx": _PRE_TYPES["dbrx"],
    "smaug-bpe": _PRE_TYPES["dbrx"],
    **{name: _PRE_TYPES["qwen2"] for name in ("qwen2", "deepseek-r1-qwen", "kormo")},
    **{name: _PRE_TYPES["stablelm2"] for name in ("stablelm2", "megrez")},
    **{name: _PRE_TYPES["gpt2"] for name in ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat",
                                              "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
                                              "modern-bert", "mpt", "olmo", "jais", "exaone4")},
    **{name: _PRE_TYPES["starcoder"] for name in ("starcoder", "refact", "codeshell", "exaone",
                                                   "minerva-7b")},
    **{name: _PRE_TYPES["starcoder-keep-spaces"] for name in ("command-r", "smollm")},
    "falcon": _PRE_TYPES["falcon"],
}


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable bytes map to themselves, the other bytes to
    code points 256, 257, ... in byte order."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in keep}
    extra = (b for b in range(256) if b not in table)
    table.update({b: chr(256 + n) for n, b in enumerate(extra)})
    return table


_BYTE_TO_UNICODE = _byte_to_unicode()
_UNICODE_TO_BYTE = {c: b for b, c in _BYTE_TO_UNICODE.items()}


# ---------------------------------------------------------------------------------------
# metadata
# ---------------------------------------------------------------------------------------

_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?",
                 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


class _GGUFCursor:
    """Sequential reader over the key/value section of a GGUF file."""

    def __init__(self, buf, offset: int, endian: str):
        self.buf, self.pos, self.endian = buf, offset, endian

    def scalar(self, code: str):
        (value,) = struct.unpack_from(self.endian + code, self.buf, self.pos)
        self.pos += struct.calcsize(code)
        return value

    def string(self) -> str:
        n = self.scalar("Q")
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int):
        if vtype == _GGUF_STRING:
            return self.string()
        if vtype == _GGUF_ARRAY:
            etype, count = self.scalar("I"), self.scalar("Q")
            if etype == _GGUF_STRING:
                return [self.string() for _ in range(count)]
            if etype not in _GGUF_SCALARS:
                raise TokenizerError(f"GGUF array of unsupported element type {etype}")
            dtype = np.dtype(_GGUF_SCALARS[etype]).newbyteorder(self.endian)
            arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
            self.pos += dtype.itemsize * count
            return arr
        if vtype not in _GGUF_SCALARS:
            raise TokenizerError(f"GGUF value of unsupported type {vtype}")
        return self.scalar(_GGUF_SCALARS[vtype])


def read_gguf_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """All key/value pairs of a GGUF file (strings, numbers, lists of strings, numpy
    arrays). A fast reader for the tokenizer: ``gguf.GGUFReader`` builds one numpy view
    per string and needs seconds for a 150k-token vocabulary."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        if mm[:4] != b"GGUF":
            raise TokenizerError(f"{os.fspath(path)!r} is not a GGUF file (magic {mm[:4]!r})")
        (version,) = struct.unpack_from("<I", mm, 4)
        endian = ">" if version & 0xFFFF == 0 else "<"  # a big-endian file reads as 0xVV000000
        cur = _GGUFCursor(mm, 8, endian)
        version = struct.unpack_from(endian + "I", mm, 4)[0]
        if version < 2:
            raise TokenizerError(f"{os.fspath(path)!r}: GGUF version {version} is not supported")
        cur.scalar("Q")  # tensor count
        n_kv = cur.scalar("Q")
        metadata = {}
        for _ in range(n_kv):
            key = cur.string()
            metadata[key] = cur.value(cur.scalar("I"))
        return metadata


def _reader_field_value(field) -> Any:
    """The value of one ``gguf.GGUFReader`` field as a plain Python/numpy value."""
    import gguf

    vtype = field.types[0]
    if vtype == gguf.GGUFValueType.ARRAY:
        if field.types[-1] == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
        return np.array([field.parts[i][0] for i in field.data])
    if vtype == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")
    return field.parts[field.data[0]][0].item()


def _metadata_from_reader(reader) -> dict[str, Any]:
    wanted = ("tokenizer.", "general.architecture")
    return {name: _reader_field_value(field) for name, field in reader.fields.items()
            if name.startswith(wanted) or name.endswith(".vocab_size")}


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
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
})


class Tokenizer:
    """A llama.cpp-compatible tokenizer. Build it with :meth:`from_gguf` or
    :meth:`from_metadata`.

    Attributes: ``model`` (tokenizer.ggml.model), ``pre`` (the PreTokenizer or None),
    ``n_vocab``, ``bos_id``, ``eos_id``, ``eot_id``, ``eom_id``, ``unk_id``, ``pad_id``
    (None where absent), ``add_bos``, ``add_eos``, ``add_space_prefix``,
    ``clean_spaces`` (detokenize cleans " ," etc.), ``eog_ids``.
    """

    def __init__(self, metadata: Mapping[str, Any]):
        self.model = str(metadata.get("tokenizer.ggml.model", ""))
        if not self.model:
            raise TokenizerError("metadata has no 'tokenizer.ggml.model'")
        self.pre: PreTokenizer | None = None
        self.bos_id = self.eos_id = self.eot_id = self.eom_id = None
        self.unk_id = self.pad_id = None
        self.add_bos = self.add_eos = self.add_space_prefix = self.clean_spaces = False
        self.eog_ids: frozenset[int] = frozenset()
        self._hf = None
        if self.model in ("none", "no_vocab"):
            arch = metadata.get("general.architecture")
            self.n_vocab = int(metadata.get(f"{arch}.vocab_size", 0))
            self._texts: list[str] = []
            return
        if self.model not in ("llama", "gpt2"):
            raise TokenizerError(f"tokenizer.ggml.model {self.model!r} is not supported "
                                 "(supported: 'llama', 'gpt2', 'none')")
        self._load_vocab(metadata)
        self._load_flags(metadata)
        self._load_special_ids(metadata)
        self._detect_end_of_generation(metadata)
        self._hf = self._build_spm() if self.is_spm else self._build_bpe(metadata)
        self._pieces: list[bytes | None] = [None] * self.n_vocab
        self._special_order = self._special_tokens_longest_first()

    # -- construction --------------------------------------------------------------------

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> "Tokenizer":
        """From a dict of GGUF keys (``tokenizer.ggml.tokens``, ``.scores``,
        ``.token_type``, ``.merges``, ``.model``, ``.pre``, ``.bos_token_id`` ...)."""
        if not isinstance(metadata, Mapping):
            raise TypeError(f"metadata must be a mapping of GGUF keys, got {type(metadata).__name__}")
        return cls(metadata)

    @classmethod
    def from_gguf(cls, path_or_reader) -> "Tokenizer":
        """From a GGUF file path or an open ``gguf.GGUFReader``."""
        if isinstance(path_or_reader, (str, os.PathLike)):
            return cls(read_gguf_metadata(path_or_reader))
        if hasattr(path_or_reader, "fields"):
            return cls(_metadata_from_reader(path_or_reader))
        raise TypeError("from_gguf takes a path or a gguf.GGUFReader, "
                        f"got {type(path_or_reader).__name__}")

    @property
    def is_spm(self) -> bool:
        return self.model == "llama"

    def _load_vocab(self, metadata: Mapping[str, Any]) -> None:
        tokens = metadata.get("tokenizer.ggml.tokens")
        if tokens is None or len(tokens) == 0:
            raise TokenizerError("metadata has no 'tokenizer.ggml.tokens'")
        # llama.cpp renames empty tokens so that every text is a distinct key
        self._texts = [str(t) if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self.n_vocab = len(self._texts)
        self._ids: dict[str, int] = {}
        for i, text in enumerate(self._texts):
            if self._ids.setdefault(text, i) != i:
                raise TokenizerError(f"duplicate token in vocabulary: {text!r} has ids "
                                     f"{self._ids[text]} and {i}")
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
            raise TokenizerError(f"{key} has shape {arr.shape}, expected ({self.n_vocab},)")
        return arr[:self.n_vocab]

    def _load_flags(self, metadata: Mapping[str, Any]) -> None:
        if self.is_spm:
            self.add_space_prefix, self.add_bos = True, True
            self.clean_spaces = False
        else:
            pre_name = str(metadata.get("tokenizer.ggml.pre") or "default")
            if pre_name not in PRE_TOKENIZERS:
                raise TokenizerError(f"tokenizer.ggml.pre {pre_name!r} is not supported "
                                     f"(supported: {sorted(PRE_TOKENIZERS)})")
            self.pre = PRE_TOKENIZERS[pre_name]
            self.add_bos, self.clean_spaces = self.pre.add_bos, self.pre.clean_spaces
        self.add_space_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix",
                                                  self.add_space_prefix))
        self.add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", self.add_bos))
        self.add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", self.add_eos))

    def _load_special_ids(self, metadata: Mapping[str, Any]) -> None:
        # llama.cpp's defaults, dropped when outside the vocabulary, then the metadata's ids
        defaults = {"bos": 1, "eos": 2, "unk": 0} if self.is_spm else {"bos": 11, "eos": 11}
        keys = {"bos": "bos_token_id", "eos": "eos_token_id", "eot": "eot_token_id",
                "eom": "eom_token_id", "unk": "unknown_token_id", "pad": "padding_token_id"}
        for name, key in keys.items():
            value = defaults.get(name)
            if value is not None and value >= self.n_vocab:
                value = None
            given = _int_or_none(metadata.get(f"tokenizer.ggml.{key}"))
            if given is not None and 0 <= given < self.n_vocab:
                value = given
            setattr(self, f"{name}_id", value)
        if self.add_bos and self.bos_id is None:
            raise TokenizerError("tokenizer.ggml.add_bos_token is true, but there is no BOS token")
        if self.add_eos and self.eos_id is None:
            raise TokenizerError("tokenizer.ggml.add_eos_token is true, but there is no EOS token")

    def _first_token(self, texts: Iterable[str]) -> int | None:
        return next((self._ids[t] for t in texts if t in self._ids), None)

    def _detect_end_of_generation(self, metadata: Mapping[str, Any]) -> None:
        """EOT/EOM by their text when the metadata has none; EOG = EOS, EOT, EOM, the FIM
        pad/repo/sep tokens and every token whose text ends a turn. Tokens found by their
        text become CONTROL tokens, as in llama.cpp."""
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
        for token_id in (found | eog) - {None}:
            self._attrs[token_id] |= TokenAttr.CONTROL
        eog.update((self.eos_id, self.eot_id, self.eom_id))
        self.eog_ids = frozenset(eog - {None})

    def _build_spm(self):
        """SentencePiece BPE as a ``tokenizers`` BPE: one merge for every split of a token
        into two tokens, ranked by the merged token's score (highest first). Ties (e.g.
        the runs of "▁") go to the longer left part, which makes ``tokenizers`` grow the
        leftmost run first, as llama.cpp's leftmost-first tie-break does."""
        from tokenizers import Tokenizer as HFTokenizer, models

        ranked = []
        for target_id, text in enumerate(self._texts):
            for cut in range(1, len(text)):
                left, right = text[:cut], text[cut:]
                if left in self._ids and right in self._ids:
                    ranked.append((-float(self._scores[target_id]), -cut, target_id, left, right))
        ranked.sort()
        merges = [(left, right) for *_, left, right in ranked]
        unk = self._texts[self.unk_id] if self.unk_id is not None else None
        bpe = models.BPE(vocab=self._ids, merges=merges, unk_token=unk, byte_fallback=True,
                         fuse_unk=False)
        return HFTokenizer(bpe)

    def _build_bpe(self, metadata: Mapping[str, Any]):
        from tokenizers import Tokenizer as HFTokenizer, models, pre_tokenizers

        raw_merges = metadata.get("tokenizer.ggml.merges")
        if raw_merges is None:
            raise TokenizerError("tokenizer.ggml.model 'gpt2' needs 'tokenizer.ggml.merges'")
        merges = []
        for line in raw_merges:
            cut = line.find(" ", 1)  # the first space after the first character separates the pair
            if cut < 0:
                raise TokenizerError(f"tokenizer.ggml.merges entry {line!r} has no space")
            left, right = line[:cut], line[cut + 1:]
            if left + right not in self._ids:
                raise TokenizerError(f"merge {line!r} makes {left + right!r}, which is not a token")
            merges.append((left, right))
        bpe = models.BPE(vocab=self._ids, merges=merges, ignore_merges=self.pre.ignore_merges)
        hf = HFTokenizer(bpe)
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [*self.pre.hf_pre_tokenizers(),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        return hf

    def _special_tokens_longest_first(self) -> list[int]:
        special = np.nonzero(self._attrs & _SPECIAL_ATTRS)[0].tolist()
        return sorted(special, key=lambda i: -len(self._texts[i].encode()))

    # -- tokenize ------------------------------------------------------------------------

    def _require_vocab(self, what: str) -> None:
        if self._hf is None:
            raise TokenizerError(f"cannot {what}: this GGUF has no tokenizer "
                                 f"(tokenizer.ggml.model = {self.model!r}); use token ids")

    def _split_special(self, text: str, parse_special: bool) -> list[str | int]:
        """Cut ``text`` at special tokens, longest token first (llama.cpp's
        tokenizer_st_partition): returns text fragments and token ids. USER_DEFINED tokens
        are always matched, CONTROL/UNKNOWN ones only with parse_special."""
        fragments: list[str | int] = [text] if text else []
        for token_id in self._special_order:
            if not parse_special and self._attrs[token_id] & _HIDDEN_ATTRS:
                continue
            token = self._texts[token_id]
            fragments = [piece for fragment in fragments
                         for piece in _cut_at_token(fragment, token, token_id)]
        return fragments

    def _encode_text(self, text: str) -> list[int]:
        if self.is_spm:
            # every text fragment starts the text or follows a special token: both get the space
            if self.add_space_prefix:
                text = " " + text
            text = text.replace(" ", _SPACE_MARK)
        return self._hf.encode(text, add_special_tokens=False).ids

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of ``text``, as llama.cpp's ``llama_tokenize``. ``add_special`` adds
        BOS/EOS where the model asks for them (``add_bos``/``add_eos``); ``parse_special``
        turns the text of CONTROL tokens (e.g. ``<|im_start|>``) into those tokens."""
        if not isinstance(text, str):
            raise TypeError(f"tokenize expects str, got {type(text).__name__}")
        self._require_vocab("tokenize")
        ids: list[int] = []
        if add_special and self.add_bos:
            ids.append(self.bos_id)
        for fragment in self._split_special(text, parse_special):
            if isinstance(fragment, int):
                ids.append(fragment)
            else:
                ids.extend(self._encode_text(fragment))
        if add_special and self.add_eos:
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
        if attr & _SPECIAL_ATTRS:
            return text.encode()
        if attr & TokenAttr.NORMAL:
            if self.is_spm:
                return text.replace(_SPACE_MARK, " ").encode()
            # byte-level alphabet back to bytes; a character outside it stands for itself
            return b"".join(bytes([_UNICODE_TO_BYTE[c]]) if c in _UNICODE_TO_BYTE else c.encode()
                            for c in text)
        if attr & TokenAttr.BYTE:
            return bytes([int(text[3:5], 16)])  # "<0xAB>"
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
        pre = f", pre={self.pre.name!r}" if self.pre else ""
        return f"Tokenizer(model={self.model!r}{pre}, n_vocab={self.n_vocab})"


def _cut_at_token(fragment: str | int, token: str, token_id: int) -> list[str | int]:
    """A text fragment cut at every occurrence of ``token`` (left to right), the
    occurrences replaced by ``token_id``; token ids pass through."""
    if isinstance(fragment, int) or token not in fragment:
        return [fragment]
    pieces: list[str | int] = []
    for k, part in enumerate(fragment.split(token)):
        if k:
            pieces.append(token_id)
        if part:
            pieces.append(part)
    return pieces


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
