"""torchggml's perplexity next to llama.cpp's on the same file, text and windows.

    PYTHONPATH=. python scripts/perplexity_vs_llama_cpp.py [MODEL] [-f TEXT] [-c 64]

llama.cpp's number is computed from llama-cpp-python's logits (logits_all=True) with the same
windows and scoring (torchggml.tools.perplexity.windows / score_window: llama-perplexity's
method), on the token ids llama.cpp's own tokenizer gives for the text. Without MODEL: the demo
model and its vocabulary's training text (three times over).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from torchggml.tools.perplexity import score_window, summarize, windows  # noqa: E402


def llama_cpp_perplexity(path: str, text: str, n_ctx: int, n_threads: int = 2):
    """(result, tokens) for llama.cpp: its tokenization, its logits, llama-perplexity's windows."""
    import llama_cpp
    llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, logits_all=True,
                          n_threads=n_threads, verbose=False)
    tokens = llm.tokenize(text.encode(), add_bos=True, special=False)
    add_bos = llama_cpp.llama_vocab_get_add_bos(llama_cpp.llama_model_get_vocab(llm.model))
    bos = llm.token_bos() if add_bos else None
    nlls = []
    for w in windows(tokens, n_ctx, bos):
        llm.reset()
        llm.eval(w)
        logits = torch.from_numpy(np.array(llm.scores[:n_ctx], dtype=np.float32))
        nlls.append(score_window(logits, w))
    llm.close()
    return summarize(nlls), tokens


def main(argv=None) -> int:
    from torchggml.gguf.writer.demo import CORPUS, demo_model_path
    from torchggml.models import load_model
    from torchggml.tools.perplexity import perplexity
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?")
    ap.add_argument("-f", "--file")
    ap.add_argument("-c", "--ctx", type=int, default=64)
    args = ap.parse_args(argv)
    path = args.model or demo_model_path()
    text = open(args.file, encoding="utf-8").read() if args.file else CORPUS * 3
    ref, ref_tokens = llama_cpp_perplexity(path, text, args.ctx)
    model = load_model(path, n_ctx=args.ctx, progress=False)
    ours = perplexity(model, text)
    same_tokens = model.tokenize(text) == ref_tokens
    print(f"{os.path.basename(path)}, windows of {args.ctx} tokens, {ours.n_windows} windows, "
          f"{ours.n_scored} tokens scored; tokenization identical to llama.cpp's: {same_tokens}")
    print(f"torchggml  PPL = {ours.ppl:.4f} +/- {ours.stderr:.5f}")
    print(f"llama.cpp  PPL = {ref.ppl:.4f} +/- {ref.stderr:.5f}")
    print(f"relative difference {abs(ours.ppl - ref.ppl) / ref.ppl:.2e}")
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
