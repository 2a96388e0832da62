"""Prompt-processing and generation speed, as llama-bench measures them.

    torchggml bench MODEL [-p 512] [-n 128] [-r 5] [model options]

Each test runs on an empty KV cache: ppN evaluates N tokens (in micro-batches of -b), tgN
generates N tokens one at a time; both from random token ids (as llama-bench does, so the text
does not matter). A warm-up run comes first (not counted); the table gives the mean ± standard
deviation of tokens/s over -r repetitions, in llama-bench's markdown layout.
"""
from __future__ import annotations

import statistics
import sys
import time

import torch


def _time_prompt(model, tokens: list[int]) -> float:
    model.reset()
    start = time.perf_counter()
    model.eval(tokens, logits="last")
    return time.perf_counter() - start


def _time_generation(model, tokens: list[int]) -> float:
    model.reset()
    start = time.perf_counter()
    for t in tokens:
        model.eval([t], logits="last")
    return time.perf_counter() - start


def run_test(model, kind: str, n: int, repetitions: int, warmup: bool = True, seed: int = 0) -> list[float]:
    """Tokens/s of each repetition of one test ("pp" or "tg" with n tokens)."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.n_vocab, (n,), generator=gen).tolist()
    timer = _time_prompt if kind == "pp" else _time_generation
    if warmup:
        timer(model, tokens if kind == "pp" else tokens[:1])
    speeds = [n / timer(model, tokens) for _ in range(repetitions)]
    model.reset()
    return speeds


def model_label(model) -> tuple[str, str, str]:
    """(model, size, params) as llama-bench prints them."""
    f = model.file
    ftype = f.get("general.file_type", None)
    try:
        import gguf
        kind = gguf.LlamaFileType(ftype).name.replace("MOSTLY_", "") if ftype is not None else ""
    except (ImportError, ValueError):
        kind = str(ftype)
    n_bytes = sum(t.nbytes for t in f.tensors.values())
    n_params = sum(t.n_elements for t in f.tensors.values())
    size = f"{n_bytes / 2**30:.2f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:.2f} MiB"
    params = f"{n_params / 1e9:.2f} B" if n_params >= 1e9 else f"{n_params / 1e6:.2f} M"
    return f"{model.hp.arch} {kind}".strip(), size, params


def markdown_table(header, rows) -> str:
    """llama-bench's layout: | cells | under a | --- | rule."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), line("-" * w for w in widths), *map(line, rows)])


def cmd_bench(args, params) -> int:
    """The command, given its arguments and the ModelParams the CLI made of them."""
    from ..models import load_model
    tests = [("pp", n) for n in args.n_prompt if n > 0] + [("tg", n) for n in args.n_gen if n > 0]
    if not tests:
        print("bench: nothing to run (-p and -n are all 0)", file=sys.stderr)
        return 2
    need = max(n for _, n in tests)
    params = params.with_options(progress=False, n_ctx=max(args.ctx_size or 0, need))
    model = load_model(args.model, params)
    label, size, n_params = model_label(model)
    backend = ",".join(sorted({d.get_name() for d in model.placement.devices}))
    threads = str(args.threads) if args.threads else str(torch.get_num_threads())
    header = ("model", "size", "params", "backend", "threads", "test", "t/s")
    rows = []
    for kind, n in tests:
        speeds = run_test(model, kind, n, args.repetitions, not args.no_warmup)
        sd = statistics.stdev(speeds) if len(speeds) > 1 else 0.0
        rows.append((label, size, n_params, backend, threads, f"{kind}{n}",
                     f"{statistics.mean(speeds):.2f} ± {sd:.2f}"))
        print(f"{kind}{n}: {rows[-1][-1]} t/s", file=sys.stderr)
    print(markdown_table(header, rows))
    model.close()
    return 0
