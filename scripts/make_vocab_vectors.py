"""Tokenizer test vectors for the vocabulary types and pre-tokenizers that llama.cpp's own
test files do not cover, computed by llama.cpp itself (through llama-cpp-python).

Three small vocabularies are trained with `tokenizers` on a multilingual corpus and written as
vocabulary-only GGUF files in tests/data/vocab/generated (tens of KB, committed):

- bpe.gguf:     byte-level BPE (GPT-2 alphabet), the base of every byte-level tokenizer.ggml.pre
- spm-bpe.gguf: SentencePiece-style BPE ("▁" for spaces, <0xXX> byte tokens): gemma4, sarvam-moe
- ugm.gguf:     Unigram pieces with scores (tokenizer.ggml.model "t5"); rwkv.gguf: the BPE
                tokens as RWKV byte strings
- t5.gguf:      a SentencePiece Unigram model with its nmt_nfkc precompiled character map
                (needs the sentencepiece package)

For every variant (a base file with tokenizer.ggml.pre or .model replaced) llama.cpp
tokenizes inputs.txt (strings separated by __ggml_vocab_test__ lines: llama.cpp's own test
strings plus a few). For every string, one JSON line of VARIANT.jsonl holds the ids with
add_special=false, parse_special=false (as in llama.cpp's .out files), the ids with
add_special=true, parse_special=true, and llama_detokenize of the first ids
(remove_special=false, unparse_special=true). variants.json names each variant's file
(aliases with the same results share one); refused.txt lists variants llama.cpp refuses.

    python scripts/make_vocab_vectors.py      # needs llama-cpp-python
"""
from __future__ import annotations

import ctypes
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
OUT = REPO / "tests" / "data" / "vocab" / "generated"
SEPARATOR = "\n__ggml_vocab_test__\n"
EXTRA_INPUTS = ["HelloWorld ÀbCdÉ camelCase XMLHttpRequest", "1234567 12345 123 1,234,567.89",
                "don't I'M we'LL you're", "line1\n\n\nline2\r\n  indented\ttab", "<sentinel:12> IMGIMGABZ",
                "Ünïcödé façade naïve", "中文字符和日本語のテキスト 한국어", "😀🦙 emoji", "  spaces   between  ",
                "<s>Hi</s> <eos> <bos>x<pad> <unk> don 't , ok . it 's ? a ' b"]


def inputs() -> list[str]:
    raw = (REPO / "tests" / "data" / "vocab" / "ggml-vocab-gpt-2.gguf.inp").read_text(encoding="utf-8")
    base = [t for t in raw.split(SEPARATOR) if t]
    base[-1] = base[-1].removesuffix(SEPARATOR.rstrip("\n"))
    return base + EXTRA_INPUTS


def corpus() -> str:
    from torchggml.gguf.writer.demo import CORPUS
    return "\n".join([CORPUS, *inputs()] * 3)


def _writer(path: Path, model: str, pre: str | None):
    import gguf
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in (("context_length", 512), ("embedding_length", 64), ("block_count", 1),
                       ("feed_forward_length", 128), ("head_count", 1)):
        getattr(w, f"add_{key}")(value)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model(model)
    if pre:
        w.add_tokenizer_pre(pre)
    return w


