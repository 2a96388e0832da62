"""torchggml.text.tokenizer against llama.cpp's tokenizer test vectors.

llama.cpp's ``models/ggml-vocab-NAME.gguf`` come with ``.inp`` (strings separated by lines
``__ggml_vocab_test__``) and ``.out`` (llama.cpp's ids, ``tokenize(text,
add_special=false)``, one line per string), read here exactly as llama.cpp's
tests/test-tokenizer-0.cpp reads them. The .inp/.out files are in tests/data/vocab; the
.gguf files (megabytes) are read from the golden directory or from the cache that
scripts/fetch_llama_vocab.py fills; a vocabulary whose .gguf is absent is skipped.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import gguf
import pytest

from torchggml.gguf.loader import GGUFError, open_gguf
from torchggml.text.tokenizer import PRE_TOKENIZERS, TokenAttr, Tokenizer, TokenizerError
import numpy as np

REPO = Path(__file__).resolve().parents[1]
GOLDEN = Path(os.environ.get("TORCHGGML_GOLDEN", REPO / ".." / "shared" / "golden"))
VOCAB_DATA = REPO / "tests" / "data" / "vocab"   # .inp/.out test vectors
VOCAB_DIRS = [GOLDEN / "vocab", Path(os.environ.get("TORCHGGML_VOCAB_CACHE",
                                                    Path.home() / ".cache" / "torchggml" / "vocab"))]
MODELS_DIR = GOLDEN / "models"
ABSENT = pytest.mark.skip(reason="golden data absent")


def read_gguf_metadata(path):
    return open_gguf(path).metadata


def vocab_file(name: str) -> Path | None:
    """ggml-vocab-NAME.gguf from the golden directory or the vocab cache."""
    found = [d / f"ggml-vocab-{name}.gguf" for d in VOCAB_DIRS if (d / f"ggml-vocab-{name}.gguf").is_file()]
    return found[0] if found else None

TEST_SEPARATOR = "\n__ggml_vocab_test__\n"


def split_inputs(raw: str) -> list[str]:
    """test-tokenizer-0.cpp's read_tests: cut at every separator; text after the last
    separator is a test only when non-empty."""
    tests, pos = [], 0
    while pos < len(raw):
        nxt = raw.find(TEST_SEPARATOR, pos)
        if nxt < 0:
            tests.append(raw[pos:])
            break
        tests.append(raw[pos:nxt])
        pos = nxt + len(TEST_SEPARATOR)
    return tests


def read_cases(name: str) -> list[tuple[str, list[int]]]:
    raw = (VOCAB_DATA / f"ggml-vocab-{name}.gguf.inp").read_bytes().decode("utf-8")  # no newline translation
    inputs = split_inputs(raw)
    lines = (VOCAB_DATA / f"ggml-vocab-{name}.gguf.out").read_bytes().decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # std::getline yields no line after the final newline
    assert len(lines) == len(inputs), f"{name}: {len(inputs)} inputs, {len(lines)} outputs"
    return [(text, [int(tok) for tok in line.split()]) for text, line in zip(inputs, lines)]


VOCAB_NAMES = sorted(p.name.removeprefix("ggml-vocab-").removesuffix(".gguf.inp")
                     for p in VOCAB_DATA.glob("ggml-vocab-*.gguf.inp"))


def golden_cases():
    """(vocab file, index, text, ids) for every test string; the strings of a vocabulary
    whose .gguf is absent are one skipped case."""
    cases = []
    for name in VOCAB_NAMES:
        path = vocab_file(name)
        if path is None:
            reason = f"ggml-vocab-{name}.gguf absent (scripts/fetch_llama_vocab.py fetches it)"
            cases.append(pytest.param(None, 0, "", [], marks=pytest.mark.skip(reason=reason), id=f"{name}-absent"))
            continue
        cases += [pytest.param(path, i, text, ids, id=f"{name}-{i}") for i, (text, ids) in enumerate(read_cases(name))]
    return cases


def vocab_case(name: str, *values):
    """A parametrize case on vocab NAME: (path, *values)."""
    path = vocab_file(name)
    return pytest.param(path, *values, id=name, marks=() if path else ABSENT)


@pytest.fixture(scope="module")
def load():
    """Tokenizers built once per vocab file for the whole module."""
    cache: dict[Path, Tokenizer] = {}

    def get(path: Path) -> Tokenizer:
        if path not in cache:
            cache[path] = Tokenizer.from_gguf(path)
        return cache[path]
    return get


# --- the golden vectors -----------------------------------------------------------------

@pytest.mark.parametrize("path, index, text, expected", golden_cases())
def test_tokenize_matches_llama_cpp(load, path, index, text, expected):
    assert load(path).tokenize(text, add_special=False) == expected


# llama.cpp's detokenize removes these spaces for vocabularies with clean_spaces
# (GPT-2 style), so upstream does not round-trip such strings either
CLEANED_BY_LLAMA_CPP = re.compile(r" [?!.,]| ' | '(?:s|m|re|ve)")


@pytest.mark.parametrize("path, index, text, expected", golden_cases())
def test_pieces_round_trip(load, path, index, text, expected):
    tok = load(path)
    if tok.vocab_type == "WPM":
        pytest.skip("WordPiece lowercases and drops spaces: its pieces do not spell the text")
    ids = tok.tokenize(text, add_special=False)
    joined = b"".join(tok.token_to_piece_bytes(i) for i in ids).decode("utf-8")
    prefix = " " if tok.add_space_prefix and text else ""  # SentencePiece's added space
    assert joined == prefix + text
    if not (tok.clean_spaces and CLEANED_BY_LLAMA_CPP.search(text)):
        assert tok.detokenize(ids) == text


@pytest.mark.parametrize("path, index, text, expected", golden_cases())
def test_decode_stream_yields_whole_characters(load, path, index, text, expected):
    tok = load(path)
    if tok.vocab_type == "WPM":
        pytest.skip("WordPiece lowercases and drops spaces: its pieces do not spell the text")
    chunks = list(tok.decode_stream(expected))
    prefix = " " if tok.add_space_prefix and text else ""
    assert "".join(chunks) == prefix + text
    assert all(chunk and "\ufffd" not in chunk for chunk in chunks)


# --- behaviour around the merges: BOS/EOS, special tokens, clean-up ---------------------

@pytest.mark.parametrize("path, add_bos", [
    vocab_case("llama-spm", True),    # tokenizer.ggml.add_bos_token = true
    vocab_case("llama-bpe", True),    # llama3 pre-tokenizer: BOS by default
    vocab_case("qwen2", False),
    vocab_case("gpt-2", False),
])
def test_bos_eos_from_metadata(load, path, add_bos):
    tok, metadata = load(path), read_gguf_metadata(path)
    assert tok.bos_id == metadata["tokenizer.ggml.bos_token_id"]
    assert tok.eos_id == metadata["tokenizer.ggml.eos_token_id"]
    assert tok.n_vocab == len(metadata["tokenizer.ggml.tokens"])
    assert tok.add_bos is add_bos and tok.add_eos is False
    plain = tok.tokenize("Hello world", add_special=False)
    assert tok.tokenize("Hello world") == ([tok.bos_id] if add_bos else []) + plain
    assert tok.tokenize("", add_special=True) == ([tok.bos_id] if add_bos else [])
    assert tok.is_eog(tok.eos_id) and not tok.is_eog(plain[0])


@pytest.mark.parametrize("path, eot_text", [
    vocab_case("llama-bpe", "<|eot_id|>"),
    vocab_case("qwen2", "<|im_end|>"),
    vocab_case("gpt-2", "<|endoftext|>"),
])
def test_end_of_turn_detected_by_text(load, path, eot_text):
    tok = load(path)
    assert tok.eot_id == tok.text_to_token(eot_text)
    assert tok.is_eog(tok.eot_id)
    assert tok.token_attr(tok.eot_id) & TokenAttr.CONTROL


@pytest.mark.parametrize("path, special, detokenized, without_special", [
    vocab_case("qwen2", "<|im_start|>", "hi<|im_start|>user", "hiuser"),
    vocab_case("llama-bpe", "<|start_header_id|>", "hi<|start_header_id|>user", "hiuser"),
    vocab_case("gpt-2", "<|endoftext|>", "hi<|endoftext|>user", "hiuser"),
    # SentencePiece puts its space before every text fragment, also after a special token
    vocab_case("llama-spm", "</s>", "hi</s> user", "hi user"),
])
def test_control_tokens_only_with_parse_special(load, path, special, detokenized, without_special):
    tok = load(path)
    special_id = tok.text_to_token(special)
    assert tok.token_attr(special_id) & TokenAttr.CONTROL
    text = f"hi{special}user"
    parsed = tok.tokenize(text, add_special=False, parse_special=True)
    # each side of the special token is tokenized on its own
    assert parsed == (tok.tokenize("hi", add_special=False) + [special_id]
                      + tok.tokenize("user", add_special=False))
    assert special_id not in tok.tokenize(text, add_special=False, parse_special=False)
    assert tok.detokenize(parsed) == detokenized
    assert tok.detokenize(parsed, skip_special=True) == without_special


@pytest.mark.parametrize("path", [vocab_case("qwen2")])
def test_user_defined_tokens_always_matched(load, path):
    tok = load(path)
    pad_id = tok.text_to_token("[PAD151650]")
    assert tok.token_attr(pad_id) == TokenAttr.USER_DEFINED
    expected = tok.tokenize("a", add_special=False) + [pad_id] + tok.tokenize("b", add_special=False)
    for parse_special in (False, True):
        assert tok.tokenize("a[PAD151650]b", add_special=False, parse_special=parse_special) == expected
    assert tok.detokenize(expected, skip_special=True) == "a[PAD151650]b"


@pytest.mark.parametrize("path, text, detokenized", [
    # llama.cpp's three clean-up passes: " ?!.," / " ' " / " 's 'm 're 've" (not 't 'd 'll)
    vocab_case("gpt-2", "Hello , world ! How 's it ?", "Hello, world! How's it?"),
    vocab_case("gpt-2", "a ' b", "a'b"),
    vocab_case("gpt-2", "we 're I 'm you 've", "we're I'm you've"),
    vocab_case("gpt-2", "don 't I 'd we 'll", "don 't I 'd we 'll"),
    vocab_case("llama-bpe", "Hi . Bye ,", "Hi. Bye,"),
    vocab_case("qwen2", "Hello , world ?", "Hello , world ?"),   # qwen2 keeps spaces
])
def test_detokenize_cleans_spaces_like_llama_cpp(load, path, text, detokenized):
    tok = load(path)
    assert tok.detokenize(tok.tokenize(text, add_special=False)) == detokenized


@pytest.mark.parametrize("path", [vocab_case("llama-spm")])
def test_detokenize_leading_space_and_bos(load, path):
    tok = load(path)
    ids = tok.tokenize("Hello", add_special=True)
    assert ids[0] == tok.bos_id
    assert tok.detokenize(ids[1:]) == "Hello"                 # the added space is removed
    assert tok.detokenize(ids) == "<s> Hello"                 # BOS rendered, space kept
    assert tok.detokenize(ids, skip_special=True) == " Hello"  # as llama_detokenize(remove_special)


@pytest.mark.parametrize("path, text", [
    vocab_case("llama-spm", "🦙 Ä"),   # byte-fallback tokens <0xF0> <0x9F> ...
    vocab_case("gpt-2", "🦙 Ä"),       # byte-level tokens holding parts of characters
])
def test_stream_decoder_holds_partial_characters(load, path, text):
    tok = load(path)
    ids = tok.tokenize(text, add_special=False)
    decoder = tok.stream_decoder()
    pushed = [decoder.push(i) for i in ids]
    assert "".join(pushed) + decoder.flush() == (" " if tok.add_space_prefix else "") + text
    assert "" in pushed  # a token ending inside a character yields nothing yet
    # alone, such a piece is not valid UTF-8; a stream cut after it flushes one U+FFFD
    first_partial = next(i for i in ids if "\ufffd" in tok.token_to_piece(i))
    cut = tok.stream_decoder()
    assert cut.push(first_partial) == ""
    assert cut.flush() == "\ufffd"


# --- reading metadata ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["bpe.gguf", "ugm.gguf", "spm-bpe.gguf"])
def test_metadata_matches_gguf_package(name):
    """The tokenizer reads through torchggml.gguf.loader, whose metadata equals the gguf package's."""
    path = REPO / "tests" / "data" / "vocab" / "generated" / name
    reader = gguf.GGUFReader(path)
    ours = open_gguf(path)
    assert ours.keys == [name for name in reader.fields if not name.startswith("GGUF.")]
    for key, field in reader.fields.items():
        if not key.startswith("GGUF."):
            assert ours.get(key) == pytest.approx(field.contents()), key
    sample = "Hello, y'all! 🦙 3333 нещо"
    assert Tokenizer.from_gguf(ours).tokenize(sample) == Tokenizer.from_gguf(path).tokenize(sample)


