"""Fused products over the (q, scale, bias) layout, compiled by numba for the host CPU.

numba_kernels() holds:
    matvec(q, scale, bias, has_bias, kind, w_row0, xq, xd, xsum, x_row, out)
        out[m, n] = sum_k W[w_row0[m] + n, k] x[x_row[m], k]
    quantize_rows(x, g, xq, xd, xsum)                  activations to int8 per group of g
    dequantize_rows / dequantize_nibbles / dequantize_six_bits(..., out)
        out[n, k] = W[n, k], float32 or bfloat16 bits (the prompt path's GEMM weight)

q: int8 [rows, K], or packed uint8 (kind 4/-4: two 4-bit values a byte; kind 6: Q6_K's 6-bit
values, 24 bytes per 32); scale f32 [rows, K/G] (or float16 bits as int16), bias f32 (unused
when has_bias is False); xq int8 [X, K] and xd f32 [X, K/G] the activations rounded as ggml's
Q8_0 vec_dot type rounds them, xsum f32 [X, K/G] their group sums (for the bias); out f32 [M, N].
w_row0 and x_row (int64 [M]) pick each output row's weight matrix (its first row in q, where
MUL_MAT_ID's experts lie stacked) and activation row; MUL_MAT passes zeros and 0..M-1.

The kernels are in jit_kernels.py, their LLVM IR in llvm_ir.py. Why this shape: numba types
int8*int8 products as int64, so an integer dot written as a numba
loop stays scalar (~2 GB/s). The row's dot product is instead one LLVM vector loop emitted by an
intrinsic (_row_dot_intrinsic) that keeps 8 float lanes across groups and multiplies bytes with
the CPU's byte dot instruction, as ggml's SIMD kernels do: vpdpbusd on AVX512-VNNI/AVX-VNNI,
vpmaddubsw + vpmaddwd on AVX2 (chosen from numba's target features), LLVM's own lowering of a
widening multiply elsewhere (NEON sdot/smlal, SSE). One AVX-512 Zen 4 core, 2816x1024 matvec
(thread CPU time): int8 groups of 32 / 4-bit / int8 groups of 16: 108 / 112 / 120 us, against
204 / 260 / 373 us with a horizontal sum per group and 184 / 189 / 240 us with LLVM's widening
multiply.
"""
from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def numba_kernels():
    """The kernels (matvec, quantize_rows, dequantize_rows, dequantize_nibbles,
    dequantize_six_bits) as a module (jit_kernels), compiled on first use and cached on disk."""
    from . import jit_kernels
    return jit_kernels


def numba_available() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def set_numba_threads(n: int) -> None:
    """numba's worker count, capped at the pool it started with."""
    import numba
    numba.set_num_threads(max(1, min(int(n), numba.config.NUMBA_NUM_THREADS)))
