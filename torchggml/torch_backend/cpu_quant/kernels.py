"""Fused products over the (q, scale, bias) layout, compiled by numba for the host CPU.

Why this loop shape: numba types int8*int8 products as int64, so a plain integer dot product
stays scalar (~2 GB/s on a Zen 4); the dot products are emitted as one LLVM vector expression
each (`_vector_dot_intrinsics`), which LLVM lowers to the CPU's integer multiply-add, over
activations quantized to int8 per group as ggml does. LLVM compiles for the host CPU's features
(AVX2, AVX-512, NEON), which is what numba gives by default.

    quantize_rows(x, g, xq, xd, xsum)       x f32 [M, K] -> int8 xq, group scales xd and sums xsum
    matvec(q, scale, bias, has_bias, w_row0, xq, xd, xsum, x_row, out)
        out[m, n] = sum_k W[w_row0[m] + n, k] * x[x_row[m], k]      (x as xq * xd per group)
    dequantize_rows(q, scale, bias, has_bias, out)   out[n, k] = W[n, k] (float32)

q int8 [rows, K], scale/bias f32 [rows, K/G] (bias unused when has_bias is False), xq int8
[X, K], xd and xsum f32 [X, K/G] (xsum: the sums of x over each group, for the bias), out f32
[M, N] / [rows, K]. w_row0 and x_row (int64 [M]) pick each output row's weight matrix (its first
row in q: several experts' matrices stacked, MUL_MAT_ID) and activation row; MUL_MAT passes
zeros and 0..M-1.
The *_nibbles variants read 4-bit weights (Q4_0, Q4_1, Q4_K) two to a byte: the same speed in
values/s as int8 on one core (~6 G/s) from half the bytes, which is what counts once several
cores share the memory bus.
"""
from __future__ import annotations

import functools


def _vector_dot_intrinsics():
    """numba intrinsics that emit one LLVM vector expression for an int8 dot product, which
    LLVM lowers to the CPU's integer multiply-add (vpmovsxbw + vpmaddwd on AVX2/AVX-512, sdot
    on ARM): numba's own integer arithmetic widens to int64 and stays scalar.

        dot_i8(w, wo, x, xo, n)   sum_{i<n} w[wo+i] * x[xo+i], w and x int8, n 16 or 32
        dot_u4(w, wo, x, xo)      sum_{i<16} (w[wo+i] & 15) * x[xo+i] + (w[wo+i] >> 4) * x[xo+16+i]
    """
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    def load(context, builder, arr_type, arr, offset, n):
        data = context.make_array(arr_type)(context, builder, arr).data
        ptr = builder.bitcast(builder.gep(data, [offset]), ir.VectorType(ir.IntType(8), n).as_pointer())
        return builder.load(ptr, align=1)

    def reduce_add(builder, v, n):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), [v.type]),
                                            f"llvm.vector.reduce.add.v{n}i32")
        return builder.call(fn, [v])

    def make_dot_i8(n):
        @intrinsic
        def dot_i8(typingctx, w, wo, x, xo):
            def codegen(context, builder, sig, args):
                wv = load(context, builder, sig.args[0], args[0], args[1], n)
                xv = load(context, builder, sig.args[2], args[2], args[3], n)
                wide = ir.VectorType(ir.IntType(32), n)
                return reduce_add(builder, builder.mul(builder.sext(wv, wide), builder.sext(xv, wide)), n)
            return types.int32(w, wo, x, xo), codegen
        return dot_i8

    @intrinsic
    def dot_u4(typingctx, w, wo, x, xo):
        def codegen(context, builder, sig, args):
            wv = load(context, builder, sig.args[0], args[0], args[1], 16)
            lo_x = load(context, builder, sig.args[2], args[2], args[3], 16)
            hi_x = load(context, builder, sig.args[2], args[2], builder.add(args[3], ir.Constant(args[3].type, 16)), 16)
            wide = ir.VectorType(ir.IntType(32), 16)
            v16 = ir.VectorType(ir.IntType(8), 16)
            lo = builder.and_(wv, ir.Constant(v16, [15] * 16))
            hi = builder.lshr(wv, ir.Constant(v16, [4] * 16))
            total = builder.add(builder.mul(builder.zext(lo, wide), builder.sext(lo_x, wide)),
                                builder.mul(builder.zext(hi, wide), builder.sext(hi_x, wide)))
            return reduce_add(builder, total, 16)
        return types.int32(w, wo, x, xo), codegen

    return make_dot_i8(16), make_dot_i8(32), dot_u4


@functools.lru_cache(maxsize=None)
def numba_kernels():
    """(matvec, dequantize_rows, matvec_nibbles, dequantize_nibbles, quantize_rows), compiled on
    first use (numba caches them on disk)."""
    import numpy as np
    from numba import njit, prange, uint64

    dot16, dot32, dot_u4 = _vector_dot_intrinsics()

    @njit(fastmath=True, cache=True, nogil=True)
    def quantize_rows(x, g, xq, xd, xsum):
        """x f32 [M, K] -> int8 [M, K] and scales [M, K/g] per group of g (ggml's Q8_0 rounding:
        d = max|x| / 127, q = round(x / d)), and the groups' float sums."""
        m_rows, k = x.shape
        for m in range(m_rows):
            for j in range(k // g):
                amax = np.float32(0)
                total = np.float32(0)
                for i in range(j * g, j * g + g):
                    amax = max(amax, abs(x[m, i]))
                    total += x[m, i]
                d = amax / np.float32(127)
                inv = np.float32(1) / d if d > 0 else np.float32(0)
                for i in range(j * g, j * g + g):
                    xq[m, i] = np.int8(np.round(x[m, i] * inv))
                xd[m, j] = d
                xsum[m, j] = total

    @njit(fastmath=True, parallel=True, cache=True, nogil=True)
    def matvec(q, scale, bias, has_bias, w_row0, xq, xd, xsum, x_row, out):
        n_rows = out.shape[1]
        n_groups = scale.shape[1]
        g = q.shape[1] // n_groups
        for n in prange(n_rows):
            for m in range(out.shape[0]):
                r = w_row0[m] + n
                w = q[r]
                a = xq[x_row[m]]
                acc = np.float32(0)
                for j in range(n_groups):
                    dot = dot32(w, j * 32, a, j * 32) if g == 32 else dot16(w, j * 16, a, j * 16)
                    acc += scale[r, j] * xd[x_row[m], j] * np.float32(dot)
                    if has_bias:
                        acc += bias[r, j] * xsum[x_row[m], j]
                out[m, n] = acc

    @njit(fastmath=True, parallel=True, cache=True, nogil=True)
    def matvec_nibbles(packed, scale, bias, w_row0, xq, xd, xsum, x_row, out):
        """As matvec for 4-bit weights: packed uint8 [rows, K/2], each group of 32 values in 16
        bytes (byte i: value i in the low nibble, value i + 16 in the high one), W = u*scale + bias."""
        n_rows = out.shape[1]
        n_groups = scale.shape[1]
        for n in prange(n_rows):
            for m in range(out.shape[0]):
                r = w_row0[m] + n
                w = packed[r]
                a = xq[x_row[m]]
                acc = np.float32(0)
                for j in range(n_groups):
                    dot = dot_u4(w, j * 16, a, j * 32)
                    acc += scale[r, j] * xd[x_row[m], j] * np.float32(dot) + bias[r, j] * xsum[x_row[m], j]
                out[m, n] = acc

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

    return matvec, dequantize_rows, matvec_nibbles, dequantize_nibbles, quantize_rows


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