def test_model_files_without_tokenizer():
    paths = sorted(MODELS_DIR.glob("*.gguf")) if MODELS_DIR.is_dir() else []
    if not paths:
        pytest.skip("golden data absent")
    tok = Tokenizer.from_gguf(paths[0])
    metadata = read_gguf_metadata(paths[0])
    arch = metadata["general.architecture"]
    assert tok.model == "none" and tok.n_vocab == metadata[f"{arch}.vocab_size"]
    assert tok.bos_id is None and not tok.is_eog(0)
    with pytest.raises(TokenizerError, match="no tokenizer"):
        tok.tokenize("hello")
    with pytest.raises(TokenizerError, match="no tokenizer"):
        tok.detokenize([1, 2])


# --- small vocabularies from plain metadata dicts -----------------------------------------

def spm_metadata(**extra):
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    normal = {"\u2581": -1.0, "a": -2.0, "b": -3.0, "\u2581a": -4.0, "ab": -5.0, "\u2581ab": -6.0}
    types = [2, 3, 3] + [6] * 256 + [1] * len(normal)
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": pieces + list(normal),
            "tokenizer.ggml.scores": [0.0] * 259 + list(normal.values()),
            "tokenizer.ggml.token_type": types, **extra}


def test_spm_from_metadata_dict():
    tok = Tokenizer.from_metadata(spm_metadata())
    ids = {text: tok.text_to_token(text) for text in ("\u2581ab", "\u2581a", "\u2581", "<0xC3>", "<0xA9>")}
    # "▁a" (-4) merges before "ab" (-5); "▁a"+"b" makes "▁ab"; "é" falls back to bytes
    assert tok.tokenize("ab", add_special=False) == [ids["\u2581ab"]]
    assert tok.tokenize("ab é", add_special=False) == [ids["\u2581ab"], ids["\u2581"],
                                                       ids["<0xC3>"], ids["<0xA9>"]]
    assert tok.tokenize("ab") == [1, ids["\u2581ab"]]
    assert tok.detokenize(tok.tokenize("ab é", add_special=False)) == "ab é"
    no_prefix = Tokenizer.from_metadata(spm_metadata(**{"tokenizer.ggml.add_space_prefix": False,
                                                        "tokenizer.ggml.add_bos_token": False}))
    assert no_prefix.tokenize("ab") == [no_prefix.text_to_token("ab")]
    assert no_prefix.tokenize(" a") == [ids["\u2581a"]]


