"""numba kernels for the CPU device's small per-node work (decode steps): one compiled call per
node instead of several torch dispatches (fast_ops.py binds them; loader.op_kernels() loads them).

Every kernel takes 4-D numpy views [ne3, ne2, ne1, ne0] with any strides and does the same
arithmetic as the torch kernels it stands in for (kernels/): float32 element-wise, float64 row
sums where ggml sums in ggml_float, angles in float64. F16 values travel as uint16 bits and are
converted by LLVM's half<->float instructions (vcvtph2ps/vcvtps2ph on x86's F16C, fcvt on ARM),
so a float32 -> F16 store rounds to nearest even as torch's does. numba is not told fastmath:
LLVM then neither reorders sums nor fuses multiplies and adds; its numpy error model keeps IEEE
division (x / 0 is inf or NaN, as in ggml, not a ZeroDivisionError).

    row_norm(x, out, eps, rms)                       NORM / RMS_NORM over ne0 (row_norm_rows: threaded)
    norm_mul(x, w, out, eps, rms)                    row_norm then out *= w's rows (a norm and its weight)
    add_norm_mul(a, b, total, w, out, eps, rms)      total = a + b, then norm_mul(total, w, out, ...)
    soft_max(x, out, mask, slopes, sinks, scale, has_mask, has_sinks)
    soft_max_rows(...)                               the same, the rows split over the threads
    rope(x, out, pos, factors, inv_freq, ramp, has_factors, freq_scale, mscale, start, width,
         interleaved, copy_rest)                     NORMAL / NEOX rotation (rope_rows(..., angles, angle_pos):
                                                     the tokens threaded, the angles shared by the nodes;
                                                     rope_shared(...): the same on one thread)
    set_rows(rows, idx, dst) -> first bad index position or -1
    copy(src, dst)                                   same shape, element by element, tiled
    glu(x, gate, out, gelu)                          silu(x) * gate, or GEGLU's gelu(x) * gate (glu_rows: threaded)
    binary(a, b, out, op)                            a + - * / b (op 0..3), b tiled over a
    scale(x, out, s, b)                              x * s (+ b, rounded after the product), SCALE
    transpose(src, dst)                              dst[c, r] = src[r, c], 2-D, any element type
    get_block_rows(table, ids, out, kind) -> first bad index position or -1
                                                     out[i3, i2, j] = dequantized table[i3, i2, ids[..]]
                                                     for kind in fast_ops.BLOCK_KINDS (bit-exact as ggml/gguf)
    half_products(a, a_strides, b, b_strides, out, k, r2, r3)
                                                     out[i3, i2, m, n] = sum_k a[i3 / r3, i2 / r2, n, k]
                                                     * b[i3, i2, m, k], a F16, b F32 (flat, k contiguous)
    half_matvec(w, x, out)                           out[m, n] = sum_k w[n, k] half(x[m, k]), w F16 [N, K], x F32
                                                     rounded to F16 first (ggml's F16 vec_dot type)
    half_gemm(w, x, out)                             the same for micro-batches (tiles of 4 x 4)
    decode_attention(k, v, strides, n_kv, n_head_kv, q, mask, has_mask, scale, scratch, out, n_threads)
                                                     softmax(scale K q + mask) V for a few query rows:
                                                     K, V F16 flat (rows contiguous; strides: K's head
                                                     and cell, V's head and cell), q [n_head, n_tok, d_k];
                                                     fusion.py
    prompt_attention(..., n_threads, kt, vf)         the same for a prompt's rows (the cells a row's
                                                     mask hides are not read; kt, vf: f32 work areas
                                                     for K transposed and V)

At module level, as quant_kernels.py's, so that numba's disk cache serves them in every process.
"""
import math

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from ....quants.tables import IQ4NL_VALUES
from .halves import float_to_half_bits
from .llvm_ir import HALF_LANES, _half_row_dot_intrinsic, native_half



IQ4_NL_VALUES = np.array(IQ4NL_VALUES, np.float32)  # kvalues_iq4nl (a constant in the kernels)

# copies walk the last two dims in tiles of this many rows x columns (transposes stay in cache)
COPY_TILE = 32
# transposes move blocks of this many rows and columns (on the V cache's F16, 8x8 beat torch's
# copy; 8x16 and 16x8 did not)
TRANSPOSE_BLOCK = 8


def _half_intrinsics():
    """half_to_float(uint16) -> float32 and float_to_half(float32) -> uint16 as LLVM casts (the
    integer steps of llvm_ir.half_bits_to_float and halves.float_to_half_bits where the CPU has
    no half conversion, whose casts numba cannot link)."""
    from llvmlite import ir
    from .llvm_ir import half_bits_to_float
    from numba import types
    from numba.extending import intrinsic

    @intrinsic
    def half_to_float(typingctx, bits):
        def codegen(context, builder, sig, args):
            return half_bits_to_float(builder, args[0])
        return types.float32(types.uint16), codegen

    @intrinsic
    def float_to_half(typingctx, value):
        def codegen(context, builder, sig, args):
            return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))
        return types.uint16(types.float32), codegen

    return half_to_float, float_to_half if native_half() else float_to_half_bits


half_to_float, float_to_half = _half_intrinsics()


def _prefetch_intrinsic():
    """prefetch(a, i): ask the CPU to bring the cache line of a[i] in (llvm.prefetch; no fault
    for an address past a's end): the decode attention reads K and V rows a cache row apart,
    cold after the weights went through the cache, and waits on each miss without it."""
    from llvmlite import ir
    from numba.core import cgutils
    from numba.extending import intrinsic

    @intrinsic
    def prefetch(typingctx, a, i):
        def codegen(context, builder, sig, args):
            arr = context.make_array(sig.args[0])(context, builder, args[0])
            at = builder.bitcast(builder.gep(arr.data, [args[1]]), ir.IntType(8).as_pointer())
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer()] + [ir.IntType(32)] * 3),
                "llvm.prefetch.p0i8")
            builder.call(fn, [at] + [ir.Constant(ir.IntType(32), v) for v in (0, 3, 1)])
            return context.get_dummy_value()
        return types.none(a, types.int64), codegen
    return prefetch


prefetch = _prefetch_intrinsic()
# the decode attention asks for the K and V rows this many cells ahead (prefetch)
PREFETCH_CELLS = 8