def _finish(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_bpe(path: Path) -> None:
    from torchggml.gguf.writer.demo import train_vocab
    v = train_vocab(3000, corpus())
    w = _writer(path, "gpt2", "gpt-2")
    w.add_token_list(v.tokens)
    w.add_token_types(v.types)
    w.add_token_merges(v.merges)
    w.add_bos_token_id(v.bos_id)
    w.add_eos_token_id(v.eos_id)
    _finish(w)


def write_spm_bpe(path: Path) -> None:
    from tokenizers import Tokenizer, models, trainers
    hf = Tokenizer(models.BPE(byte_fallback=True))
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<pad>", "<eos>", "<bos>"],
                                  show_progress=False)
    lines = [line.replace(" ", "\u2581") for line in corpus().split("\n")]
    hf.train_from_iterator(lines, trainer)
    model = json.loads(hf.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tokens = tokens[:3] + byte_tokens + [t for t in tokens[3:] if t not in byte_tokens] + ["\n", "\n\n"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    w = _writer(path, "gpt2", "gemma4")
    w.add_token_list(tokens)
    w.add_token_types([3] * 3 + [6] * 256 + [1] * (len(tokens) - 259))
    w.add_token_merges(merges)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    _finish(w)


def write_ugm(path: Path) -> None:
    from tokenizers import Tokenizer, models, trainers
    hf = Tokenizer(models.Unigram())
    trainer = trainers.UnigramTrainer(vocab_size=1500, special_tokens=["<pad>", "</s>", "<unk>"],
                                      unk_token="<unk>", show_progress=False)
    hf.train_from_iterator(["\u2581" + line.replace(" ", "\u2581") for line in corpus().split("\n")], trainer)
    pieces = json.loads(hf.to_str())["model"]["vocab"]
    w = _writer(path, "t5", None)
    w.add_token_list([p for p, _ in pieces])
    w.add_token_scores([float(s) for _, s in pieces])
    w.add_token_types([3, 3, 2] + [1] * (len(pieces) - 3))
    w.add_add_space_prefix(True)
    w.add_remove_extra_whitespaces(True)
    _finish(w)


def _protobuf_fields(data: bytes):
    """(field number, value) pairs of one protobuf message: varints as int, 32-bit values as
    bytes, length-delimited values as bytes (enough to read a SentencePiece model)."""
    pos = 0

    def varint() -> int:
        nonlocal pos
        shift = value = 0
        while True:
            b = data[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return value
    while pos < len(data):
        key = varint()
        field, wire = key >> 3, key & 7
        if wire == 0:
            yield field, varint()
        elif wire == 5:
            yield field, data[pos:pos + 4]
            pos += 4
        elif wire == 1:
            yield field, data[pos:pos + 8]
            pos += 8
        elif wire == 2:
            n = varint()
            yield field, data[pos:pos + n]
            pos += n
        else:
            raise ValueError(f"protobuf wire type {wire}")


def write_t5(path: Path) -> None:
    import io
    import struct
    import sentencepiece
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus().split("\n")), model_writer=model, vocab_size=350,
        model_type="unigram", normalization_rule_name="nmt_nfkc", character_coverage=1.0,
        minloglevel=2, pad_id=0, eos_id=1, unk_id=2, bos_id=-1, hard_vocab_limit=False)
    pieces, charsmap = [], b""
    for field, value in _protobuf_fields(model.getvalue()):
        if field == 1:  # SentencePiece {1: piece, 2: score, 3: type}
            piece = dict(_protobuf_fields(value))
            pieces.append((piece[1].decode(), struct.unpack("<f", piece.get(2, bytes(4)))[0], piece.get(3, 1)))
        elif field == 3:  # NormalizerSpec {2: precompiled_charsmap}
            charsmap = dict(_protobuf_fields(value)).get(2, b"")
    w = _writer(path, "t5", None)
    w.add_token_list([p for p, _, _ in pieces])
    w.add_token_scores([s for _, s, _ in pieces])
    w.add_token_types([{1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 6}.get(t, 1) for _, _, t in pieces])
    w.add_add_space_prefix(True)
    w.add_remove_extra_whitespaces(True)
    w.add_precompiled_charsmap(charsmap)
    _finish(w)


def write_rwkv(path: Path, bpe: Path) -> None:
    from torchggml.text.tokenizer import Tokenizer
    tok = Tokenizer.from_gguf(bpe)
    seen, tokens = set(), []
    for raw in [bytes([b]) for b in range(256)] + [tok.token_to_piece_bytes(i) for i in range(tok.n_vocab)]:
        if raw and raw not in seen:
            seen.add(raw)
            tokens.append("".join(chr(b) if 0x20 <= b < 0x7F and b != 0x5C else
                                  "\\\\" if b == 0x5C else f"\\x{b:02x}" for b in raw))
    w = _writer(path, "rwkv", None)
    w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens))
    _finish(w)


