"""The vocabulary models llama.cpp knows, each turning one text fragment (special tokens
already cut out) into token ids: SPM, BPE, WPM, UGM and RWKV (``llama_vocab_type``).

SPM, BPE and WPM run their merging/matching in HuggingFace ``tokenizers`` (SentencePiece
BPE as score-ranked merges, GPT-2 BPE behind llama.cpp's regex splits, WordPiece as greedy
longest match); UGM (Viterbi over token scores) and RWKV (greedy longest byte match) are
short loops here. Behaviour follows llama.cpp's ``src/llama-vocab.cpp``.
"""
from __future__ import annotations

import heapq

import unicodedata
from typing import Sequence

import numpy as np

from .tokenizer_pre import PreTokenizer

SPACE_MARK = "\u2581"  # "▁", SentencePiece's escaped space


def _hf(model, pre_tokenizer=None):
    from tokenizers import Tokenizer as HFTokenizer
    hf = HFTokenizer(model)
    if pre_tokenizer is not None:
        hf.pre_tokenizer = pre_tokenizer
    return hf


class SpmEncoder:
    """SentencePiece BPE as a ``tokenizers`` BPE: one merge for every split of a token into
    two tokens, ranked by the merged token's score (highest first). Ties go to the longer
    left part, which makes ``tokenizers`` grow the leftmost run first, as llama.cpp's
    leftmost-first tie-break does. Unknown characters fall back to <0xXX> tokens."""

    def __init__(self, texts: Sequence[str], ids: dict, scores: np.ndarray, unk_id):
        from tokenizers import models
        ranked = []
        for target_id, text in enumerate(texts):
            for cut in range(1, len(text)):
                left, right = text[:cut], text[cut:]
                if left in ids and right in ids:
                    ranked.append((-float(scores[target_id]), -cut, target_id, left, right))
        ranked.sort()
        merges = [(left, right) for *_, left, right in ranked]
        unk = texts[unk_id] if unk_id is not None else None
        self.hf = _hf(models.BPE(vocab=ids, merges=merges, unk_token=unk, byte_fallback=True, fuse_unk=False))

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text.replace(" ", SPACE_MARK), add_special_tokens=False).ids


