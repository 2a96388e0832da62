#!/usr/bin/env python
"""`torchggml quantize` side by side with llama-quantize (llama.cpp's llama_model_quantize through
llama-cpp-python): time of each and whether the two files are byte-identical.

    python scripts/bench_quantize.py [MODEL.gguf] [--types Q4_0,Q8_0,Q4_K_M] [-t 2] [--imatrix FILE]

With no MODEL it uses the generated TinyLlama-1.1B-shaped F16 file of scripts/bench_model.py
(--shape 1b; written once into the cache directory). Both run in this process, alternated per type
(llama.cpp first for odd types, torchggml first for even ones) so a machine whose speed drifts slows
both alike; each with the same thread count (-t: llama.cpp's nthread, torchggml's numba and torch
threads). The numba kernels are compiled (or loaded from numba's cache) before timing. For each type:
seconds of each, the ratio, and "identical" or the first differing byte with the tensor (or header
region) it falls in. Needs llama-cpp-python.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DEFAULT_TYPES = ("Q4_0", "Q8_0", "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_XS")


def llama_quantize(src: str, dst: str, ftype: str, threads: int, imatrix: str | None) -> None:
    import llama_cpp
    from torchggml.tools.quantize import FILE_TYPES, filter_imatrix, load_imatrix
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FILE_TYPES[ftype][0]
    params.nthread = threads
    params.allow_requantize = True  # as torchggml's side (a quantized source is requantized by both)
    keep = []
    if imatrix:
        weights, _ = load_imatrix(imatrix)
        weights = filter_imatrix(weights, None, None)
        entries = (llama_cpp.llama_model_imatrix_data * (len(weights) + 1))()
        for i, (name, values) in enumerate(weights.items()):
            values = np.ascontiguousarray(values, dtype=np.float32)
            keep.append((name.encode(), values))
            entries[i].name = keep[-1][0]
            entries[i].data = values.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            entries[i].size = values.size
        params.imatrix = ctypes.cast(entries, type(params.imatrix))
    if llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama_model_quantize failed for {ftype}")


def torchggml_quantize(src: str, dst: str, ftype: str, imatrix: str | None) -> None:
    from torchggml.tools.quantize import quantize_file
    quantize_file(src, dst, ftype, imatrix=imatrix, allow_requantize=True)


def first_difference(a: str, b: str) -> str:
    """'identical', or where the two files first differ (a tensor's name or the header)."""
    import gguf
    x, y = np.memmap(a, np.uint8, mode="r"), np.memmap(b, np.uint8, mode="r")
    n = min(x.size, y.size)
    step = 1 << 24
    for start in range(0, n, step):
        ne = np.nonzero(x[start:start + step] != y[start:start + step])[0]
        if ne.size:
            at = start + int(ne[0])
            break
    else:
        return "identical" if x.size == y.size else f"sizes differ ({x.size} vs {y.size} bytes)"
    r = gguf.GGUFReader(a)
    for t in r.tensors:
        if t.data_offset <= at < t.data_offset + t.n_bytes:
            return f"differ from byte {at} (tensor {t.name}, {t.tensor_type.name})"
    return f"differ from byte {at} (header: metadata or tensor infos)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", help="source GGUF (default: the generated 1.1B-shaped F16 file)")
    ap.add_argument("--types", default=",".join(DEFAULT_TYPES))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--imatrix", help="importance matrix for both (llama.cpp's GGUF or .dat)")
    ap.add_argument("--keep", action="store_true", help="keep the output files (printed)")
    args = ap.parse_args(argv)
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("bench_quantize: llama-cpp-python is not installed (pip install llama-cpp-python)", file=sys.stderr)
        return 1
    import numba
    import torch
    from torchggml.devices.cpu.quantize import NATIVE_TYPES, quantize_native
    src = args.model
    if src is None:
        from bench_model import bench_config
        from torchggml.gguf.writer.demo import generated_model
        src = generated_model(bench_config("1b"), "F16")
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    torch.set_num_threads(args.threads)
    for t in NATIVE_TYPES:  # compile (or load) the kernels before timing: float32 and float16 rows
        for dtype in (np.float32, np.float16):
            quantize_native(t, np.ones((2, 256), dtype))
    print(f"source: {src} ({os.path.getsize(src) / 2**30:.2f} GiB), {args.threads} threads"
          + (f", imatrix {args.imatrix}" if args.imatrix else ""))
    print(f"{'type':8s} {'llama.cpp s':>12s} {'torchggml s':>12s} {'ratio':>6s}  bytes")
    out_dir = tempfile.mkdtemp(prefix="bench_quantize_")
    for i, ftype in enumerate(t.strip().upper() for t in args.types.split(",")):
        ours, theirs = os.path.join(out_dir, f"torchggml-{ftype}.gguf"), os.path.join(out_dir, f"llama-{ftype}.gguf")
        runs = [("llama", lambda: llama_quantize(src, theirs, ftype, args.threads, args.imatrix)),
                ("torchggml", lambda: torchggml_quantize(src, ours, ftype, args.imatrix))]
        seconds = {}
        for name, run in (runs if i % 2 == 0 else runs[::-1]):
            start = time.perf_counter()
            run()
            seconds[name] = time.perf_counter() - start
        same = first_difference(ours, theirs)
        print(f"{ftype:8s} {seconds['llama']:12.2f} {seconds['torchggml']:12.2f} "
              f"{seconds['torchggml'] / seconds['llama']:6.2f}  {same}", flush=True)
        if not args.keep:
            os.remove(ours)
            os.remove(theirs)
    if args.keep:
        print(f"outputs in {out_dir}")
    else:
        os.rmdir(out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