def variants() -> dict[str, tuple[str, dict]]:
    """variant name -> (base file, metadata replaced)."""
    from torchggml.text.tokenizer_pre import PRE_TOKENIZERS
    out = {}
    for name, pre in PRE_TOKENIZERS.items():
        base = "bpe.gguf" if pre.byte_encode else "spm-bpe.gguf"
        replace = {"tokenizer.ggml.pre": name}
        if name == "whitespace":  # llama.cpp's whitespace pre-tokenizer goes with its own model
            replace["tokenizer.ggml.model"] = "whitespace"
        out[f"pre-{name}"] = (base, replace)
    out["model-gemma4"] = ("spm-bpe.gguf", {"tokenizer.ggml.model": "gemma4"})
    out["ugm"] = ("ugm.gguf", {})
    out["ugm-t5-nfkc"] = ("t5.gguf", {})
    out["rwkv"] = ("rwkv.gguf", {})
    return out


def write_variant(base: Path, replace: dict, path: Path) -> None:
    """A copy of `base` with some metadata values replaced (strings only)."""
    import gguf
    from torchggml.gguf.loader import open_gguf
    src = open_gguf(base)
    w = gguf.GGUFWriter(str(path), src.arch)
    for key in src.keys:
        if key in ("general.architecture", "GGUF.version"):
            continue
        value = replace.get(key, src.get(key))
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif value and isinstance(value[0], str):
            w.add_array(key, value)
        elif key.endswith("scores"):
            w.add_array(key, [float(x) for x in value])
        elif key.endswith("precompiled_charsmap"):
            w.add_array(key, bytes(value))  # bytes: an array of UINT8
        else:
            w.add_array(key, [int(x) for x in value])
    for key, value in replace.items():
        if key not in src.keys:
            w.add_string(key, value)
    _finish(w)


_QUIET = []  # keeps the ctypes log callback alive


def llama_cpp_tokenize(path: Path, texts: list[str]) -> list[list[int]] | None:
    import llama_cpp
    if not _QUIET:
        _QUIET.append(llama_cpp.llama_log_callback(lambda *args: None))
        llama_cpp.llama_log_set(_QUIET[0], ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        return None
    vocab = llama_cpp.llama_model_get_vocab(model)

    def tokenize(raw: bytes, special: bool) -> list[int]:
        buf = (llama_cpp.llama_token * (4 * len(raw) + 16))()
        n = llama_cpp.llama_tokenize(vocab, raw, len(raw), buf, len(buf), special, special)
        return list(buf[:n])

    def detokenize(ids: list[int]) -> str:
        arr, buf = (llama_cpp.llama_token * len(ids))(*ids), ctypes.create_string_buffer(1 << 16)
        n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, len(buf), False, True)
        return buf.raw[:n].decode("utf-8", errors="replace")

    out = []
    for text in texts:
        plain = tokenize(text.encode("utf-8"), False)
        out.append({"ids": plain, "special_ids": tokenize(text.encode("utf-8"), True),
                    "text": detokenize(plain)})
    llama_cpp.llama_model_free(model)
    return out


def _in_child(path: Path, texts: list[str]):
    """llama_cpp_tokenize in a child process: llama.cpp aborts on some inputs."""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool
    try:
        with ProcessPoolExecutor(1) as pool:
            return pool.submit(llama_cpp_tokenize, path, texts).result()
    except BrokenProcessPool:
        return None


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    write_bpe(OUT / "bpe.gguf")
    write_spm_bpe(OUT / "spm-bpe.gguf")
    write_ugm(OUT / "ugm.gguf")
    write_rwkv(OUT / "rwkv.gguf", OUT / "bpe.gguf")
    write_t5(OUT / "t5.gguf")
    texts = inputs()
    (OUT / "inputs.txt").write_bytes(SEPARATOR.join(texts).encode("utf-8"))
    refused, files, index = [], {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (base, replace) in variants().items():
            path = Path(tmp) / f"{name}.gguf"
            write_variant(OUT / base, replace, path)
            cases = _in_child(path, texts)
            if cases is None:
                refused.append(name)
                continue
            text = "\n".join(json.dumps(c, ensure_ascii=False, separators=(",", ":")) for c in cases) + "\n"
            if text not in files:  # aliases of one pre-tokenizer share their file
                files[text] = f"{name}.jsonl"
                (OUT / files[text]).write_text(text, encoding="utf-8")
            index[name] = files[text]
    (OUT / "variants.json").write_text(json.dumps(index, indent=1) + "\n")
    (OUT / "refused.txt").write_text("".join(f"{n}\n" for n in refused))
    print(f"{len(index)} variants written ({len(files)} distinct), refused by llama.cpp: {refused}")


if __name__ == "__main__":
    main()