def test_none_from_metadata_dict():
    tok = Tokenizer.from_metadata({"tokenizer.ggml.model": "none", "general.architecture": "llama",
                                   "llama.vocab_size": 512})
    assert tok.n_vocab == 512 and tok.eog_ids == frozenset()
    with pytest.raises(TokenizerError, match="tokenizer.ggml.model = 'none'"):
        tok.tokenize("x")


@pytest.mark.parametrize("metadata, error, match", [
    ({}, TokenizerError, "tokenizer.ggml.model"),
    ({"tokenizer.ggml.model": "plamo2", "tokenizer.ggml.tokens": ["a"]}, TokenizerError, "'plamo2'"),
    ({"tokenizer.ggml.model": "llama"}, TokenizerError, "tokenizer.ggml.tokens"),
    ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b"]},
     TokenizerError, "tokenizer.ggml.merges"),
    ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b"],
      "tokenizer.ggml.merges": ["a b"]}, TokenizerError, "not a token"),
    ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "a"],
      "tokenizer.ggml.merges": []}, TokenizerError, "duplicate token"),
    ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b", "c", "b", "b"],
      "tokenizer.ggml.merges": []}, TokenizerError, "duplicate token in vocabulary: 'b' has ids 1 and 3$"),
    ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.merges": [],
      "tokenizer.ggml.token_type": [1]}, TokenizerError, "token_type"),
    ({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a"]},
     TokenizerError, "add_bos_token is true, but there is no BOS"),
    ("tokenizer.ggml.model", TypeError, "mapping"),
])
def test_bad_metadata_raises(metadata, error, match):
    with pytest.raises(error, match=match):  # at load, or when the model is built for text
        Tokenizer.from_metadata(metadata).tokenize("ab")


