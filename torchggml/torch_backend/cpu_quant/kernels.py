"""Fused products over the (q, scale, bias) layout, compiled by numba for the host CPU.

Why this loop shape (measured on an AVX-512 Zen 4, 2816x1024 Q8 weight, 1 thread): numba
types int8*int8 products as int64, so an integer dot product stays scalar (~2 GB/s); products
in float32 of the int8 weights and the float32 activations vectorize (vpmovsxbd, vcvtdq2ps,
vfmadd: ~8-11 GB/s of weight bytes) and are exact (int8 weights, no activation rounding), so
activations are not quantized. The per-lane accumulator `lanes` keeps LLVM's vectorizer on the
lane loop instead of an unrolled horizontal sum per group. LLVM compiles for the host CPU's
features (AVX2, AVX-512, NEON), which is what numba gives by default.

    matvec(q, scale, bias, has_bias, x, xsum, out)   out[m, n] = sum_k W[n, k] x[m, k]
    dequantize_rows(q, scale, bias, has_bias, out)   out[n, k] = W[n, k] (float32)

q int8 [N, K], scale/bias f32 [N, K/G] (bias unused when has_bias is False), x f32 [M, K],
xsum f32 [M, K/G] (the sums of x over each group, for the bias), out f32 [M, N] / [N, K].
The *_nibbles variants read 4-bit weights (Q4_0, Q4_1, Q4_K) two to a byte: the same speed in
values/s as int8 on one core (~6 G/s) from half the bytes, which is what counts once several
cores share the memory bus.
"""
from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def numba_kernels():
    """(matvec, dequantize_rows, matvec_nibbles, dequantize_nibbles), compiled on first use
    (numba caches them on disk)."""
    import numpy as np
    from numba import njit, prange, uint64

    @njit(fastmath=True, parallel=True, cache=True, nogil=True)
    def matvec(q, scale, bias, has_bias, x, xsum, out):
        n_rows, k = q.shape
        n_groups = scale.shape[1]
        g = k // n_groups
        m_rows = x.shape[0]
        for n in prange(n_rows):
            lanes = np.empty(g, np.float32)
            w = q[n]
            for m in range(m_rows):
                a = x[m]
                lanes[:] = 0
                offset = np.float32(0)
                for j in range(n_groups):
                    d = scale[n, j]
                    if has_bias:
                        offset += bias[n, j] * xsum[m, j]
                    base = uint64(j * g)
                    for i in range(g):
                        at = base + uint64(i)
                        lanes[i] += d * (np.float32(w[at]) * a[at])
                out[m, n] = lanes.sum() + offset

    @njit(fastmath=True, parallel=True, cache=True, nogil=True)
    def dequantize_rows(q, scale, bias, has_bias, out):
        n_rows, k = q.shape
        n_groups = scale.shape[1]
        g = k // n_groups
        for n in prange(n_rows):
            w = q[n]
            o = out[n]
            for j in range(n_groups):
                d = scale[n, j]
                b = bias[n, j] if has_bias else np.float32(0)
                base = uint64(j * g)
                for i in range(g):
                    at = base + uint64(i)
                    o[at] = np.float32(w[at]) * d + b

    @njit(fastmath=True, parallel=True, cache=True, nogil=True)
    def matvec_nibbles(packed, scale, bias, x, xsum, out):
        """As matvec for 4-bit weights: packed uint8 [N, K/2], each group of 32 values in 16
        bytes (byte i: value i in the low nibble, value i + 16 in the high one), W = u*scale + bias."""
        n_rows = packed.shape[0]
        n_groups = scale.shape[1]
        m_rows = x.shape[0]
        for n in prange(n_rows):
            lanes = np.empty(32, np.float32)
            w = packed[n]
            for m in range(m_rows):
                a = x[m]
                lanes[:] = 0
                offset = np.float32(0)
                for j in range(n_groups):
                    d = scale[n, j]
                    offset += bias[n, j] * xsum[m, j]
                    for i in range(16):
                        b = np.int32(w[uint64(j * 16 + i)])
                        lanes[i] += d * (np.float32(b & 15) * a[uint64(j * 32 + i)])
                        lanes[i + 16] += d * (np.float32(b >> 4) * a[uint64(j * 32 + 16 + i)])
                out[m, n] = lanes.sum() + offset

    @njit(fastmath=True, parallel=True, cache=True, nogil=True)
    def dequantize_nibbles(packed, scale, bias, out):
        n_rows = packed.shape[0]
        n_groups = scale.shape[1]
        for n in prange(n_rows):
            w = packed[n]
            o = out[n]
            for j in range(n_groups):
                d = scale[n, j]
                b0 = bias[n, j]
                for i in range(16):
                    b = np.int32(w[uint64(j * 16 + i)])
                    o[uint64(j * 32 + i)] = np.float32(b & 15) * d + b0
                    o[uint64(j * 32 + 16 + i)] = np.float32(b >> 4) * d + b0

    return matvec, dequantize_rows, matvec_nibbles, dequantize_nibbles


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
