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

# the weight types models ship in; the K-quant mixes hold Q4_K/Q5_K and Q6_K, F16 the half GEMM
FILE_TYPES = ("F16", "Q8_0", "Q4_0", "Q4_K_M", "Q5_K_M")


def compile_kernels(file_types=FILE_TYPES, log=None) -> float:
    """Run a prompt and a token of a small model in each of file_types on the CPU (compiling
    what is not cached); returns the CPU seconds it took."""
    from ..gguf.writer.tiny import TinyCase, write_tiny_model
    from ..models import load_model
    from .quantize import quantize_file
    start = time.process_time()
    # a llama (the common graph), rows of 256 values for the K-quants
    case = TinyCase("compile-kernels", "llama", n_embd=256, head_dim=64, n_ff=512)
    with tempfile.TemporaryDirectory(prefix="torchggml-compile-") as tmp:
        source = write_tiny_model(os.path.join(tmp, "F32.gguf"), case, "F32")
        for file_type in file_types:
            path = os.path.join(tmp, f"{file_type}.gguf")
            quantize_file(source, path, file_type)
            model = load_model(path, n_ctx=64, n_batch=32, progress=False, devices=["CPU"])
            try:
                model.eval(list(range(1, 17)))  # a micro-batch: dequantize + GEMM
                model.eval([17])                # a token: the fused matvecs
            finally:
                model.close()
            if log:
                log(f"  {file_type}: {time.process_time() - start:.1f} CPU s")
    _compile_prompt_kernels()
    return time.process_time() - start


def _compile_prompt_kernels() -> None:
    """The threaded kernels a real prompt's nodes take past the small-node limit (softmax,
    norms, swiglu), with the model graphs' argument types (F32 rows, the KV cache's F16 mask as
    uint16 bits, gate and up as separate tensors or halves of one), which the small model's
    prompt is too short to reach."""
    import numpy as np
    from ..devices.cpu.jit.loader import op_kernels
    ops = op_kernels()
    x = np.zeros((1, 2, 2, 8), np.float32)
    padded = np.zeros((1, 1, 4, 8), np.uint16)
    for mask in (padded[:, :, :2], padded[:, :, :2].copy()):  # the mask's padded rows cut or not
        ops.soft_max_rows(x, np.empty_like(x), mask, np.ones(2, np.float32), np.zeros(1, np.float32),
                          np.float32(1.0), True, False)
    ops.row_norm_rows(x, np.empty_like(x), np.float32(1e-5), True)
    both = np.zeros((1, 2, 2, 16), np.float32)
    for a, g in ((x, x), (both[..., :8], both[..., 8:])):
        ops.swiglu_rows(a, g, np.empty_like(x))


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
