"""Perplexity as llama-perplexity computes it.

The text is tokenized (BOS added when the vocabulary adds one) and cut into windows of n_ctx
tokens (n_tokens // n_ctx of them; a rest shorter than a window is dropped). Each window is
evaluated on an empty KV cache, its first token replaced by BOS, and only its second half is
scored: the logits at positions first = n_ctx // 2 .. n_ctx - 2 predict the tokens after them, so
every scored token has at least n_ctx / 2 tokens of context. PPL = exp(mean negative
log-likelihood); the ± is llama.cpp's: the standard error of the mean NLL, times PPL.

`windows(tokens, n_ctx, bos)` and `score_window(logits, tokens)` are the method; `perplexity`
runs it on a Model, a micro-batch (n_batch tokens) at a time (window_nll): memory holds one
micro-batch's logits, not a window's (a 262k vocabulary's 2048-token window is 2 GiB of them). scripts/perplexity_vs_llama_cpp.py runs the same windows through
llama-cpp-python's logits to compare the two on the same file.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass

import torch


@dataclass
class PerplexityResult:
    ppl: float
    stderr: float          # of PPL, as llama.cpp prints "PPL = x +/- y"
    n_windows: int
    n_scored: int
    per_window: list[float]  # the running estimate after each window (llama.cpp's [1]x,[2]y,...)
    seconds: float


def windows(tokens: list[int], n_ctx: int, bos: int | None) -> list[list[int]]:
    """The evaluation windows: consecutive n_ctx-token slices, each starting with BOS when given."""
    if n_ctx < 4:
        raise ValueError(f"perplexity: the window (n_ctx={n_ctx}) must be at least 4 tokens")
    if len(tokens) < 2 * n_ctx:
        raise ValueError(f"perplexity: the text has {len(tokens)} tokens; at least 2 * n_ctx = {2 * n_ctx} are "
                         f"needed (use a longer text or a smaller -c)")
    out = []
    for start in range(0, len(tokens) // n_ctx * n_ctx, n_ctx):
        w = list(tokens[start: start + n_ctx])
        if bos is not None:
            w[0] = bos
        out.append(w)
    return out


SCORE_BYTES = 16 << 20  # float64 rows turned to log-probabilities at a time


def score_rows(logits: torch.Tensor, targets: list[int]) -> torch.Tensor:
    """-log p(target) for each row of logits [n, n_vocab], in float64, a few rows at a time
    through two buffers made once (a 262k vocabulary's row is 2 MiB in float64: 8 rows), so
    that no large temporary is made and freed per row group: glibc keeps freed blocks under
    32 MiB in its heaps, and a perplexity run's resident memory grew by ~1 GB of them."""
    n_vocab = logits.shape[-1]
    step = max(1, min(len(targets), SCORE_BYTES // (8 * max(1, n_vocab))))
    rows, log_probs = (torch.empty(step, n_vocab, dtype=torch.float64) for _ in range(2))
    out = torch.empty(len(targets), dtype=torch.float64)
    for i in range(0, len(targets), step):
        n = min(step, len(targets) - i)
        rows[:n].copy_(logits[i: i + n])
        torch.log_softmax(rows[:n], dim=-1, out=log_probs[:n])
        t = torch.tensor(targets[i: i + n], dtype=torch.int64)
        out[i: i + n] = -log_probs[:n].gather(1, t[:, None])[:, 0]
    return out


def score_window(logits: torch.Tensor, window: list[int]) -> torch.Tensor:
    """The negative log-likelihoods of the second half of a window: logits [n_ctx, n_vocab] (every
    position's), rows first .. n_ctx-2 scored against the next token. float64 [n_ctx - 1 - first]."""
    n_ctx = len(window)
    first = n_ctx // 2
    return score_rows(logits[first: n_ctx - 1], window[first + 1: n_ctx])


def window_nll(model, window: list[int], step: int) -> torch.Tensor:
    """score_window's numbers for `window` on `model` (from an empty cache), evaluated `step`
    tokens at a time: each piece's logits are scored and dropped before the next is evaluated,
    and the first half, which is not scored, asks for no logits but its last."""
    n_ctx, first = len(window), len(window) // 2
    nlls = []
    for start in range(0, n_ctx, step):
        end = min(start + step, n_ctx)
        if end <= first:
            model.eval(window[start:end], logits="last")
            continue
        logits = model.eval(window[start:end])
        lo, hi = max(first, start), min(end, n_ctx - 1)  # rows lo..hi-1 predict tokens lo+1..hi
        nlls.append(score_rows(logits[lo - start: hi - start], window[lo + 1: hi + 1]))
        del logits
    return torch.cat(nlls)


def summarize(nlls: list[torch.Tensor], seconds: float = 0.0) -> PerplexityResult:
    running, total = [], torch.empty(0, dtype=torch.float64)
    for n in nlls:
        total = torch.cat([total, n])
        running.append(math.exp(float(total.mean())))
    mean = float(total.mean())
    count = total.numel()
    var = float((total * total).mean()) - mean * mean
    err = math.sqrt(var / (count - 1)) if var > 0 and count > 1 else 0.0
    ppl = math.exp(mean)
    return PerplexityResult(ppl, err * ppl, len(nlls), count, running, seconds)


def eval_window(model, w: list[int]) -> torch.Tensor:
    """Every position's logits of one window, evaluated from an empty cache."""
    with model.lock:
        model.reset()
        logits = model.eval(w)
        model.reset()
    return logits


def perplexity(model, text: str, max_windows: int | None = None, progress=None) -> PerplexityResult:
    """llama-perplexity's number for `text` on `model`, windows of model.n_ctx tokens."""
    tok = model.tokenizer
    tokens = model.tokenize(text, add_special=True)
    ws = windows(tokens, model.n_ctx, tok.bos_id if tok.add_bos else None)
    if max_windows is not None:
        ws = ws[:max_windows]
    nlls, start = [], time.perf_counter()
    for i, w in enumerate(ws):
        with model.lock:
            model.reset()
            nlls.append(window_nll(model, w, model.n_batch))
            model.reset()
        if progress is not None:
            progress(i, len(ws), summarize(nlls).ppl)
    return summarize(nlls, time.perf_counter() - start)


def model_and_text(args, params):
    """The model (windows of -c tokens, 512 by default) and the text of -f, for the commands
    that run a model over a text (perplexity, imatrix)."""
    from ..models import load_model
    with open(args.file, encoding="utf-8") as f:
        text = f.read()
    model = load_model(args.model, params.with_options(n_ctx=args.ctx_size or 512, progress=False))
    print(model.describe(), file=sys.stderr)
    return model, text


def cmd_perplexity(args, params) -> int:
    """The command, given its arguments and the ModelParams the CLI made of them."""
    model, text = model_and_text(args, params)
    print(f"perplexity: windows of {model.n_ctx} tokens, the second half of each scored", file=sys.stderr)

    def progress(i, n, ppl):
        print(f"[{i + 1}]{ppl:.4f},", end=" " if i + 1 < n else "\n", file=sys.stderr, flush=True)

    r = perplexity(model, text, args.chunks, progress)
    print(f"Final estimate: PPL = {r.ppl:.4f} +/- {r.stderr:.5f}  ({r.n_windows} windows, {r.n_scored} tokens "
          f"scored, {r.seconds:.1f} s)")
    model.close()
    return 0