def test_unknown_pre_tokenizer_loads_and_says_so_when_text_is_needed():
    metadata = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b", "ab", "<|endoftext|>"],
                "tokenizer.ggml.merges": ["a b"], "tokenizer.ggml.pre": "no-such-pre",
                "tokenizer.ggml.token_type": [1, 1, 1, 3]}
    tok = Tokenizer.from_metadata(metadata, source="m.gguf")
    assert tok.detokenize([2, 0]) == "aba" and tok.is_eog(3)   # ids work
    with pytest.raises(TokenizerError, match=r"m\.gguf: tokenizer\.ggml\.pre 'no-such-pre' is not supported"):
        tok.tokenize("ab")


@pytest.mark.parametrize("call, error, match", [
    (lambda tok: tok.tokenize(b"bytes"), TypeError, "str"),
    (lambda tok: tok.detokenize([tok.n_vocab]), TokenizerError, "outside the vocabulary"),
    (lambda tok: tok.token_to_piece(-1), TokenizerError, "outside the vocabulary"),
    (lambda tok: tok.token_to_piece(1.0), TypeError, "int"),
    (lambda tok: Tokenizer.from_gguf(123), TypeError, "path or a GGUFFile"),
])
def test_bad_calls_raise(call, error, match):
    tok = Tokenizer.from_metadata(spm_metadata())
    with pytest.raises(error, match=match):
        call(tok)


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"NOPE" + bytes(20))
    with pytest.raises(GGUFError, match="not a GGUF file"):
        Tokenizer.from_gguf(path)


