#!/usr/bin/env python
"""`torchggml quantize` and `torchggml imatrix` next to llama.cpp's on the same inputs: time, bytes
and the perplexity llama.cpp measures on each output.

    PYTHONPATH=. python scripts/quantize_vs_llama_cpp.py [--sources smollm2,gemma,1b] [--types Q4_K_M,IQ2_XS]
        [-f TEXT] [-c 128] [-t 2] [--llama-imatrix PATH/llama-imatrix] [--must-show]

Sources: the real SmolLM2-135M Q4_1 and Gemma-3-270m Q4_K_M files (requantized: --allow-requantize
on both sides) and the generated TinyLlama-1.1B-shaped F16 file of scripts/bench_model.py (--shape
1b; 1bN: the same shape with N layers). Per source and type both quantizers run in this process, alternated (scripts/bench_quantize.py's
functions), with the same threads and, for every type, the same importance matrix (torchggml's,
collected once per source on TEXT: the IQ1/IQ2/IQ3 types need one); then llama.cpp's perplexity of
each output on TEXT (scripts/perplexity_vs_llama_cpp.py: llama-cpp-python's logits, llama-perplexity's
windows of -c tokens). The 1.1B file gets no perplexity (random weights).

--must-show: per real source, the imatrix + quantize pipeline of each side on TEXT for IQ2_XS and
IQ3_S: torchggml's imatrix and quantize against llama.cpp's imatrix (the llama-imatrix binary at
--llama-imatrix, built from llama.cpp's tree; without it scripts/llama_cpp_imatrix.py: llama.cpp's
activations through llama-cpp-python's eval callback, accumulated as llama-imatrix does) and
llama_model_quantize; both outputs' perplexity by llama.cpp, and their relative difference.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from bench_quantize import first_difference, llama_quantize  # noqa: E402
from perplexity_vs_llama_cpp import llama_cpp_perplexity  # noqa: E402

REAL = os.path.expanduser("~/.cache/torchggml/real")
SOURCES = {"smollm2": os.path.join(REAL, "SmolLM2-135M-Instruct.Q4_1.gguf"),
           "gemma": os.path.join(REAL, "gemma-3-270m-q4_k_m.gguf")}
TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS",
         "IQ3_S", "IQ3_XXS", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ1_M", "IQ1_S")


def source_path(name: str) -> str:
    """smollm2, gemma, 1b (the TinyLlama-1.1B-shaped F16 file) or 1bN: that shape with N layers (the
    same row widths, 2048 and 5632; a shorter run)."""
    if name.startswith("1b"):
        from dataclasses import replace
        from bench_model import bench_config
        from torchggml.gguf.writer.demo import generated_model
        cfg = bench_config("1b")
        return generated_model(replace(cfg, n_layer=int(name[2:])) if name[2:] else cfg, "F16")
    return SOURCES[name]


def torchggml_imatrix(model_path: str, text_path: str, n_ctx: int, out: str) -> float:
    """Seconds to collect and write torchggml's imatrix of the model over the text."""
    from torchggml.models import load_model
    from torchggml.tools.imatrix import collect, write_imatrix
    start = time.perf_counter()
    model = load_model(model_path, n_ctx=n_ctx, n_batch=n_ctx, progress=False)
    collector, _, n_chunks = collect(model, open(text_path, encoding="utf-8").read())
    model.close()
    write_imatrix(out, collector.stats, [text_path], n_chunks, n_ctx)
    return time.perf_counter() - start