class SpmPairEncoder:
    """llama.cpp's SentencePiece BPE step by step: the characters are symbols; the adjacent pair
    whose concatenation is a token with the highest score merges first, the leftmost pair on a
    tie; symbols that are not tokens become <0xXX> byte tokens. Exact where SpmEncoder's merge
    ranking is not: when merge targets share a score (see spm_encoder). Slower (Python)."""

    def __init__(self, ids: dict, scores: np.ndarray, source: str = "vocabulary"):
        self.ids, self.scores, self.source = ids, scores, source

    def encode(self, text: str) -> list[int]:
        sym = list(text.replace(" ", SPACE_MARK))
        n = len(sym)
        if n == 0:
            return []
        nxt, prev = list(range(1, n + 1)), list(range(-1, n - 1))
        nxt[-1] = -1
        queue: list = []

        def add_pair(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            text = sym[left] + sym[right]
            token = self.ids.get(text)
            if token is not None:  # highest score first, then the leftmost
                heapq.heappush(queue, (-float(self.scores[token]), left, right, len(text)))

        for i in range(1, n):
            add_pair(i - 1, i)
        while queue:
            _, left, right, size = heapq.heappop(queue)
            if not sym[left] or not sym[right] or len(sym[left]) + len(sym[right]) != size:
                continue  # one of the two was merged since
            sym[left], sym[right] = sym[left] + sym[right], ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            add_pair(prev[left], left)
            add_pair(left, nxt[left])
        out, i = [], 0
        while i != -1:
            token = self.ids.get(sym[i])
            out += [token] if token is not None else [self._byte_token(b) for b in sym[i].encode()]
            i = nxt[i]
        return out

    def _byte_token(self, b: int) -> int:
        token = self.ids.get(f"<0x{b:02X}>", self.ids.get(chr(b)) if b < 128 else None)
        if token is None:
            raise ValueError(f"{self.source}: the vocabulary has no token for byte 0x{b:02X} (neither <0x{b:02X}> "
                             f"nor the byte)")
        return token


def spm_encoder(texts: Sequence[str], ids: dict, scores: np.ndarray, unk_id, source: str = "vocabulary"):
    """SpmEncoder (fast: a ``tokenizers`` BPE) when every token that two tokens make has its own
    score, else SpmPairEncoder: with tied scores the merge order depends on positions, which a
    ranked merge list cannot express. ValueError when the newline byte has no token (llama.cpp
    refuses such an SPM vocabulary: it looks its linefeed token up on load)."""
    if "<0x0A>" not in ids and "\n" not in ids:
        raise ValueError("the SPM vocabulary has no token for the newline byte (<0x0A>)")
    if spm_targets_tie(texts, ids, scores):
        return SpmPairEncoder(ids, scores, source)
    return SpmEncoder(texts, ids, scores, unk_id)


def spm_targets_tie(texts: Sequence[str], ids: dict, scores: np.ndarray) -> bool:
    """Whether two merge targets (tokens that two tokens make) share a score. Only a token
    whose score another token has can tie, so only those are checked for being targets (a
    large vocabulary's scores are nearly all distinct)."""
    _, group, count = np.unique(np.asarray(scores), return_inverse=True, return_counts=True)
    shared = np.flatnonzero(count[group.reshape(-1)] > 1).tolist()
    targets = [i for i in shared if any(texts[i][:cut] in ids and texts[i][cut:] in ids
                                        for cut in range(1, len(texts[i])))]
    return len(set(scores[targets].tolist())) < len(targets)


class BpeEncoder:
    """Ranked-merge BPE behind a llama.cpp pre-tokenizer: the text is cut by the
    pre-tokenizer's regexes, each piece byte-level encoded (GPT-2 alphabet) or, for
    SentencePiece-style BPE, kept as UTF-8 with <0xXX> fallback, then merged."""

    def __init__(self, ids: dict, raw_merges, pre: PreTokenizer, drop_whitespace: bool = False):
        from tokenizers import models, pre_tokenizers
        merges = []
        for line in raw_merges:
            cut = line.find(" ", 1)  # the first space after the first character separates the pair
            if cut < 0:
                raise ValueError(f"tokenizer.ggml.merges entry {line!r} has no space")
            left, right = line[:cut], line[cut + 1:]
            if left + right not in ids:
                raise ValueError(f"merge {line!r} makes {left + right!r}, which is not a token")
            merges.append((left, right))
        self.pre, self.ids = pre, ids
        self.drop_whitespace = drop_whitespace  # tokenizer.ggml.model "whitespace": words only
        try:
            bpe = models.BPE(vocab=ids, merges=merges, ignore_merges=pre.ignore_merges,
                             byte_fallback=not pre.byte_encode)
        except Exception as e:  # tokenizers raises a bare Exception: a merge's part is not a token
            raise ValueError(f"tokenizer.ggml.merges do not fit the vocabulary: {e}") from None
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        self.hf = _hf(bpe, byte_level if pre.byte_encode else None)

    def encode(self, text: str) -> list[int]:
        if self.drop_whitespace:
            return [i for segment in text.split() for i in self._encode_segment(segment)]
        return self._encode_segment(text)

    def _encode_segment(self, text: str) -> list[int]:
        if self.pre.escape_whitespaces:
            text = text.replace(" ", SPACE_MARK)
        words = self.pre.split(text)
        if not words:
            return []
        if self.pre.whole_newlines:
            return [i for word in words for i in self._encode_newlines_whole(word)]
        return self.hf.encode(words, is_pretokenized=True, add_special_tokens=False).ids

    def _encode_newlines_whole(self, word: str) -> list[int]:
        if not word.strip("\n") and word in self.ids:
            return [self.ids[word]]
        return self.hf.encode([word], is_pretokenized=True, add_special_tokens=False).ids


def _is_wpm_punctuation(ch: str) -> bool:
    cat = unicodedata.category(ch)
    return cat.startswith("P") or (ord(ch) < 0x7F and cat.startswith("S"))


_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
               (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def _is_cjk(ch: str) -> bool:
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


class WpmEncoder:
    """BERT WordPiece as llama.cpp runs it: BertNormalizer-style splitting (whitespace,
    punctuation and CJK characters apart, control characters dropped, optional lowercase and
    accent stripping), then greedy longest match of "▁word" over the vocabulary (the GGUF
    stores word starts with "▁" and continuations bare); a word that cannot be matched
    completely becomes the unknown token."""

    def __init__(self, ids: dict, unk_text: str | None, lowercase: bool, strip_accents: bool):
        from tokenizers import models
        self.lowercase, self.strip_accents = lowercase, strip_accents
        self.hf = _hf(models.WordPiece(vocab=ids, unk_token=unk_text or "[UNK]",
                                       continuing_subword_prefix="", max_input_chars_per_word=1 << 30))

    def words(self, text: str) -> list[str]:
        words, word = [], []
        for ch in text:
            if self.strip_accents:
                ch = unicodedata.normalize("NFD", ch)[0]  # llama.cpp keeps the first code point
            if ch.isspace() or unicodedata.category(ch) == "Zs":
                words.append("".join(word))
                word = []
                continue
            if ch in "\x00\ufffd" or unicodedata.category(ch).startswith("C"):
                continue
            if self.strip_accents and unicodedata.category(ch) == "Mn":
                continue
            if self.lowercase:
                ch = ch.lower()[0]  # the simple (one code point) lowercase mapping
            if _is_wpm_punctuation(ch) or _is_cjk(ch):
                words += ["".join(word), ch]
                word = []
            else:
                word.append(ch)
        words.append("".join(word))
        return [w for w in words if w]

    def encode(self, text: str) -> list[int]:
        words = [SPACE_MARK + w for w in self.words(text)]
        if not words:
            return []
        return self.hf.encode(words, is_pretokenized=True, add_special_tokens=False).ids


class UgmEncoder:
    """Unigram (T5-style SentencePiece): the text is normalized by the precompiled character
    map, spaces become "▁", then the Viterbi path with the highest sum of token scores wins
    (user-defined tokens score 0; a character no token covers costs min score - 10 and
    consecutive unknowns merge into one), as llama.cpp's llm_tokenizer_ugm."""

    UNKNOWN_PENALTY = 10.0

    def __init__(self, texts: Sequence[str], scores: np.ndarray, normal: np.ndarray,
                 user_defined: np.ndarray, matchable: np.ndarray, unk_id, charsmap: bytes,
                 add_space_prefix: bool, remove_extra_whitespaces: bool,
                 escape_whitespaces: bool = True, treat_whitespace_as_suffix: bool = False):
        """`normal`, `user_defined`, `matchable` (normal, user-defined or unused): per-token
        masks from the token attributes."""
        self.tokens = {}
        for i in np.nonzero(matchable)[0].tolist():
            self.tokens.setdefault(texts[i], (i, 0.0 if user_defined[i] else float(scores[i])))
        self.user_defined = {texts[i] for i in np.nonzero(user_defined)[0].tolist()}
        normal_scores = scores[normal]
        self.unknown_score = (float(normal_scores.min()) if normal_scores.size else 0.0) - self.UNKNOWN_PENALTY
        self.max_len = max((len(t) for t in self.tokens), default=1)
        self.unk_id = unk_id
        self.charsmap = _CharsMap(charsmap) if charsmap else None
        self.space = SPACE_MARK if escape_whitespaces else " "
        self.prepend = add_space_prefix and not treat_whitespace_as_suffix
        self.append = add_space_prefix and treat_whitespace_as_suffix
        self.merge_spaces = remove_extra_whitespaces

    def normalize(self, text: str) -> str:
        raw = text.encode("utf-8")
        out, pos, in_word, prepended = [], 0, False, False
        while pos < len(raw):
            piece, consumed = self._normalize_prefix(raw, pos)
            pos += consumed
            for ch in piece:
                if ch != " ":
                    if not in_word:
                        in_word = True
                        if (self.prepend and not prepended) or self.merge_spaces:
                            out.append(self.space)
                            prepended = True
                    out.append(ch)
                else:
                    in_word = False
                    if not self.merge_spaces:
                        out.append(self.space)
        if self.append:
            out.append(self.space)
        return "".join(out)

    def _normalize_prefix(self, raw: bytes, pos: int) -> tuple[str, int]:
        matches = [t for t in self.user_defined if raw.startswith(t.encode("utf-8"), pos)]
        if matches:  # the longest user-defined token is taken as is, never normalized
            text = max(matches, key=lambda t: len(t.encode("utf-8")))
            return text, len(text.encode("utf-8"))
        if self.charsmap is not None:
            hit = self.charsmap.longest_prefix(raw, pos)
            if hit is not None:
                return hit
        n = _utf8_len(raw[pos])
        try:
            return raw[pos:pos + n].decode("utf-8"), n
        except UnicodeDecodeError:
            return "\ufffd", 1

    def encode(self, text: str) -> list[int]:
        norm = self.normalize(text)
        n = len(norm)
        if n == 0:
            return []
        best = [(-np.inf, 0, self.unk_id)] * (n + 1)  # (score, start, token) ending at each position
        best[0] = (0.0, 0, self.unk_id)
        for start in range(n):
            base = best[start][0]
            if base == -np.inf:
                continue
            whole_char = False
            for end in range(start + 1, min(n, start + self.max_len) + 1):
                hit = self.tokens.get(norm[start:end])
                if hit is None:
                    continue
                whole_char |= end == start + 1
                if base + hit[1] > best[end][0]:
                    best[end] = (base + hit[1], start, hit[0])
            if not whole_char and base + self.unknown_score > best[start + 1][0]:
                best[start + 1] = (base + self.unknown_score, start, self.unk_id)
        ids, pos = [], n
        while pos > 0:
            _, start, token = best[pos]
            if not (token == self.unk_id and ids and ids[-1] == self.unk_id):
                ids.append(token)
            pos = start
        return ids[::-1]


def _utf8_len(first_byte: int) -> int:
    return 1 if first_byte < 0x80 else 2 if first_byte >> 5 == 0b110 else 3 if first_byte >> 4 == 0b1110 \
        else 4 if first_byte >> 3 == 0b11110 else 1


class _CharsMap:
    """SentencePiece's precompiled character map: a double-array trie (XOR-compressed, 32-bit
    units) over input byte strings whose leaves point at NUL-terminated replacements."""

    def __init__(self, blob: bytes):
        blob = bytes(blob)
        size = int.from_bytes(blob[:4], "little")
        if size + 4 >= len(blob):
            raise ValueError("tokenizer.ggml.precompiled_charsmap: trie size past the end")
        self.units = np.frombuffer(blob[4:4 + size], dtype="<u4").tolist()
        self.replacements = blob[4 + size:]

    def _unit(self, i: int) -> int:
        if i >= len(self.units):
            raise ValueError("tokenizer.ggml.precompiled_charsmap: index out of the trie")
        return self.units[i]

    @staticmethod
    def _base(unit: int) -> int:
        return (unit >> 10) << ((unit & (1 << 9)) >> 6)

    def longest_prefix(self, raw: bytes, pos: int) -> tuple[str, int] | None:
        node = self._base(self._unit(0))
        length = value = 0
        for k in range(pos, len(raw)):
            c = raw[k]
            if c == 0:
                break
            node ^= c
            unit = self._unit(node)
            if unit & ((1 << 31) | 0xFF) != c:
                break
            leaf = (unit >> 8) & 1
            node ^= self._base(unit)
            if leaf:
                length, value = k - pos + 1, self._unit(node) & ((1 << 31) - 1)
        if not length:
            return None
        end = self.replacements.index(b"\x00", value)
        return self.replacements[value:end].decode("utf-8", errors="replace"), length


def unescape_rwkv(text: str) -> bytes:
    """An RWKV vocabulary entry's bytes: \\t \\n \\r \\xHH and \\<char> escapes."""
    out, i, raw = bytearray(), 0, text.encode("utf-8")
    while i < len(raw):
        c = raw[i]
        if c == 0x5C and i + 1 < len(raw):  # backslash
            nxt = chr(raw[i + 1])
            if nxt == "x":
                out.append(int(raw[i + 2:i + 4], 16))
                i += 4
                continue
            out += {"t": b"\t", "n": b"\n", "r": b"\r"}.get(nxt, bytes([raw[i + 1]]))
            i += 2
            continue
        out.append(c)
        i += 1
    return bytes(out)


class RwkvEncoder:
    """RWKV "world" vocabulary: the longest token (over raw bytes) at each position; a byte
    no token starts with becomes the unknown token."""

    def __init__(self, texts: Sequence[str], unk_id, source: str = "vocabulary"):
        # a byte string listed twice maps to its last id, as in llama.cpp's trie
        self.tokens = {unescape_rwkv(text): i for i, text in enumerate(texts)}
        self.max_len = max(len(t) for t in self.tokens)
        self.unk_id, self.source = unk_id, source
        # llama.cpp's matcher restarts at the text's start (and never ends) when a byte begins
        # tokens but is not one itself; RWKV world vocabularies list all 256 bytes, so such a
        # vocabulary is some other one relabelled: refuse it rather than answer differently
        first_bytes = {t[0] for t in self.tokens if t}
        missing = sorted(b for b in first_bytes if bytes([b]) not in self.tokens)
        if missing:
            raise ValueError(f"{source}: not an RWKV vocabulary: byte 0x{missing[0]:02X} begins tokens but is "
                             f"not a token itself ({len(missing)} such bytes)")

    def encode(self, text: str) -> list[int]:
        raw, ids, pos = text.encode("utf-8"), [], 0
        while pos < len(raw):
            for end in range(min(len(raw), pos + self.max_len), pos, -1):
                token = self.tokens.get(raw[pos:end])
                if token is not None:
                    ids.append(token)
                    pos = end
                    break
            else:
                if self.unk_id is None:  # llama.cpp would emit LLAMA_TOKEN_NULL (-1) here
                    raise ValueError(f"{self.source}: no token starts with byte 0x{raw[pos]:02X} and the "
                                     f"vocabulary has no unknown token")
                ids.append(self.unk_id)
                pos += 1
        return ids
