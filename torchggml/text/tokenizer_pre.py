"""BPE pre-tokenizers: llama.cpp's regex splits and flags per ``tokenizer.ggml.pre``.

Each pre-tokenizer is a list of regexes applied one after the other, as llama.cpp's
``unicode_regex_split`` does: every regex cuts each piece of the previous step into its
matches and the text between them. The regexes are llama.cpp's (``src/llama-vocab.cpp``,
``llm_tokenizer_bpe``), run with the ``regex`` module (Unicode categories, look-arounds).
Three splits that llama.cpp writes by hand instead of as a regex (Kimi-K2's words, AFMoE's
and Tiny-Aya's digit groups) are functions here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import unicodedata

import regex

__all__ = ["PreTokenizer", "PRE_TOKENIZERS"]

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_UPPER = r"((?=[\p{L}])([^a-z]))"   # llama.cpp's stand-in for \p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}
_LOWER = r"((?=[\p{L}])([^A-Z]))"   # and for \p{Ll}\p{Lm}\p{Lo}\p{M}
TEKKEN = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
         rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_UPPER_M, _LOWER_M = r"((?=[\p{L}\p{M}])([^a-z]))", r"((?=[\p{L}\p{M}])([^A-Z]))"
GRANITE_EMB_MULTI = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER_M}*{_LOWER_M}+{_CONTRACTIONS}?"
                     rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER_M}+{_LOWER_M}*{_CONTRACTIONS}?"
                     r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CASED = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + _CONTRACTIONS
          + r"?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _CONTRACTIONS + "?")
TINY_AYA = _CASED + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
YOUTU = _CASED + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_PUNCT_WORD = (r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
               r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CJK_KANA = r"[一-龥぀-ゟ゠-ヿ]+"
_DEEPSEEK_CJK = r"[一-龥ࠀ-一가-퟿]+"
_BLOOM = r" ?[^(\s|.,!?…。，、।۔،)]+"
_DEEPSEEK_LETTERS = r"\s?[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+"
_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")


def _split_digit_groups(word: str) -> list[str]:
    """Digit runs cut into groups of three from the right (1234567 -> 1, 234, 567), other
    text kept between them (llama.cpp's AFMoE / Tiny-Aya digit split)."""
    pieces, pos = [], 0
    for run in regex.finditer(r"\p{N}+", word):
        pieces.append(word[pos:run.start()])
        digits = run.group()
        head = len(digits) % 3
        pieces += [digits[:head]] + [digits[i:i + 3] for i in range(head, len(digits), 3)]
        pos = run.end()
    pieces.append(word[pos:])
    return pieces


_HAN = r"\p{Han}"
_KIMI_K2 = regex.compile(
    rf"{_HAN}+"
    rf"|[^\r\n\p{{L}}\p{{N}}]?(?:(?!{_HAN})\p{{L}})+(?:'[sStTmMdD]|'[rR][eE]|'[vV][eE]|'[lL][lL])?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _split_kimi_k2(word: str) -> list[str]:
    """Kimi-K2's split, written by hand in llama.cpp: Han runs, words of other letters
    (cased alike) with a contraction, digit triples, punctuation, spaces."""
    return _regex_pieces(_KIMI_K2, word)


def _regex_pieces(pattern: regex.Pattern, word: str, view: str | None = None) -> list[str]:
    """Matches of `pattern` in `view` (a same-length stand-in for `word`, default `word`)
    and the text between them, as pieces of `word`, in order."""
    pieces, pos = [], 0
    for m in pattern.finditer(word if view is None else view):
        pieces += [word[pos:m.start()], word[m.start():m.end()]]
        pos = m.end()
    pieces.append(word[pos:])
    return pieces


Split = Callable[[str], list]

# llama.cpp runs most regexes with std::regex on a "collapsed" text: a code point above 127
# becomes one byte naming its category (whitespace becomes \v), and \p{N} \p{L} \p{P} \p{M}
# \p{S} become classes of that byte plus the ASCII members. Regexes without these
# categories run on the code points, non-ASCII whitespace again as \v. Both are emulated
# here, so the splits match llama.cpp's also where they differ from Unicode semantics
# (e.g. \p{Lu} matches every letter and a-z there). The regexes that
# llama.cpp splits with hand-written code run on the real code points.
_CATEGORY_BYTES = {"N": "\\xd1", "L": "\\xd2", "P": "\\xd3", "M": "\\xd4", "S": "\\xd5"}
_ASCII_MEMBERS = {"N": "0-9", "L": "A-Za-z", "P": r"!-#%-*,-/:-;?-@\[-\]_\{\}", "M": "",
                  "S": r"\$\+<-\>\^`\|"}
_CUSTOM_SPLITS = {GPT2, LLAMA3, QWEN35,
                  r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+"}
_CATEGORY_CLASS = regex.compile(r"\\p\{([NLPMS])[ultmo]?\}")  # \p{Lu} ... count as \p{L}


def _collapsed_char(ch: str) -> str:
    if ch < "\x80":
        return ch
    if ch.isspace():
        return "\v"
    cat = unicodedata.category(ch)[0]
    return chr(0xD1 + "NLPMS".index(cat)) if cat in "NLPMS" else "\xd0"


def _spaces_as_vt(ch: str) -> str:
    return "\v" if ch > "\x7f" and ch.isspace() else ch


def _collapse_regex(expr: str) -> str:
    """llama.cpp's rewrite of a regex for the collapsed text."""
    out, inside, i = [], False, 0
    while i < len(expr):
        c = expr[i]
        m = _CATEGORY_CLASS.match(expr, i)
        if m:
            members = _CATEGORY_BYTES[m.group(1)] + _ASCII_MEMBERS[m.group(1)]
            out.append(members if inside else f"[{members}]")
            i = m.end()
            continue
        if c == "\\":
            nxt = expr[i + 1]
            out.append({"p": "p", "d": "[0-9]"}.get(nxt, expr[i:i + 2]))  # std::regex: \p is "p"
            i += 2
            continue
        if c == "[":
            inside = True
        elif c == "]":
            inside = False
        out.append(c)
        i += 1
    return "".join(out)


def _compile(expr: str) -> Split:
    if expr.endswith("$") and not expr.endswith(r"\$"):
        expr = expr[:-1] + r"\Z"  # std::regex's "$" is the end of the piece
    if expr in _CUSTOM_SPLITS:
        pattern = regex.compile(expr)
        return lambda word: _regex_pieces(pattern, word)
    if _CATEGORY_CLASS.search(expr):
        pattern, view = regex.compile(_collapse_regex(expr)), _collapsed_char
    else:
        pattern, view = regex.compile(expr.replace(r"\d", "[0-9]")), _spaces_as_vt
    return lambda word: _regex_pieces(pattern, word, "".join(map(view, word)))


@dataclass(frozen=True)
class PreTokenizer:
    """One llama.cpp pre-tokenizer type: its splits (regexes, or functions for the
    hand-written ones) and the flags llama.cpp sets along with it."""
    name: str
    regexes: tuple[str | Split, ...]
    clean_spaces: bool = True      # detokenize removes " ?", " 's" ... (clean_up_tokenization_spaces)
    ignore_merges: bool = False    # a pre-token that is a whole vocab token is taken as is
    add_bos: bool = False          # default of tokenizer.ggml.add_bos_token
    byte_encode: bool = True       # GPT-2 byte-level alphabet (False: raw UTF-8, <0xXX> fallback)
    escape_whitespaces: bool = False  # spaces become "▁" before splitting (SentencePiece-style BPE)
    no_bos: bool = False           # llama.cpp drops the default BOS id (chatglm)
    add_sep: bool = False          # default of tokenizer.ggml.add_sep_token
    whole_newlines: bool = False   # a run of newlines that is a token is taken whole (gemma4)
    _splits: tuple | None = field(default=None, compare=False, repr=False)

    def split(self, text: str) -> list[str]:
        """The pieces this pre-tokenizer cuts ``text`` into (before byte encoding)."""
        if self._splits is None:  # compiled on first use: only the model's type, not all 91 at import
            object.__setattr__(self, "_splits", tuple(r if callable(r) else _compile(r) for r in self.regexes))
        pieces = [text] if text else []
        for cut in self._splits:
            pieces = [p for piece in pieces for p in cut(piece) if p]
        return pieces


def _pre(name: str, *regexes, **flags) -> PreTokenizer:
    return PreTokenizer(name, regexes, **flags)


_KEEP = dict(clean_spaces=False)
_STARCODER = (r"\p{N}", GPT2)
_DEEPSEEK3 = (r"\p{N}{1,3}", _CJK_KANA, _PUNCT_WORD)
_LINES = r"[^\n]+|[\n]+"

# tokenizer.ggml.pre -> PreTokenizer, as llama.cpp's llama_vocab::impl::load maps them
# (names sharing a type share its regexes; flags as set per name)
PRE_TOKENIZERS: dict[str, PreTokenizer] = {}


def _add(names: str, *regexes, **flags) -> None:
    for name in names.split():
        PRE_TOKENIZERS[name] = _pre(name, *regexes, **flags)


_add("default", *_DEFAULT)
_add("llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano", LLAMA3,
     ignore_merges=True, add_bos=True)
_add("minicpm5", r"\p{N}{1,3}", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*"
     r"|\s*[\r\n]+|\s+(?!\S)|\s+", ignore_merges=True)
_add("jais-2", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
     + "".join(rf"|\s{{{n}}}(?!\S)" for n in (512, 256, 128, 64, 32, 16, 8, 4)) + r"|\s{1,2}(?!\S)|\s{1}")
_add("dbrx smaug-bpe", LLAMA3)
_add("deepseek-llm", "[\r\n]",
     _DEEPSEEK_LETTERS,
     r"\s?[!-/:-~！-／：-～‘-‟　-。]+", r"\s+$", _DEEPSEEK_CJK, r"\p{N}+", **_KEEP)
_add("deepseek-coder", "[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _DEEPSEEK_CJK, r"\p{N}", **_KEEP)
_add("deepseek-v3 hunyuan-dense joyai-llm hy_v4", *_DEEPSEEK3, **_KEEP)
_add("spark2_5", r"\p{N}{1,3}", _CJK_KANA, _PUNCT_WORD.replace(r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+",
                                                               r"| ?[\p{P}\p{S}]+|[\r\n]"), r"\p{N}", **_KEEP)
_add("youtu", r"[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+", YOUTU,
     ignore_merges=True, **_KEEP)
_add("falcon", r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]")
_add("mpt gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert olmo jais "
     "exaone4", GPT2)
_add("jina-v1-en jina-v2-code roberta-bpe", GPT2, add_sep=True)
_add("trillion granite-docling", GPT2, **_KEEP)
_add("starcoder refact codeshell exaone minerva-7b mellum2", *_STARCODER)
_add("command-r smollm", *_STARCODER, **_KEEP)
_add("gemma4 granite-embed-multi-311m", _LINES, byte_encode=False, escape_whitespaces=True,
     whole_newlines=True)
_add("sarvam-moe", _LINES, byte_encode=False, escape_whitespaces=True, **_KEEP)
_add("whitespace", r"\S+", byte_encode=False)
_add("qwen2 deepseek-r1-qwen kormo f2llmv2 hunyuan solar-open", QWEN2, **_KEEP)
_add("stablelm2 megrez", QWEN2)
_add("qwen35", QWEN35, **_KEEP)
_add("poro-chat", _BLOOM, **_KEEP)
_add("bloom gpt3-finnish", _BLOOM)
_add("chatglm-bpe", LLAMA3, no_bos=True)
_add("glm4 glm5", LLAMA3, no_bos=True, ignore_merges=True)
_add("viking", _BLOOM, r"\p{N}", **_KEEP)
_add("tekken", TEKKEN, ignore_merges=True, add_bos=True, **_KEEP)
_add("chameleon", r"<sentinel:[0-9]+>", r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", r"([\t\n]|    |  )",
     r"\p{N}", r"[\p{P}!-/:-@\[-`{-~]", GPT2, add_bos=True, **_KEEP)
_add("gpt-4o llama4 kanana2 talkie minimax-m2", GPT4O, **_KEEP)
_add("granite-embed-multi-97m", GRANITE_EMB_MULTI, ignore_merges=True, **_KEEP)
_add("tiny_aya cohere2moe", _split_digit_groups, TINY_AYA, **_KEEP)
_add("superbpe", r"\p{N}+", r"(?=(\d{3})+(?!\d))", **_KEEP)
_add("bailingmoe bailingmoe2 llada-moe", r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+"
     r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+", **_KEEP)
_add("seed-coder", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
     r"|\s+(?!\S)|\s+", **_KEEP)
_add("ufakzeka", r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+", **_KEEP)
_add("grok-2", QWEN2, **_KEEP)
_add("kimi-k2", _split_kimi_k2, **_KEEP)
_add("afmoe", _split_digit_groups, "[一-鿿㐀-䶿\uf900-\ufaff぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+", _PUNCT_WORD,
     **_KEEP)
_add("laguna", _LINES, QWEN2, **_KEEP)
_add("exaone-moe", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
     r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+")