def llama_imatrix(binary: str | None, model_path: str, text_path: str, n_ctx: int, out: str, threads: int) -> float:
    start = time.perf_counter()
    if binary is None:
        from llama_cpp_imatrix import collect
        from torchggml.tools.imatrix import write_imatrix
        stats, n_chunks = collect(model_path, open(text_path, encoding="utf-8").read(), n_ctx, threads)
        write_imatrix(out, stats, [text_path], n_chunks, n_ctx)
        return time.perf_counter() - start
    subprocess.run([binary, "-m", model_path, "-f", text_path, "-o", out, "-c", str(n_ctx), "-b", str(n_ctx),
                    "-t", str(threads), "--no-ppl"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def ppl(path: str, text: str, n_ctx: int) -> float:
    return llama_cpp_perplexity(path, text, n_ctx)[0].ppl


def compare_types(src: str, types, text_path: str | None, n_ctx: int, threads: int, work: str, imatrix: str):
    from torchggml.tools.quantize import quantize_file
    text = open(text_path, encoding="utf-8").read() if text_path else None
    print(f"{'type':8s} {'llama.cpp s':>11s} {'torchggml s':>11s} {'ratio':>6s} {'MiB':>8s}  {'bytes':30s} ppl")
    for i, ftype in enumerate(types):
        ours, theirs = os.path.join(work, f"ours-{ftype}.gguf"), os.path.join(work, f"theirs-{ftype}.gguf")
        runs = [("llama", lambda: llama_quantize(src, theirs, ftype, threads, imatrix)),
                ("torchggml", lambda: quantize_file(src, ours, ftype, imatrix=imatrix, allow_requantize=True,
                                                 imatrix_metadata=False))]  # llama_model_quantize adds none
        seconds = {}
        for name, run in (runs if i % 2 == 0 else runs[::-1]):
            start = time.perf_counter()
            run()
            seconds[name] = time.perf_counter() - start
        same = first_difference(ours, theirs)
        p = ""
        if text is not None:
            p_ours = ppl(ours, text, n_ctx)
            p = f"{p_ours:.4f}" if same == "identical" else f"ours {p_ours:.4f} theirs {ppl(theirs, text, n_ctx):.4f}"
        print(f"{ftype:8s} {seconds['llama']:11.2f} {seconds['torchggml']:11.2f} "
              f"{seconds['torchggml'] / seconds['llama']:6.2f} {os.path.getsize(ours) / 2**20:8.2f}  {same:30s} {p}",
              flush=True)
        os.remove(ours)
        os.remove(theirs)


def must_show(src: str, text_path: str, n_ctx: int, threads: int, binary: str, work: str) -> None:
    from torchggml.tools.quantize import quantize_file
    text = open(text_path, encoding="utf-8").read()
    ours_im, theirs_im = os.path.join(work, "ours-imatrix.gguf"), os.path.join(work, "llama-imatrix.gguf")
    s_ours = torchggml_imatrix(src, text_path, n_ctx, ours_im)
    s_theirs = llama_imatrix(binary, src, text_path, n_ctx, theirs_im, threads)
    print(f"imatrix: torchggml {s_ours:.1f} s, llama.cpp's ({binary or 'through llama-cpp-python'}) {s_theirs:.1f} s")
    for ftype in ("IQ2_XS", "IQ3_S"):
        ours, theirs = os.path.join(work, f"ours-{ftype}.gguf"), os.path.join(work, f"theirs-{ftype}.gguf")
        quantize_file(src, ours, ftype, imatrix=ours_im, allow_requantize=True)
        llama_quantize(src, theirs, ftype, threads, theirs_im)
        a, b = ppl(ours, text, n_ctx), ppl(theirs, text, n_ctx)
        print(f"{ftype}: torchggml imatrix+quantize PPL {a:.4f}, llama.cpp imatrix+quantize PPL {b:.4f}, "
              f"relative difference {(a - b) / b:+.2%}", flush=True)
        os.remove(ours)
        os.remove(theirs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sources", default="smollm2,gemma,1b")
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("-f", "--file", default="/usr/share/common-licenses/GPL-3", help="the text (imatrix and PPL)")
    ap.add_argument("-c", "--ctx", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--llama-imatrix", help="llama.cpp's llama-imatrix binary (for --must-show)")
    ap.add_argument("--must-show", action="store_true")
    ap.add_argument("--no-ppl", action="store_true", help="time and bytes only")
    ap.add_argument("--imatrix", help="an importance matrix of the (one) source to use instead of collecting one")
    args = ap.parse_args(argv)
    import numba
    import torch
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    torch.set_num_threads(args.threads)
    types = [t.strip().upper() for t in args.types.split(",")]
    for name in args.sources.split(","):
        src = source_path(name)
        print(f"\n== {name}: {src} ({os.path.getsize(src) / 2**20:.1f} MiB), {args.threads} threads, text "
              f"{args.file}, windows of {args.ctx}", flush=True)
        with tempfile.TemporaryDirectory(prefix="quantize_vs_") as work:
            if args.must_show:
                if not name.startswith("1b"):
                    must_show(src, args.file, args.ctx, args.threads, args.llama_imatrix, work)
                continue
            imatrix = args.imatrix or os.path.join(work, "imatrix.gguf")
            if args.imatrix:
                pass
            elif name.startswith("1b"):  # random weights: an imatrix of their activations on a short text is as good
                torchggml_imatrix_small(src, args.file, imatrix)
            else:
                torchggml_imatrix(src, args.file, args.ctx, imatrix)
            compare_types(src, types, None if name.startswith("1b") or args.no_ppl else args.file, args.ctx, args.threads, work,
                          imatrix)
    return 0


def torchggml_imatrix_small(src: str, text_path: str, out: str) -> None:
    """The 1.1B file's imatrix from two chunks of 64 tokens (its weights are random)."""
    from torchggml.models import load_model
    from torchggml.tools.imatrix import collect, write_imatrix
    model = load_model(src, n_ctx=64, n_batch=64, progress=False)
    collector, _, n = collect(model, open(text_path, encoding="utf-8").read(), max_chunks=2)
    model.close()
    write_imatrix(out, collector.stats, [text_path], n, 64)


if __name__ == "__main__":
    sys.exit(main())
