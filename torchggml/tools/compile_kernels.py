"""`torchggml compile-kernels`: compile the CPU's numba kernels ahead of the first model.

numba compiles a kernel for this CPU on its first call and keeps it in its disk cache; without
this step the first prompt after an install waits for the compiles (~12 CPU seconds). Here a
small llama model in each common weight type (written to a temporary directory) runs a prompt
(the dequantize + GEMM path) and a token (the fused matvecs), which compiles exactly the
kernels, for exactly the argument types, that real models of those types use: the kernels do
not depend on sizes. Run it after installing (or in a container image's build).
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

# a file type for every block type the CPU runs (the mixes' other layers add Q4_K, Q5_K, Q6_K)
FILE_TYPES = ("F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M",
              "Q6_K", "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_M", "IQ2_XS", "IQ2_XXS", "IQ1_M", "IQ1_S")


def compile_kernels(file_types=FILE_TYPES, log=None) -> float:
    """Run a prompt and a token of a small model in each of file_types on the CPU (compiling
    what is not cached); returns the CPU seconds it took."""
    from ..gguf.writer.tiny import TinyCase, write_tiny_model
    from ..models import load_model
    from ..models.warmup import compile_prompt_kernels
    from .quantize import quantize_file
    start = time.process_time()
    # a llama (the common graph), rows of 256 values for the K-quants
    case = TinyCase("compile-kernels", "llama", n_embd=256, head_dim=64, n_ff=512)
    with tempfile.TemporaryDirectory(prefix="torchggml-compile-") as tmp:
        source = write_tiny_model(os.path.join(tmp, "F32.gguf"), case, "F32")
        imatrix = _ones_imatrix(source, os.path.join(tmp, "imatrix.gguf"))  # the IQ grid types need one
        for file_type in file_types:
            path = os.path.join(tmp, f"{file_type}.gguf")
            quantize_file(source, path, file_type, imatrix=imatrix)
            model = load_model(path, n_ctx=64, n_batch=32, progress=False, devices=["CPU"])
            try:
                model.eval(list(range(1, 17)))  # a micro-batch: dequantize + GEMM
                model.eval([17])                # a token: the fused matvecs
            finally:
                model.close()
            if log:
                log(f"  {file_type}: {time.process_time() - start:.1f} CPU s")
    compile_prompt_kernels()
    return time.process_time() - start


def _ones_imatrix(source: str, path: str) -> str:
    """An importance matrix of ones for every matrix of the model (the quantizers' weighted path)."""
    import torch
    from ..gguf.loader import open_gguf
    from .imatrix import write_imatrix
    f = open_gguf(source)
    stats = {name: [torch.ones(1, t.ne[0]), torch.tensor([1])] for name, t in f.tensors.items()
             if name.startswith("blk.") and len(t.ne) >= 2 and "norm" not in name}
    f.close()
    write_imatrix(path, stats, ["ones"], 1, 1)
    return path


def cmd_compile_kernels(args) -> int:
    from ..devices.cpu.jit.loader import numba_available
    if not numba_available():
        print("numba is not installed: the CPU runs torch's kernels, nothing to compile", file=sys.stderr)
        return 0
    types = args.types.split(",") if args.types else FILE_TYPES
    print(f"compiling the CPU kernels for {', '.join(types)} models...", file=sys.stderr, flush=True)
    seconds = compile_kernels(types, log=lambda line: print(line, file=sys.stderr, flush=True))
    print(f"done in {seconds:.1f} CPU s; numba's cache now holds them for every later process", file=sys.stderr)
    return 0
