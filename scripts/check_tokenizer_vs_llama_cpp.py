"""Compare torchggml's tokenizer with llama.cpp (through llama-cpp-python) on any GGUF
vocabulary, optionally under every pre-tokenizer name:

    python scripts/check_tokenizer_vs_llama_cpp.py VOCAB.gguf [--all-pre]

For each variant, every string of the test inputs (llama.cpp's test strings and a few more)
is tokenized both ways (plain; with add_special and parse_special) and the plain ids are
detokenized; the script prints matches per variant and the first difference.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import make_vocab_vectors as vectors  # noqa: E402


def main() -> int:
    from torchggml.gguf.loader import open_gguf
    from torchggml.text.tokenizer import Tokenizer
    from torchggml.text.tokenizer_pre import PRE_TOKENIZERS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("vocab", type=Path)
    parser.add_argument("--all-pre", action="store_true",
                        help="also every tokenizer.ggml.pre of the same kind (byte-level or not)")
    args = parser.parse_args()
    metadata = open_gguf(args.vocab).metadata
    variants = {"as is": {}}
    if args.all_pre:
        byte_level = PRE_TOKENIZERS.get(str(metadata.get("tokenizer.ggml.pre", "default")), PRE_TOKENIZERS["default"]).byte_encode
        variants.update({name: {"tokenizer.ggml.pre": name} for name, pre in PRE_TOKENIZERS.items()
                         if pre.byte_encode == byte_level})
    texts, failed = vectors.inputs(), 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, replace in variants.items():
            path = Path(tmp) / "variant.gguf"
            vectors.write_variant(args.vocab, replace, path)
            want = vectors._in_child(path, texts)
            if want is None:
                print(f"{name}: llama.cpp refuses it")
                continue
            tok = Tokenizer.from_metadata({**metadata, **replace})
            got = [{"ids": tok.tokenize(t, add_special=False),
                    "special_ids": tok.tokenize(t, add_special=True, parse_special=True),
                    "text": tok.detokenize(w["ids"])} for t, w in zip(texts, want)]
            wrong = [(t, g, w) for t, g, w in zip(texts, got, want) if g != w]
            failed += bool(wrong)
            print(f"{name}: {len(texts) - len(wrong)}/{len(texts)}" + (f"  first difference: {wrong[0]!r}" if wrong else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