@pytest.mark.parametrize("pre, text, pieces", [
    # what each llama.cpp regex list cuts: matches and the text between them are pieces
    ("gpt-2", "Hello world's 123  x", ["Hello", " world", "'s", " 123", " ", " x"]),
    ("llama-bpe", "Hello 12345 I'M\n\n", ["Hello", " ", "123", "45", " I", "'M", "\n\n"]),
    ("qwen2", "Hello 12345", ["Hello", " ", "1", "2", "3", "4", "5"]),
    ("default", "a+b=1234!", ["a", "+", "b", "=", "123", "4", "!"]),
    ("starcoder", "x 123", ["x", " ", "1", "2", "3"]),
    ("falcon", "a+b=1234!", ["a", "+", "b", "=", "123", "4", "!"]),
])
def test_pre_tokenizer_splits(pre, text, pieces):
    assert PRE_TOKENIZERS[pre].split(text) == pieces


@pytest.mark.parametrize("pre", sorted(PRE_TOKENIZERS))
def test_pre_tokenizer_keeps_every_character(pre):
    text = "Hi, y'all!  \t\r\n 1234 нещо 我想 🦙.cpp $x+=~1 ' s"
    assert "".join(PRE_TOKENIZERS[pre].split(text)) == text


# --- generated vectors: every pre-tokenizer, UGM and RWKV, ids computed by llama.cpp -------

GENERATED = VOCAB_DATA / "generated"