def _tile_intrinsic():
    """add_tile(a, b, out, r0, c0, b_c0, n_k): out[r0:r0+4, c0:c0+TILE_WIDTH] += a[r0:r0+4, :n_k]
    @ b[:n_k, b_c0:b_c0+TILE_WIDTH] (a, b, out float32 2-D, C-contiguous; the caller keeps every
    index inside the arrays), with 4 x TILE_WIDTH accumulators in registers for the whole of
    n_k: one load of b's columns per 4 products (numba's own loops load and store the output at
    every step)."""
    from llvmlite import ir
    from numba.core import cgutils
    from numba.extending import intrinsic
    from .llvm_ir import target_features

    f32 = ir.FloatType()
    lanes = 16 if "avx512f" in target_features() else 8
    width = 2 * lanes
    vec = ir.VectorType(f32, lanes)

    @intrinsic
    def add_tile(typingctx, a, b, out, r0, c0, b_c0, n_k):
        def codegen(context, builder, sig, args):
            arrays = [context.make_array(sig.args[i])(context, builder, args[i]) for i in range(3)]
            (ap, bp, op), r0, c0, b_c0, n_k = [x.data for x in arrays], args[3], args[4], args[5], args[6]
            lda = builder.extract_value(arrays[0].shape, 1)
            ldb, ldo = builder.extract_value(arrays[1].shape, 1), builder.extract_value(arrays[2].shape, 1)
            i64 = n_k.type
            const = lambda v: ir.Constant(i64, v)  # noqa: E731
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec, [vec] * 3), f"llvm.fma.v{lanes}f32")
            zeros = ir.Constant(vec, [0.0] * lanes)
            accs = [[cgutils.alloca_once_value(builder, zeros) for _ in range(2)] for _ in range(4)]
            with cgutils.for_range(builder, n_k) as loop:
                k = loop.index
                row = builder.add(builder.mul(k, ldb), b_c0)
                bs = [builder.load(builder.bitcast(builder.gep(bp, [builder.add(row, const(lanes * h))]), vec.as_pointer()),
                                   align=4) for h in range(2)]
                for r in range(4):
                    x = builder.load(builder.gep(ap, [builder.add(builder.mul(builder.add(r0, const(r)), lda), k)]))
                    xs = builder.shuffle_vector(builder.insert_element(ir.Constant(vec, ir.Undefined), x, ir.Constant(ir.IntType(32), 0)),
                                                ir.Constant(vec, ir.Undefined), ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes))
                    for h in range(2):
                        builder.store(builder.call(fma, [xs, bs[h], builder.load(accs[r][h])]), accs[r][h])
            for r in range(4):
                row = builder.add(builder.mul(builder.add(r0, const(r)), ldo), c0)
                for h in range(2):
                    ptr = builder.bitcast(builder.gep(op, [builder.add(row, const(lanes * h))]), vec.as_pointer())
                    builder.store(builder.fadd(builder.load(ptr, align=4), builder.load(accs[r][h])), ptr, align=4)
            return context.get_dummy_value()
        return types.none(a, b, out, r0, c0, b_c0, n_k), codegen
    return add_tile, width


add_tile, TILE_WIDTH = _tile_intrinsic()


def load(value):  # an element as float32
    pass


@overload(load)
def _load(value):
    if value == types.uint16:
        return lambda value: half_to_float(value)
    return lambda value: np.float32(value)


def store_as(value, like):  # a float32 value in the element type of the array `like`
    pass


@overload(store_as)
def _store_as(value, like):
    if like.dtype == types.uint16:
        return lambda value, like: float_to_half(np.float32(value))
    return lambda value, like: np.float32(value)


def moved(value, like):  # an element of another array in the element type of `like`
    pass


@overload(moved)
def _moved(value, like):
    if value == like.dtype:  # the same type: its bits, as a memcpy (NaN payloads too)
        return lambda value, like: value
    return lambda value, like: store_as(load(value), like)


