"""llama.cpp's outputs on the two real models, recorded once for tests/test_real_models.py.

    python scripts/fetch_real_models.py && python scripts/make_real_model_refs.py

With llama-cpp-python (its llama.cpp) on the files scripts/fetch_real_models.py fetches, writes
tests/data/real_models/llama_cpp.json: per model, the token ids of PROMPTS (tokenized with the
vocabulary's special tokens added, as llama.cpp's tokenizer does), the greedy continuation of
GREEDY_PROMPTS (argmax of llama.cpp's logits, GREEDY_TOKENS tokens or until end of generation),
the perplexity of tests/data/real_models/text.txt with windows of PPL_CTX tokens (llama-perplexity's
method: scripts/perplexity_vs_llama_cpp.py), llama.cpp's relative error against the float64
reference (tests/real_model_reference.py) on the text's first LONG_PROMPT_TOKENS tokens (one
micro-batch), and the chat prompts: SmolLM2's own template as
llama-cpp-python renders it, and llama.cpp's built-in chatml and gemma formats
(llama_chat_apply_template).
"""
from __future__ import annotations

import ctypes
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from fetch_real_models import MODELS, cache_dir  # noqa: E402

DATA = ROOT / "tests" / "data" / "real_models"
PROMPTS = ["Hello world", "The capital of France is", " leading space, and  double  spaces\n\nnew lines\ttab",
           "Numbers 1234567 and 3.14159; émigré naïve 日本語 🙂", "def f(x):\n    return x**2  # squared"]
GREEDY_PROMPTS = ["The capital of France is", "Once upon a time, there was a"]
GREEDY_TOKENS = 12
PPL_CTX = 256
LONG_PROMPT_TOKENS = 64  # a prompt long enough for the products' GEMMs (16 rows and more)
CHAT = [{"role": "system", "content": " Answer briefly. "}, {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"}, {"role": "user", "content": " And 3+3? "}]


def greedy(llm, llama_cpp, ids: list[int]) -> list[int]:
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    llm.reset()
    llm.eval(ids)
    out = []
    for _ in range(GREEDY_TOKENS):
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(tok)
        if llama_cpp.llama_vocab_is_eog(vocab, tok):
            break
        llm.eval([tok])
    return out


def builtin_chat(llama_cpp, name: str, messages) -> str:
    arr = (llama_cpp.llama_chat_message * len(messages))(
        *[llama_cpp.llama_chat_message(m["role"].encode(), m["content"].encode()) for m in messages])
    buf = ctypes.create_string_buffer(8192)
    n = llama_cpp.llama_chat_apply_template(name.encode(), arr, len(messages), True, buf, len(buf))
    assert 0 < n < len(buf), (name, n)
    return buf.raw[:n].decode()


def long_prompt(llm, path: Path) -> dict:
    """The text's first tokens and llama.cpp's relative error (every position's logits) from
    the float64 reference; `llm` was made with logits_all."""
    sys.path.insert(0, str(ROOT / "tests"))
    from real_model_reference import logits
    text = (DATA / "text.txt").read_text(encoding="utf-8")
    ids = llm.tokenize(text.encode(), add_bos=True, special=False)[:LONG_PROMPT_TOKENS]
    llm.reset()
    llm.eval(ids)
    theirs = np.array(llm.scores[:len(ids)], dtype=np.float64)
    ref = logits(path, ids)
    return {"tokens": ids, "llama_cpp_error": float(np.linalg.norm(theirs - ref) / np.linalg.norm(ref))}


def record(path: Path, llama_cpp) -> dict:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter
    from perplexity_vs_llama_cpp import llama_cpp_perplexity
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, n_threads=2, logits_all=True, verbose=False)
    tokens = {p: llm.tokenize(p.encode(), add_bos=True, special=False) for p in PROMPTS}
    out = {"tokens": tokens, "greedy": {p: greedy(llm, llama_cpp, tokens.get(p) or llm.tokenize(p.encode()))
                                        for p in GREEDY_PROMPTS}}
    template = llm.metadata.get("tokenizer.chat_template")
    if template:  # llama-cpp-python's chat: the file's Jinja template, its BOS and EOS texts
        text = lambda i: llm._model.token_get_text(i) if i >= 0 else ""  # noqa: E731
        fmt = Jinja2ChatFormatter(template=template, eos_token=text(llm.token_eos()), bos_token=text(llm.token_bos()))
        prompt = fmt(messages=CHAT[1:]).prompt
        out["chat"] = {"messages": CHAT[1:], "prompt": prompt,
                       "tokens": llm.tokenize(prompt.encode(), add_bos=False, special=True)}
    out["long_prompt"] = long_prompt(llm, path)
    llm.close()
    text = (DATA / "text.txt").read_text(encoding="utf-8")
    ppl, _ = llama_cpp_perplexity(str(path), text, PPL_CTX)
    out["perplexity"] = {"n_ctx": PPL_CTX, "windows": ppl.n_windows, "ppl": ppl.ppl}
    return out


def main() -> int:
    import llama_cpp
    root = cache_dir()
    if sys.argv[1:] == ["--long-prompt"]:  # only that entry, the rest kept
        refs = json.loads((DATA / "llama_cpp.json").read_text(encoding="utf-8"))
        for model in MODELS:
            llm = llama_cpp.Llama(model_path=str(root / model.file), n_ctx=256, n_threads=2, logits_all=True, verbose=False)
            refs[model.file]["long_prompt"] = long_prompt(llm, root / model.file)
            llm.close()
            print(f"{model.file}: {refs[model.file]['long_prompt']['llama_cpp_error']:.4f}", file=sys.stderr)
        (DATA / "llama_cpp.json").write_text(json.dumps(refs, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        return 0
    refs = {"llama_cpp_python": llama_cpp.__version__, "greedy_tokens": GREEDY_TOKENS,
            "builtin_chat": {"messages": CHAT, **{name: builtin_chat(llama_cpp, name, CHAT) for name in ("chatml", "gemma")}}}
    for model in MODELS:
        refs[model.file] = record(root / model.file, llama_cpp)
        print(f"{model.file}: recorded", file=sys.stderr)
    (DATA / "llama_cpp.json").write_text(json.dumps(refs, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