def generated_cases():
    """(base file, metadata replaced, texts, llama.cpp's results) per variant of
    scripts/make_vocab_vectors.py (all strings of a variant in one case)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("make_vocab_vectors", REPO / "scripts" / "make_vocab_vectors.py")
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    texts = (GENERATED / "inputs.txt").read_bytes().decode("utf-8").split(maker.SEPARATOR)  # keep \r
    index = json.loads((GENERATED / "variants.json").read_text())
    cases = []
    for name, (base, replace) in maker.variants().items():
        if name not in index:  # llama.cpp refused the variant when the vectors were made
            continue
        results = [json.loads(line) for line in (GENERATED / index[name]).read_text(encoding="utf-8").splitlines()]
        assert len(results) == len(texts), name
        cases.append(pytest.param(base, replace, texts, results, id=name))
    return cases


@pytest.mark.parametrize("base, replace, texts, results", generated_cases())
def test_generated_vectors_match_llama_cpp(base, replace, texts, results):
    """Plain ids, ids with BOS/EOS and special tokens parsed, and the detokenized text."""
    tok = Tokenizer.from_metadata({**open_gguf(GENERATED / base).metadata, **replace})
    got = [{"ids": tok.tokenize(text, add_special=False),
            "special_ids": tok.tokenize(text, add_special=True, parse_special=True)} for text in texts]
    for g, want in zip(got, results):
        g["text"] = tok.detokenize(want["ids"])
    wrong = [(text, g, want) for text, g, want in zip(texts, got, results) if g != want]
    assert not wrong, f"{len(wrong)}/{len(texts)} strings differ, first: {wrong[0]!r}"


def test_spm_merges_the_leftmost_pair_first_when_scores_tie():
    """llama.cpp's SPM merges the best-scoring adjacent pair, the leftmost on a tie. The ranked
    merge list that emulated it broke ties by token id instead: "aba" gave a, ba (found by the
    fuzzer: a vocabulary whose scores were all 0)."""
    from torchggml.text.tokenizer import Tokenizer
    texts = ["<unk>", "<s>", "</s>", "<0x0A>", "\u2581", "a", "b", "ba", "ab"]
    tok = Tokenizer.from_metadata({
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": texts,
        "tokenizer.ggml.scores": np.zeros(len(texts), np.float32),
        "tokenizer.ggml.token_type": np.array([2, 3, 3, 6, 1, 1, 1, 1, 1], np.int32),
        "tokenizer.ggml.add_bos_token": False})
    assert [texts[i] for i in tok.tokenize("aba")] == ["\u2581", "ab", "a"]


def _spm_targets_tie_by_definition(texts, ids, scores) -> bool:
    targets = [i for i, text in enumerate(texts) if any(text[:c] in ids and text[c:] in ids for c in range(1, len(text)))]
    return len(set(scores[targets].tolist())) < len(targets)


SPM_TIE_CASES = [  # (name, texts, scores)
    ("all-zero", ["a", "b", "ab", "ba", "aba"], [0, 0, 0, 0, 0]),
    ("distinct", ["a", "b", "ab", "ba", "aba"], [1, 2, 3, 4, 5]),
    ("tie-between-pieces-only", ["a", "b", "ab", "ba", "aba"], [1, 1, 3, 4, 5]),
    ("tie-between-targets", ["a", "b", "ab", "ba", "aba"], [1, 2, 3, 3, 5]),
    ("tie-target-and-piece", ["a", "b", "ab", "ba", "aba"], [3, 2, 3, 4, 5]),
    ("signed-zeros-tie", ["a", "b", "ab", "ba"], [1, 2, -0.0, 0.0]),
    ("nan-never-ties", ["a", "b", "ab", "ba"], [1, 2, float("nan"), float("nan")]),
    ("empty", [], []),
]


@pytest.mark.parametrize("texts, scores", [c[1:] for c in SPM_TIE_CASES], ids=[c[0] for c in SPM_TIE_CASES])
def test_spm_tie_check_equals_its_definition(texts, scores):
    """spm_encoder's choice (tied merge targets: the pair encoder) checks only the tokens whose
    score another token shares; it gives what checking every token gives."""
    from torchggml.text.tokenizer_models import spm_targets_tie
    ids, scores = {t: i for i, t in enumerate(texts)}, np.array(scores, np.float32)
    assert spm_targets_tie(texts, ids, scores) == _spm_targets_tie_by_definition(texts, ids, scores)


def test_spm_tie_check_on_random_vocabularies():
    from torchggml.text.tokenizer_models import spm_targets_tie
    rng = np.random.default_rng(0)
    for _ in range(200):
        texts = sorted({"".join(rng.choice(list("abc"), rng.integers(1, 4))) for _ in range(rng.integers(1, 12))})
        ids, scores = {t: i for i, t in enumerate(texts)}, rng.integers(0, 6, len(texts)).astype(np.float32)
        assert spm_targets_tie(texts, ids, scores) == _spm_targets_tie_by_definition(texts, ids, scores), texts


def test_a_wordpiece_vocabulary_with_byte_tokens_is_refused():
    """llama.cpp aborts loading such a vocabulary (it cannot turn a WordPiece byte token into its
    byte); it used to tokenize here (found by the fuzzer: an SPM vocabulary relabelled 'bert')."""
    from torchggml.text.tokenizer import Tokenizer, TokenizerError
    texts = ["[PAD]", "<0x00>", "[UNK]", "[CLS]", "[SEP]", "hello"]
    with pytest.raises(TokenizerError, match=r"token 1 \('<0x00>'\) is a byte token, which a WordPiece"):
        Tokenizer.from_metadata({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": texts,
                                 "tokenizer.ggml.token_type": np.array([3, 6, 2, 3, 3, 1], np.int32)}).tokenize("hello")


BYTE_TOKENS = [  # (id, vocabulary model, byte token's text, the byte or the error llama.cpp gives)
    ("spm", "llama", "<0x41>", b"A"),
    ("bpe-gemma-style", "gpt2", "<0x0A>", b"\n"),
    ("malformed-reads-as-strtol", "llama", "<0xZZ>", b"\x00"),  # strtol("ZZ", 16) = 0
    ("bpe-too-short", "gpt2", "\u012c", r"v\.gguf: token 1 \('\u012c'\) is a byte token but not of the form"),
]


@pytest.mark.parametrize("model,text,want", [c[1:] for c in BYTE_TOKENS], ids=[c[0] for c in BYTE_TOKENS])
def test_byte_tokens_render_as_llama_cpp_reads_them(model, text, want):
    """llama.cpp renders every token at load; a byte token under 3 bytes fails there
    (substr(3, 2)), so it must be refused here (found by the fuzzer: a BPE token retyped BYTE)."""
    from torchggml.text.tokenizer import Tokenizer, TokenizerError
    metadata = {"tokenizer.ggml.model": model, "tokenizer.ggml.tokens": ["<unk>", text, "a"],
                "tokenizer.ggml.token_type": np.array([2, 6, 1], np.int32), "tokenizer.ggml.merges": [],
                "tokenizer.ggml.scores": np.zeros(3, np.float32)}
    if isinstance(want, str):
        with pytest.raises(TokenizerError, match=want):
            Tokenizer.from_metadata(metadata, source="v.gguf")
    else:
        assert Tokenizer.from_metadata(metadata, source="v.gguf").token_to_piece_bytes(1) == want


def test_merges_whose_parts_are_not_tokens_are_a_named_error():
    """`tokenizers` refused such merges with a bare Exception naming no file (found by the
    fuzzer: a token of the Llama 3 vocabulary renamed)."""
    from torchggml.text.tokenizer import Tokenizer, TokenizerError
    tok = Tokenizer.from_metadata({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2",
                                   "tokenizer.ggml.tokens": ["a", "b", "ab", "xab"],
                                   "tokenizer.ggml.merges": ["a b", "x ab"]}, source="v.gguf")
    with pytest.raises(TokenizerError, match=r"v\.gguf: tokenizer\.ggml\.merges do not fit the vocabulary"):
        tok.tokenize("ab")


def test_rwkv_text_no_token_covers_is_a_named_error_without_an_unknown_token():
    """It used to put None among the ids (a TypeError naming nothing; llama.cpp emits -1)."""
    from torchggml.text.tokenizer import Tokenizer
    tok = Tokenizer.from_metadata({"tokenizer.ggml.model": "rwkv", "tokenizer.ggml.tokens": ["a", "b"]},
                                  source="w.gguf")
    with pytest.raises(ValueError, match=r"w\.gguf: no token starts with byte 0x63 and the vocabulary has no unknown"):
        tok.tokenize("abc")


def test_rwkv_tokens_listed_twice_map_to_the_last_id():
    """llama.cpp's trie keeps the last id of a byte string listed twice ("\\," and "," are both
    ","); the first was kept here (found by the fuzzer: an SPM vocabulary relabelled 'rwkv')."""
    from torchggml.text.tokenizer import Tokenizer
    texts = ["<unk>", "a", "\\,", ",", "<"]
    tok = Tokenizer.from_metadata({"tokenizer.ggml.model": "rwkv", "tokenizer.ggml.tokens": texts,
                                   "tokenizer.ggml.unknown_token_id": 0})
    assert tok.tokenize("a,") == [1, 3]


def test_a_vocabulary_whose_bytes_are_not_tokens_is_not_rwkv():
    """llama.cpp's RWKV matcher loops without end (std::bad_alloc) on text starting with a byte
    that begins tokens but is not one itself; RWKV vocabularies list all 256 bytes, so such a
    vocabulary is refused by name (found by the fuzzer: an SPM vocabulary relabelled 'rwkv')."""
    from torchggml.text.tokenizer import Tokenizer, TokenizerError
    tok = Tokenizer.from_metadata({"tokenizer.ggml.model": "rwkv", "tokenizer.ggml.tokens": ["<unk>", "<", "a", "bc"],
                                   "tokenizer.ggml.unknown_token_id": 0}, source="w.gguf")
    with pytest.raises(TokenizerError, match=r"^w\.gguf: not an RWKV vocabulary: byte 0x62 begins tokens"):
        tok.tokenize("a")


FIM_TEXTS = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|fim_repo|>", "<|file_sep|>"]
FIM_KEYS = ["fim_pre_token_id", "suffix_token_id", "fim_mid_token_id", "fim_pad_token_id", "fim_rep_token_id",
            "fim_sep_token_id"]  # suffix_token_id: llama.cpp's deprecated key, still read


def fim_vocab(out, how: str, source: str | None = None) -> str:
    """The demo model's file with FIM tokens in its last six ids: found by their texts (how
    "texts", Qwen's), or named by metadata keys on other texts (how "keys"); "none": as it is."""
    from torchggml.gguf.writer.demo import demo_model_path
    from torchggml.gguf.writer.rewrite import header_parts, serialize
    kvs, tensors, alignment, data = header_parts(source or demo_model_path())
    if how != "none":
        values = {k: v for k, _, v in kvs}
        tokens, types = list(values["tokenizer.ggml.tokens"]), list(values["tokenizer.ggml.token_type"])
        first = len(tokens) - len(FIM_TEXTS)
        gone = set(tokens[first:])
        names = FIM_TEXTS if how == "texts" else [f"<X{i}>" for i in range(len(FIM_TEXTS))]
        tokens[first:], types[first:] = names, [3] * len(names)
        merges = [m for m in values["tokenizer.ggml.merges"] if m.replace(" ", "") not in gone]
        replaced = {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges}
        kvs = [[k, t, replaced.get(k, v)] for k, t, v in kvs]
        if how == "keys":
            kvs += [[f"tokenizer.ggml.{key}", "uint32", first + i] for i, key in enumerate(FIM_KEYS)]
    Path(out).write_bytes(serialize(kvs, tensors, alignment, data))
    return str(out)


@pytest.mark.parametrize("how", ["texts", "keys", "none"])
def test_fim_tokens_are_llama_cpps(how, tmp_path):
    """Tokenizer.fim_ids: the FIM tokens llama.cpp's vocabulary finds (by key, else by text)."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python (the oracle) is not installed")
    path = fim_vocab(tmp_path / f"fim-{how}.gguf", how)
    ref = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(ref.model)
    expect = {name: getattr(llama_cpp, f"llama_vocab_fim_{name}")(vocab) for name in ("pre", "suf", "mid", "pad",
                                                                                        "rep", "sep")}
    got = Tokenizer.from_gguf(path).fim_ids
    assert {k: -1 if v is None else v for k, v in got.items()} == expect
    assert (how == "none") == (got["pre"] is None)