jit = njit(cache=True, nogil=True, error_model="numpy")


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def exp_f32(x):
    """e^x in float32 within 1 ulp (Cody-Waite reduction, Cephes' polynomial), which LLVM
    vectorizes where libm's expf stays a call per value; 0 for
    -inf, inf past 88.7, NaN for NaN, subnormal results to ~7%."""
    xc = min(max(x, np.float32(-104.0)), np.float32(89.0))
    n = np.floor(xc * np.float32(1.44269504088896341) + np.float32(0.5))
    r = xc - n * np.float32(0.693359375) - n * np.float32(-2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    y = p * (r * r) + r + np.float32(1.0)
    k = np.int32(n)
    half = k >> 1  # 2^k in two factors, each a normal float down to k = -252
    low = np.int32((half + 127) << 23).view(np.float32)
    high = np.int32((k - half + 127) << 23).view(np.float32)
    result = y * low * high
    return x if x != x else result


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _row_sum(xr, mean, square):
    """The float64 sum of xr's (x - mean), or of their squares, in 8 interleaved partial sums
    (8 chains of float64 adds at a time, where one chain waits on each add's latency)."""
    n = xr.shape[0]
    t0 = t1 = t2 = t3 = t4 = t5 = t6 = t7 = 0.0
    for i0 in range(0, n - n % 8, 8):
        v0, v1, v2, v3 = load(xr[i0]) - mean, load(xr[i0 + 1]) - mean, load(xr[i0 + 2]) - mean, load(xr[i0 + 3]) - mean
        v4, v5, v6, v7 = (load(xr[i0 + 4]) - mean, load(xr[i0 + 5]) - mean, load(xr[i0 + 6]) - mean,
                          load(xr[i0 + 7]) - mean)
        if square:
            v0, v1, v2, v3, v4, v5, v6, v7 = v0 * v0, v1 * v1, v2 * v2, v3 * v3, v4 * v4, v5 * v5, v6 * v6, v7 * v7
        t0 += v0
        t1 += v1
        t2 += v2
        t3 += v3
        t4 += v4
        t5 += v5
        t6 += v6
        t7 += v7
    for i0 in range(n - n % 8, n):
        v = load(xr[i0]) - mean
        t0 += v * v if square else v
    return ((t0 + t1) + (t2 + t3)) + ((t4 + t5) + (t6 + t7))


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _norm_scale(xr, eps, rms):
    """(mean, 1 / sqrt(variance + eps)) of a row (mean 0 for RMS_NORM)."""
    n = xr.shape[0]
    mean = np.float32(0.0)
    if not rms:
        mean = np.float32(_row_sum(xr, mean, False) / n)
    total = _row_sum(xr, mean, True)
    return mean, np.float32(1.0) / np.float32(math.sqrt(np.float32(total / n) + eps))


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _norm_row(xr, orow, eps, rms):
    mean, scale = _norm_scale(xr, eps, rms)
    for i0 in range(xr.shape[0]):
        orow[i0] = store_as((load(xr[i0]) - mean) * scale, orow)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _norm_row_times(xr, wr, orow, eps, rms):
    """_norm_row of F32 rows, each value rounded, then times wr's (binary's MUL)."""
    mean, scale = _norm_scale(xr, eps, rms)
    for i0 in range(xr.shape[0]):
        orow[i0] = np.float32((xr[i0] - mean) * scale) * wr[i0]


@jit
def row_norm(x, out, eps, rms):
    for i3 in range(x.shape[0]):
        for i2 in range(x.shape[1]):
            for i1 in range(x.shape[2]):
                _norm_row(x[i3, i2, i1], out[i3, i2, i1], eps, rms)


# a decode step's norm times its weight (RMS_NORM -> MUL, fusion.py): each F32 row normed, then
# times w's row (w's rows tiled over x's, each as long as a row), as the two calls round them
@jit
def norm_mul(x, w, out, eps, rms):
    for i3 in range(x.shape[0]):
        for i2 in range(x.shape[1]):
            for i1 in range(x.shape[2]):
                _norm_row_times(x[i3, i2, i1], w[i3 % w.shape[0], i2 % w.shape[1], i1 % w.shape[2]], out[i3, i2, i1],
                                eps, rms)


# the residual's ADD and the next norm times its weight (ADD -> RMS_NORM -> MUL, fusion.py):
# total = a + b (a row of b for each of a's), then norm_mul of total into out (apart from a, b
# and total), as the calls round them
@jit
def add_norm_mul(a, b, total, w, out, eps, rms):
    for i3 in range(a.shape[0]):
        for i2 in range(a.shape[1]):
            for i1 in range(a.shape[2]):
                t = total[i3, i2, i1]
                binary_row(a[i3, i2, i1], b[i3, i2, i1], t, 0)
                _norm_row_times(t, w[i3 % w.shape[0], i2 % w.shape[1], i1 % w.shape[2]], out[i3, i2, i1], eps, rms)


# the same over the rows split among the threads (a prompt's rows)
@njit(cache=True, nogil=True, error_model="numpy", parallel=True)
def row_norm_rows(x, out, eps, rms):
    n3, n2, n1 = x.shape[0], x.shape[1], x.shape[2]
    for r in prange(n3 * n2 * n1):
        i3, i2, i1 = r // (n2 * n1), (r // n1) % n2, r % n1
        _norm_row(x[i3, i2, i1], out[i3, i2, i1], eps, rms)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def softmax_shift(peak, nan):
    """The value a softmax row subtracts before exp: its max, NaN if any value was (as ggml's
    amax), 0 when that is not finite (a row of -inf: all weights 0)."""
    if nan:
        peak = np.float32(np.nan)
    return peak if math.isfinite(peak) else np.float32(0.0)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _soft_max_row(xr, mr, has_mask, slope, sink, has_sinks, scale, row, orow):
    """One row of SOFT_MAX: softmax(x * scale + slope * mask), the sink's logit in the sum."""
    n = xr.shape[0]
    if has_mask:
        for i0 in range(n):
            row[i0] = load(xr[i0]) * scale + slope * load(mr[i0])
    else:
        for i0 in range(n):
            row[i0] = load(xr[i0]) * scale
    peak, nan = sink, sink != sink  # the max, NaN if any value is (as amax)
    for i0 in range(n):
        v = row[i0]
        nan |= v != v
        peak = v if v > peak else peak
    peak = softmax_shift(peak, nan)
    for i0 in range(n):  # vectorized; the float64 sum in order after it
        row[i0] = exp_f32(row[i0] - peak)
    total = 0.0
    for i0 in range(n):
        total += row[i0]
    if has_sinks:
        total += exp_f32(sink - peak)
    if total == 0.0:
        total = 1.0
    inv = np.float32(1.0 / total)
    for i0 in range(n):
        orow[i0] = store_as(row[i0] * inv, orow)


@jit
def soft_max(x, out, mask, slopes, sinks, scale, has_mask, has_sinks):
    row = np.empty(x.shape[3], np.float32)
    for i3 in range(x.shape[0]):
        for i2 in range(x.shape[1]):
            sink = sinks[i2] if has_sinks else np.float32(-np.inf)
            for i1 in range(x.shape[2]):
                mr = mask[i3 % mask.shape[0], i2 % mask.shape[1], i1] if has_mask else mask[0, 0, 0]
                _soft_max_row(x[i3, i2, i1], mr, has_mask, slopes[i2], sink, has_sinks, scale, row, out[i3, i2, i1])


# the same over the rows split among the threads: a prompt's scores (32 heads x 128 tokens x 256
# cells per layer)
@njit(cache=True, nogil=True, error_model="numpy", parallel=True)
def soft_max_rows(x, out, mask, slopes, sinks, scale, has_mask, has_sinks):
    n3, n2, n1 = x.shape[0], x.shape[1], x.shape[2]
    for r in prange(n3 * n2 * n1):
        i3, i2, i1 = r // (n2 * n1), (r // n1) % n2, r % n1
        row = np.empty(x.shape[3], np.float32)
        sink = sinks[i2] if has_sinks else np.float32(-np.inf)
        mr = mask[i3 % mask.shape[0], i2 % mask.shape[1], i1] if has_mask else mask[0, 0, 0]
        _soft_max_row(x[i3, i2, i1], mr, has_mask, slopes[i2], sink, has_sinks, scale, row, out[i3, i2, i1])


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _rope_angles(p, factors, inv_freq, ramp, has_factors, freq_scale, mscale, cos, sin):
    """Position p's cos and sin of each pair's angle (times mscale) into cos, sin."""
    p = np.float64(p)
    for i in range(cos.shape[0]):
        theta_extrap = p * inv_freq[i]
        if has_factors:
            theta_extrap = theta_extrap / np.float64(factors[i])
        theta = theta_extrap if freq_scale == 1.0 else freq_scale * theta_extrap
        if ramp.shape[0]:
            theta = theta * ramp[0, i] + theta_extrap * ramp[1, i]
        c, s = math.cos(theta), math.sin(theta)
        if mscale != 1.0:
            c, s = c * mscale, s * mscale
        cos[i], sin[i] = np.float32(c), np.float32(s)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _rope_rotate(x, out, i2, start, width, interleaved, copy_rest, cos, sin):
    """Token i2's rows of every head rotated by its angles' cos and sin."""
    n_pairs = width // 2
    step, other = (2, 1) if interleaved else (1, n_pairs)
    for i3 in range(x.shape[0]):
        for i1 in range(x.shape[2]):  # heads
            for i in range(n_pairs):
                j0 = start + i * step
                j1 = j0 + other
                f0, f1 = load(x[i3, i2, i1, j0]), load(x[i3, i2, i1, j1])
                out[i3, i2, i1, j0] = store_as(f0 * cos[i] - f1 * sin[i], out)
                out[i3, i2, i1, j1] = store_as(f0 * sin[i] + f1 * cos[i], out)
            if copy_rest:
                for j in range(x.shape[3]):
                    if j < start or j >= start + width:
                        out[i3, i2, i1, j] = store_as(load(x[i3, i2, i1, j]), out)


@jit
def rope(x, out, pos, factors, inv_freq, ramp, has_factors, freq_scale, mscale, start, width,
         interleaved, copy_rest):
    cos = np.empty(width // 2, np.float32)
    sin = np.empty(width // 2, np.float32)
    for i2 in range(x.shape[1]):  # tokens
        _rope_angles(pos[i2], factors, inv_freq, ramp, has_factors, freq_scale, mscale, cos, sin)
        _rope_rotate(x, out, i2, start, width, interleaved, copy_rest, cos, sin)


# the same for a prompt's tokens, split over the threads, their angles in `angles` [2, tokens, pairs]
# (cos, sin) shared by the graph's ROPE nodes of the same positions and parameters: computed by
# the first node whose positions differ from `angle_pos` ([0]: the tokens they cover, -1 none;
# then the positions), read by the others (a model's 2 x n_layer ROPE nodes: one table, not one
# a node)
@njit(cache=True, nogil=True, error_model="numpy", parallel=True)
def rope_rows(x, out, pos, factors, inv_freq, ramp, has_factors, freq_scale, mscale, start, width,
              interleaved, copy_rest, angles, angle_pos):
    n_tok = x.shape[1]
    if not _angles_hold(pos, n_tok, angle_pos):
        for i2 in prange(n_tok):
            _rope_angles(pos[i2], factors, inv_freq, ramp, has_factors, freq_scale, mscale, angles[0, i2],
                         angles[1, i2])
        _angles_of(pos, n_tok, angle_pos)
    for i2 in prange(n_tok):
        _rope_rotate(x, out, i2, start, width, interleaved, copy_rest, angles[0, i2], angles[1, i2])


# the same on one thread: a decode step's ROPE nodes in a native run (native_plan.py gives its
# rope calls a table of angles, which the step's 2 x n_layer nodes share)
@jit
def rope_shared(x, out, pos, factors, inv_freq, ramp, has_factors, freq_scale, mscale, start, width,
                interleaved, copy_rest, angles, angle_pos):
    n_tok = x.shape[1]
    if not _angles_hold(pos, n_tok, angle_pos):
        for i2 in range(n_tok):
            _rope_angles(pos[i2], factors, inv_freq, ramp, has_factors, freq_scale, mscale, angles[0, i2],
                         angles[1, i2])
        _angles_of(pos, n_tok, angle_pos)
    for i2 in range(n_tok):
        _rope_rotate(x, out, i2, start, width, interleaved, copy_rest, angles[0, i2], angles[1, i2])


@njit(cache=True, nogil=True, inline="always")
def _angles_hold(pos, n_tok, angle_pos):
    """The table's angles are those of these positions (angle_pos: the tokens, then positions)."""
    fresh = angle_pos[0] == n_tok
    for i2 in range(n_tok if fresh else 0):
        fresh &= angle_pos[1 + i2] == pos[i2]
    return fresh


@njit(cache=True, nogil=True, inline="always")
def _angles_of(pos, n_tok, angle_pos):
    for i2 in range(n_tok):
        angle_pos[1 + i2] = pos[i2]
    angle_pos[0] = n_tok


@jit
def set_rows(rows, idx, dst):
    n_rows = dst.shape[2]
    for i3 in range(rows.shape[0]):
        for i2 in range(rows.shape[1]):
            for j in range(rows.shape[2]):
                r = idx[i3 % idx.shape[0], i2 % idx.shape[1], j]
                if r < 0 or r >= n_rows:
                    return j
                for i0 in range(rows.shape[3]):
                    dst[i3, i2, r, i0] = store_as(load(rows[i3, i2, j, i0]), dst)
    return -1


@jit
def copy(src, dst):
    t = COPY_TILE
    for i3 in range(dst.shape[0]):
        for i2 in range(dst.shape[1]):
            for a1 in range(0, dst.shape[2], t):
                for a0 in range(0, dst.shape[3], t):
                    for i1 in range(a1, min(a1 + t, dst.shape[2])):
                        for i0 in range(a0, min(a0 + t, dst.shape[3])):
                            dst[i3, i2, i1, i0] = moved(src[i3, i2, i1, i0], dst)


@njit(cache=True, nogil=True, error_model="numpy", parallel=True)
def transpose(src, dst):  # the row blocks split over the threads
    t = TRANSPOSE_BLOCK
    rows, cols = src.shape
    full_rows, full_cols = rows - rows % t, cols - cols % t
    for row_block in prange(full_rows // t):
        r0 = row_block * t
        for c0 in range(0, full_cols, t):
            for i in range(t):
                for j in range(t):
                    dst[c0 + j, r0 + i] = src[r0 + i, c0 + j]
    for r in range(full_rows, rows):
        for c in range(cols):
            dst[c, r] = src[r, c]
    for c in range(full_cols, cols):
        for r in range(full_rows):
            dst[c, r] = src[r, c]


@jit
def binary_row(x, y, out, op):  # one row, y as long as x (the loops vectorize on contiguous rows)
    if op == 0:
        for i in range(out.shape[0]):
            out[i] = store_as(load(x[i]) + load(y[i]), out)
    elif op == 1:
        for i in range(out.shape[0]):
            out[i] = store_as(load(x[i]) - load(y[i]), out)
    elif op == 2:
        for i in range(out.shape[0]):
            out[i] = store_as(load(x[i]) * load(y[i]), out)
    else:
        for i in range(out.shape[0]):
            out[i] = store_as(load(x[i]) / load(y[i]), out)


@jit
def binary(a, b, out, op):
    n, nb = out.shape[3], b.shape[3]
    tiled = np.empty(n if nb != n else 0, b.dtype)  # b's row repeated to a's length
    for i3 in range(out.shape[0]):
        for i2 in range(out.shape[1]):
            for i1 in range(out.shape[2]):
                row_b = b[i3 % b.shape[0], i2 % b.shape[1], i1 % b.shape[2]]
                if nb != n:
                    for i0 in range(n):
                        tiled[i0] = row_b[i0 % nb]
                    row_b = tiled
                binary_row(a[i3, i2, i1], row_b, out[i3, i2, i1], op)


@jit
def scale(x, out, s, b):
    for i3 in range(out.shape[0]):
        for i2 in range(out.shape[1]):
            for i1 in range(out.shape[2]):
                xr, orow = x[i3, i2, i1], out[i3, i2, i1]
                for i0 in range(orow.shape[0]):
                    v = load(xr[i0]) * s
                    orow[i0] = store_as(v + b if b != 0 else v, orow)


# GEGLU's GELU, ggml's tanh form: 0.5 v (1 + tanh(y)) = v / (1 + e^(-2y)), y = C v (1 + A v^2)
GELU_2C = np.float32(2 * math.sqrt(2 / math.pi))
GELU_A = np.float32(0.044715)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _glu_row(xr, gr, orow, gelu):
    one = np.float32(1.0)
    for i0 in range(orow.shape[0]):
        v = load(xr[i0])
        z = -GELU_2C * v * (one + GELU_A * v * v) if gelu else -v
        orow[i0] = store_as(v / (one + exp_f32(z)) * load(gr[i0]), orow)


@jit
def glu(x, gate, out, gelu):
    for i3 in range(out.shape[0]):
        for i2 in range(out.shape[1]):
            for i1 in range(out.shape[2]):
                _glu_row(x[i3, i2, i1], gate[i3, i2, i1], out[i3, i2, i1], gelu)


# the same over the rows split among the threads (a prompt's rows)
@njit(cache=True, nogil=True, error_model="numpy", parallel=True)
def glu_rows(x, gate, out, gelu):
    n3, n2, n1 = out.shape[0], out.shape[1], out.shape[2]
    for r in prange(n3 * n2 * n1):
        i3, i2, i1 = r // (n2 * n1), (r // n1) % n2, r % n1
        _glu_row(x[i3, i2, i1], gate[i3, i2, i1], out[i3, i2, i1], gelu)


half_row_dot = _half_row_dot_intrinsic()


@njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "contract"}, inline="always")
def _half_dot(row, xr):  # an F16 row (uint16 bits) times float32 values or F16 bits
    total = half_row_dot(row, xr)
    for i in range(row.shape[0] - row.shape[0] % HALF_LANES, row.shape[0]):
        total += half_to_float(row[i]) * load(xr[i])
    return total


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _to_half(x, out):  # float32 values -> F16 bits (nearest even, as ggml's conversion)
    for i in range(x.shape[0]):
        out[i] = float_to_half(x[i])


# a vector sum, as ggml's; the heads (i2, i3) split over the threads: attention's KQ and KQV are
# large enough a layer that one thread left the other idle
@njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "contract"}, parallel=True)
def half_products(a, a_strides, b, b_strides, out, k, r2, r3):
    sa3, sa2, sa1 = a_strides[0], a_strides[1], a_strides[2]
    sb3, sb2, sb1 = b_strides[0], b_strides[1], b_strides[2]
    for head in prange(out.shape[0] * out.shape[1]):
        i3, i2 = head // out.shape[1], head % out.shape[1]
        a_base = (i3 // r3) * sa3 + (i2 // r2) * sa2
        for m in range(out.shape[2]):
            b_row = i3 * sb3 + i2 * sb2 + m * sb1
            row_b = b[b_row:b_row + k]
            for n in range(out.shape[3]):
                # 1-D slices: indexing a and b by offsets within the loop kept LLVM from
                # vectorizing it
                out[i3, i2, m, n] = _half_dot(a[a_base + n * sa1:a_base + n * sa1 + k], row_b)


# a decode step's product by a 2-D F16 weight: one pass over the weight (the rows split over the
# threads, each row's dot for every activation row while it is in L1); torch's half GEMV reads it
# slower than the fused quantized kernels and rounds the results to F16. The
# activations are rounded to F16 first, as ggml's F16 vec_dot type rounds them: the same
# products as ggml's, and a row half the bytes beside the streamed weight (faster than float32
# rows, ffn_down's long rows most)
@njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "contract"}, parallel=True)
def half_matvec(w, x, out):
    xh = np.empty(x.shape, np.uint16)
    for m in range(x.shape[0]):
        _to_half(x[m], xh[m])
    for n in prange(w.shape[0]):
        for m in range(x.shape[0]):
            out[m, n] = _half_dot(w[n], xh[m])


# a decode step's product by a 2-D BF16 weight, as half_matvec: one pass over the weight, each
# row widened to float32 once (a shift) for every activation row while it is in L1; the activations
# rounded to BF16 first (nearest even, as ggml's BF16 vec_dot type), the products summed in float32
@njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "contract"}, parallel=True)
def bf16_matvec(w, x, out):
    xb = np.empty(x.shape, np.uint32)
    xbits = np.ascontiguousarray(x).view(np.uint32)
    for m in range(x.shape[0]):
        for i in range(x.shape[1]):
            u = xbits[m, i]
            if (u & 0x7fffffff) > 0x7f800000:  # NaN stays NaN (quiet)
                xb[m, i] = (u | 0x400000) & 0xffff0000
            else:
                xb[m, i] = (u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000
    xf = xb.view(np.float32)
    for n in prange(w.shape[0]):
        row = np.empty(w.shape[1], np.uint32)
        for i in range(w.shape[1]):
            row[i] = np.uint32(w[n, i]) << 16
        wf = row.view(np.float32)
        for m in range(x.shape[0]):
            total = np.float32(0.0)
            xm = xf[m]
            for i in range(w.shape[1]):
                total += wf[i] * xm[i]
            out[m, n] = total


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _rounded_to_half(x):  # float32 rows rounded to F16's precision (as float32)
    out = np.empty_like(x)
    for m in range(x.shape[0]):
        for i in range(x.shape[1]):
            out[m, i] = half_to_float(float_to_half(x[m, i]))
    return out


# a micro-batch's product by a 2-D F16 weight: tiles of 4 weight rows by 4 activation rows, 16
# float32 sums that LLVM keeps in vector registers, the weight converted as it is read (no f32
# copy of it): faster than oneDNN's f32 GEMM over 2 MiB chunks of the converted weight
# (scripts/bench_cpu_peaks.py)
@njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "contract"}, parallel=True)
def half_gemm(w, x, out):
    x = _rounded_to_half(x)  # as half_matvec and ggml: products of F16 values
    n, k = w.shape
    m = x.shape[0]
    m4 = m - m % 4
    for block in prange((n + 3) // 4):
        r = 4 * block
        if r + 4 > n:  # the last rows
            for rr in range(r, n):
                for c in range(m):
                    out[c, rr] = _half_dot(w[rr], x[c])
            continue
        w0, w1, w2, w3 = w[r], w[r + 1], w[r + 2], w[r + 3]
        for c in range(0, m4, 4):
            x0, x1, x2, x3 = x[c], x[c + 1], x[c + 2], x[c + 3]
            a00 = a01 = a02 = a03 = a10 = a11 = a12 = a13 = np.float32(0.0)
            a20 = a21 = a22 = a23 = a30 = a31 = a32 = a33 = np.float32(0.0)
            for i in range(k):
                v0, v1, v2, v3 = half_to_float(w0[i]), half_to_float(w1[i]), half_to_float(w2[i]), half_to_float(w3[i])
                y0, y1, y2, y3 = x0[i], x1[i], x2[i], x3[i]
                a00 += v0 * y0
                a01 += v0 * y1
                a02 += v0 * y2
                a03 += v0 * y3
                a10 += v1 * y0
                a11 += v1 * y1
                a12 += v1 * y2
                a13 += v1 * y3
                a20 += v2 * y0
                a21 += v2 * y1
                a22 += v2 * y2
                a23 += v2 * y3
                a30 += v3 * y0
                a31 += v3 * y1
                a32 += v3 * y2
                a33 += v3 * y3
            out[c, r], out[c + 1, r], out[c + 2, r], out[c + 3, r] = a00, a01, a02, a03
            out[c, r + 1], out[c + 1, r + 1], out[c + 2, r + 1], out[c + 3, r + 1] = a10, a11, a12, a13
            out[c, r + 2], out[c + 1, r + 2], out[c + 2, r + 2], out[c + 3, r + 2] = a20, a21, a22, a23
            out[c, r + 3], out[c + 1, r + 3], out[c + 2, r + 3], out[c + 3, r + 3] = a30, a31, a32, a33
        for c in range(m4, m):
            for rr in range(r, r + 4):
                out[c, rr] = _half_dot(w[rr], x[c])


@jit
def half_at(raw, o):  # the F16 stored little-endian at byte o, as float32
    return half_to_float(np.uint16(np.uint16(raw[o]) | (np.uint16(raw[o + 1]) << 8)))


@jit
def q4_0_row(raw, y):  # blocks of d f16 and 16 bytes of nibbles: d * (q - 8)
    for b in range(y.shape[0] // 32):
        o = b * 18
        d = half_at(raw, o)
        for j in range(16):
            q = raw[o + 2 + j]
            y[b * 32 + j] = d * np.float32(np.int32(q & 15) - 8)
            y[b * 32 + 16 + j] = d * np.float32(np.int32(q >> 4) - 8)


@jit
def iq4_nl_row(raw, y):  # Q4_0's blocks, each nibble an index into kvalues_iq4nl: d * value
    for b in range(y.shape[0] // 32):
        o = b * 18
        d = half_at(raw, o)
        for j in range(16):
            q = raw[o + 2 + j]
            y[b * 32 + j] = d * IQ4_NL_VALUES[q & 15]
            y[b * 32 + 16 + j] = d * IQ4_NL_VALUES[q >> 4]


@jit
def q8_0_row(raw, y):  # blocks of d f16 and 32 int8: d * q
    for b in range(y.shape[0] // 32):
        o = b * 34
        d = half_at(raw, o)
        for j in range(32):
            y[b * 32 + j] = d * np.float32(np.int8(raw[o + 2 + j]))


@jit
def q4_k_row(raw, y):  # 8 sub-blocks of 32: (d * sc) * q - dmin * m, 6-bit sc and m packed in 12 bytes
    for b in range(y.shape[0] // 256):
        o = b * 144
        d, dmin = half_at(raw, o), half_at(raw, o + 2)
        s = o + 4
        for sub in range(8):
            if sub < 4:
                sc, m = raw[s + sub] & 63, raw[s + 4 + sub] & 63
            else:
                sc = (raw[s + 4 + sub] & 15) | ((raw[s + sub - 4] >> 6) << 4)
                m = (raw[s + 4 + sub] >> 4) | ((raw[s + sub] >> 6) << 4)
            d1, m1 = d * np.float32(sc), dmin * np.float32(m)
            q0 = o + 16 + (sub // 2) * 32
            shift = 4 * (sub % 2)
            for j in range(32):
                y[b * 256 + sub * 32 + j] = d1 * np.float32((raw[q0 + j] >> shift) & 15) - m1


@jit
def q6_k_row(raw, y):  # 16 sub-blocks of 16: (d * scale) * (q - 32), q's low 4 and high 2 bits apart
    for b in range(y.shape[0] // 256):
        o = b * 210
        d = half_at(raw, o + 208)
        for i in range(256):
            r, j = i // 32, i % 32
            low = (raw[o + (r // 4) * 64 + (r % 2) * 32 + j] >> (4 * ((r // 2) % 2))) & 15
            high = (raw[o + 128 + (r // 4) * 32 + j] >> (2 * (r % 4))) & 3
            scale = np.float32(np.int8(raw[o + 192 + i // 16]))
            y[b * 256 + i] = (d * scale) * np.float32(np.int32(low | (high << 4)) - 32)


@jit
def q2_k_row(raw, y):  # 16 sub-blocks of 16: (d * sc) * q - dmin * m, a byte of 4-bit sc and m, 2-bit q
    for b in range(y.shape[0] // 256):
        o = b * 84
        d, dmin = half_at(raw, o + 80), half_at(raw, o + 82)
        for i in range(256):
            h, j, l = i // 128, (i % 128) // 32, i % 32
            s = raw[o + i // 16]
            q = (raw[o + 16 + 32 * h + l] >> (2 * j)) & 3
            y[b * 256 + i] = (d * np.float32(s & 15)) * np.float32(q) - dmin * np.float32(s >> 4)


@jit
def q3_k_row(raw, y):  # 16 sub-blocks of 16: (d * (sc - 32)) * (q - 4 unless its high bit), 6-bit sc in 12 bytes
    for b in range(y.shape[0] // 256):
        o = b * 110
        d = half_at(raw, o + 108)
        for i in range(256):
            h, j, l, t = i // 128, (i % 128) // 32, i % 32, i // 16
            sc = ((raw[o + 96 + t % 8] >> (4 * (t // 8))) & 15) | (((raw[o + 104 + t % 4] >> (2 * (t // 4))) & 3) << 4)
            q = np.int32((raw[o + 32 + 32 * h + l] >> (2 * j)) & 3) - (0 if (raw[o + l] >> (4 * h + j)) & 1 else 4)
            y[b * 256 + i] = (d * np.float32(np.int32(sc) - 32)) * np.float32(q)


@jit
def get_block_rows(table, ids, out, kind):
    n_rows = table.shape[2]
    for i3 in range(out.shape[0]):
        for i2 in range(out.shape[1]):
            for j in range(out.shape[2]):
                r = ids[i3, i2, j]
                if r < 0 or r >= n_rows:
                    return j
                raw, y = table[i3, i2, r], out[i3, i2, j]
                if kind == 0:
                    q4_0_row(raw, y)
                elif kind == 1:
                    q8_0_row(raw, y)
                elif kind == 2:
                    q4_k_row(raw, y)
                elif kind == 3:
                    q6_k_row(raw, y)
                elif kind == 4:
                    iq4_nl_row(raw, y)
                elif kind == 5:
                    q2_k_row(raw, y)
                else:
                    q3_k_row(raw, y)
    return -1


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _seen_range(mask, has_mask, t, n_kv):
    """(first, end): the cells row t's mask does not hide (-inf) lie in first..end-1 (0, 0: none)."""
    if not has_mask:
        return 0, n_kv
    first = 0
    while first < n_kv and load(mask[t, first]) == -np.inf:
        first += 1
    end = n_kv
    while end > first and load(mask[t, end - 1]) == -np.inf:
        end -= 1
    return (first, end) if end > first else (0, 0)


# attention of a few query rows (decode), fused. Each thread takes a run of heads and walks the
# cells once for all of them: a cell's K (V) rows of those heads lie side by side, so each cell is
# one contiguous read the hardware prefetcher follows, and a K/V head shared by several query
# heads (GQA) is read once (head by head, every cell's rows of one head lie a cache row apart)
@njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "contract"}, parallel=True)
def decode_attention(k, v, strides, n_kv, n_head_kv, q, mask, has_mask, scale, scratch, out, n_threads):
    n_head, n_tok, d_v = scratch.shape
    d_k = q.shape[2]
    k_head_stride, k_cell_stride, v_head_stride, v_cell_stride = strides[0], strides[1], strides[2], strides[3]
    group = n_head // n_head_kv
    n_runs = min(n_head, n_threads)
    per = (n_head + n_runs - 1) // n_runs               # heads a task
    n_runs = (n_head + per - 1) // per
    for task in prange(n_runs * n_tok):
        t, h0 = task % n_tok, (task // n_tok) * per
        g = min(per, n_head - h0)
        # the task's query rows, contiguous: the dots below compile to one loop (the same sums)
        # whether q is a decode step's contiguous row or a batched step's strided rows
        qs = np.empty((g, d_k), np.float32)
        for hi in range(g):
            qs[hi] = q[h0 + hi, t]
        # only the cells between the first and the last the mask shows are walked: a decode
        # step's graph attends to the cache padded past its used cells (kv_cache.KV_PAD)
        first, end = _seen_range(mask, has_mask, t, n_kv)
        scores = np.empty((g, n_kv), np.float32)
        peak = np.full(g, -np.inf, np.float32)
        nan = np.zeros(g, np.bool_)
        for j in range(first, end):
            m = load(mask[t, j]) if has_mask else np.float32(0.0)
            if m == -np.inf:  # a cell the mask hides: neither K nor V is read (as flash attention)
                for hi in range(g):
                    scores[hi, j] = m
                continue
            ahead = (h0 // group) * k_head_stride + (j + PREFETCH_CELLS) * k_cell_stride
            for line in range(0, ((g + group - 1) // group) * k_head_stride, 32):  # 32 halves a cache line
                prefetch(k, ahead + line)
            for hi in range(g):
                at = ((h0 + hi) // group) * k_head_stride + j * k_cell_stride
                k_row, q_row = k[at:at + d_k], qs[hi]
                total = np.float32(0.0)
                for i in range(d_k):
                    total += half_to_float(k_row[i]) * q_row[i]
                s = total * scale + m
                scores[hi, j] = s
                nan[hi] |= s != s
                peak[hi] = s if s > peak[hi] else peak[hi]
        inv = np.empty(g, np.float32)
        for hi in range(g):
            shift = softmax_shift(peak[hi], nan[hi])
            weight_sum = 0.0
            for j in range(first, end):
                if scores[hi, j] != -np.inf:
                    scores[hi, j] = exp_f32(scores[hi, j] - shift)
                    weight_sum += scores[hi, j]
                else:
                    scores[hi, j] = np.float32(0.0)
            inv[hi] = np.float32(1.0 / (weight_sum if weight_sum != 0.0 else 1.0))
        o = np.zeros((g, d_v), np.float32)
        for j in range(first, end):
            if has_mask and load(mask[t, j]) == -np.inf:
                continue
            ahead = (h0 // group) * v_head_stride + (j + PREFETCH_CELLS) * v_cell_stride
            for line in range(0, ((g + group - 1) // group) * v_head_stride, 32):
                prefetch(v, ahead + line)
            for hi in range(g):
                at = ((h0 + hi) // group) * v_head_stride + j * v_cell_stride
                v_row, o_row, p = v[at:at + d_v], o[hi], scores[hi, j] * inv[hi]
                for i in range(d_v):
                    o_row[i] += p * half_to_float(v_row[i])
        for hi in range(g):
            for i in range(d_v):
                scratch[h0 + hi, t, i] = o[hi, i]
    for h in range(n_head):  # after every head's reads: out may lie over q (freed after KQ)
        for t in range(n_tok):
            for i in range(d_v):
                out[h, t, i] = scratch[h, t, i]


# query rows a task of the prompt's attention takes: its scores are one row block of cells,
# the cells any of its rows sees (a causal mask's blocks see a prefix; the cells past it are not read)
PROMPT_ATTENTION_ROWS = 16


@jit
def _seen_cells(mask, has_mask, n_tok, n_kv, seen):
    """seen[t] = _seen_range of row t."""
    for t in range(n_tok):
        seen[t, 0], seen[t, 1] = _seen_range(mask, has_mask, t, n_kv)


@njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "contract"}, inline="always")
def _add_products(out, weights, table, row0, col0, skip_zeros):
    """out += sum_i weights[i] table[row0 + i, col0:col0 + len(out)], four rows a pass over out
    (one load and store of out per four products; table C-contiguous, so that the loops
    vectorize). skip_zeros: a row whose weight is 0 is not read (a cell the mask hides: its
    values may be anything, NaN too)."""
    n, c1 = weights.shape[0], col0 + out.shape[0]
    for i in range(0, n - n % 4, 4):
        w0, w1, w2, w3 = weights[i], weights[i + 1], weights[i + 2], weights[i + 3]
        if skip_zeros and (w0 == 0 or w1 == 0 or w2 == 0 or w3 == 0):
            for e in range(i, i + 4):
                _add_product(out, weights[e], table[row0 + e, col0:c1], skip_zeros)
            continue
        r0, r1, r2, r3 = (table[row0 + i, col0:c1], table[row0 + i + 1, col0:c1], table[row0 + i + 2, col0:c1],
                          table[row0 + i + 3, col0:c1])
        for j in range(out.shape[0]):
            out[j] += w0 * r0[j] + w1 * r1[j] + w2 * r2[j] + w3 * r3[j]
    for e in range(n - n % 4, n):
        _add_product(out, weights[e], table[row0 + e, col0:c1], skip_zeros)


@njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "contract"}, inline="always")
def _add_product(out, w, row, skip_zeros):
    if skip_zeros and w == 0:
        return
    for j in range(out.shape[0]):
        out[j] += w * row[j]


# the attention of a prompt's rows, fused: K and V converted to float32 once (K transposed, so a
# block's scores are products along contiguous cells), then each task (a head, PROMPT_ATTENTION_ROWS
# query rows) computes its rows' scores over the cells they see, their softmax and the weighted V
@njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "contract"}, parallel=True)
def prompt_attention(k, v, strides, n_kv, n_head_kv, q, mask, has_mask, scale, scratch, out, n_threads, kt, vf):
    n_head, n_tok, d_v = scratch.shape
    d_k = q.shape[2]
    k_head_stride, k_cell_stride, v_head_stride, v_cell_stride = strides[0], strides[1], strides[2], strides[3]
    group = n_head // n_head_kv
    seen = np.empty((n_tok, 2), np.int64)
    _seen_cells(mask, has_mask, n_tok, n_kv, seen)
    lo, hi = n_kv, 0
    for t in range(n_tok):
        if seen[t, 1] > seen[t, 0]:
            lo, hi = min(lo, seen[t, 0]), max(hi, seen[t, 1])
    # kt [n_head_kv, d_k, n_kv + TILE_WIDTH], vf [n_head_kv, n_kv, d_v]: cells lo..hi-1 written,
    # the only ones whose products are read
    for task in prange(n_head_kv * n_threads):
        hk, part = task // n_threads, task % n_threads
        for j in range(lo + part, hi, n_threads):
            k_at, v_at = hk * k_head_stride + j * k_cell_stride, hk * v_head_stride + j * v_cell_stride
            for i in range(d_k):
                kt[hk, i, j] = half_to_float(k[k_at + i])
            for i in range(d_v):
                vf[hk, j, i] = half_to_float(v[v_at + i])
    n_blocks = (n_tok + PROMPT_ATTENTION_ROWS - 1) // PROMPT_ATTENTION_ROWS
    for task in prange(n_head * n_blocks):
        h, t0 = task // n_blocks, (task % n_blocks) * PROMPT_ATTENTION_ROWS
        hk, rows = h // group, min(PROMPT_ATTENTION_ROWS, n_tok - t0)
        first, end = n_kv, 0
        for r in range(rows):
            if seen[t0 + r, 1] > seen[t0 + r, 0]:
                first, end = min(first, seen[t0 + r, 0]), max(end, seen[t0 + r, 1])
        width = max(end - first, 0)
        # the block's q rows side by side (4 rows a tile: padded with zeros), its scores in
        # tiles of TILE_WIDTH cells (the columns past its width unread)
        qs = np.zeros((rows + (-rows) % 4, d_k), np.float32)
        for r in range(rows):
            qs[r] = q[h, t0 + r]
        scores = np.zeros((qs.shape[0], width + (-width) % TILE_WIDTH), np.float32)
        for r in range(0, qs.shape[0], 4):
            for c in range(0, scores.shape[1], TILE_WIDTH):
                add_tile(qs, kt[hk], scores, r, c, first + c, d_k)
        for r in range(rows):
            t, s_row, o_row = t0 + r, scores[r, :width], scratch[h, t0 + r]
            o_row[:] = 0
            if seen[t, 1] <= seen[t, 0]:  # no cell: weights 0
                s_row[:] = 0
                continue
            m_row = mask[t, first:end] if has_mask else mask[0, :0]
            peak, nan = np.float32(-np.inf), False
            for j in range(width):
                m = load(m_row[j]) if has_mask else np.float32(0.0)
                s = s_row[j] * scale + m if m != -np.inf else m  # a hidden cell's K is not read
                s_row[j] = s
                nan |= s != s
                peak = s if s > peak else peak
            shift = softmax_shift(peak, nan)
            weight_sum = 0.0
            for j in range(width):
                s_row[j] = exp_f32(s_row[j] - shift)
                weight_sum += s_row[j]
            inv = np.float32(1.0 / (weight_sum if weight_sum != 0.0 else 1.0))
            for j in range(width):
                s_row[j] *= inv
            if d_v % TILE_WIDTH:
                _add_products(o_row, s_row, vf[hk], first, 0, True)
        if d_v % TILE_WIDTH == 0:  # the weighted V rows in tiles (a hidden cell's weight is 0)
            o = np.zeros((qs.shape[0], d_v), np.float32)
            for r in range(0, qs.shape[0], 4):
                for c in range(0, d_v, TILE_WIDTH):
                    add_tile(scores, vf[hk, first:end], o, r, c, c, width)
            for r in range(rows):
                scratch[h, t0 + r] = o[r]
    for h in prange(n_head):  # after every head's reads: out may lie over q (freed after KQ)
        for t in range(n_tok):
            for i in range(d_v):
                out[h, t, i] = scratch[h, t, i]
