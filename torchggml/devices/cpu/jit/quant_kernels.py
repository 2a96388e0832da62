"""Fused products over the (q, scale, bias) layout, compiled by numba for the host CPU.

quant_kernels() (loader.py) holds:
    matvec(q, scale, bias, has_bias, kind, w_row0, xq, xd, xsum, x_row, out)
        out[m, n] = sum_k W[w_row0[m] + n, k] x[x_row[m], k]
    block_matvec(blocks, kind, w_row0, xq, xd, xsum, x_row, out) / dequantize_blocks(blocks, kind, out)
        the same over ggml's Q8_0 / Q4_0 / Q4_K / Q5_K / Q6_K / IQ4_NL / IQ4_XS blocks in place (no repacking; the
        dequantize is llvm_ir's blocks_to_float, a vector loop per row, bit-exact with ggml's)
    offset_block_matvec(...) / dequantize_offset_blocks(blocks, kind, out)
        the same over ggml's Q4_1 / Q5_0 / Q5_1 blocks in place (xsum: the activations' group
        sums, for Q4_1's and Q5_1's mins)
    low_k_block_matvec(...) / dequantize_low_k_blocks(blocks, kind, out)
        the same over ggml's Q2_K / Q3_K blocks in place (activations per 16 as the converted
        layout's, float32 scales)
    (both take MUL_MAT's rows ROWS at a time: llvm_ir's rows_dot, each weight row unpacked once
    for them, the same results as one row at a time)
    rows_block_matvecs(a, b, c, kind, x, xq, xd, xsum, bsums, minus, w_row0, x_row, out_a, out_b, out_c)
        block_matvec of up to three weights of one kind by float32 rows x, rounded to int8 once
        in the same call (decode's products: a layer's q, k and v in one parallel region; the
        rounding in LLVM vectors: rounding_ir, bit for bit quantize_rows' and
        quantize_rows_q8_k's, Q4_0's and IQ4_NL's pair order written as it rounds)
    rows_matvec(q, scale, bias, has_bias, kind, half_scales, x, xq, xd, xsum, w_row0, x_row, out)
        the same for matvec (the converted types' decode products)
    quantize_rows(x, g, xq, xd, xsum)                  activations to int8 per group of g
    quantize_rows_q8_k(x, xq, xd, bsums)               the same per 256, as ggml's Q8_K
    dequantize_rows / dequantize_nibbles / dequantize_six_bits(..., out)
        out[n, k] = W[n, k], float32 or bfloat16 bits (the prompt path's GEMM weight)

q: int8 [rows, K], or packed uint8 (kind 4/-4: two 4-bit values a byte; kind 6: Q6_K's 6-bit
values, 24 bytes per 32); scale f32 [rows, K/G] (or float16 bits as int16), bias f32 (unused
when has_bias is False); xq int8 [X, K] and xd f32 [X, K/G] the activations rounded as ggml's
Q8_0 vec_dot type rounds them, xsum f32 [X, K/G] their group sums (for the bias); out f32 [M, N].
w_row0 and x_row (int64 [M]) pick each output row's weight matrix (its first row in q, where
MUL_MAT_ID's experts lie stacked) and activation row; MUL_MAT passes zeros and 0..M-1.

Their LLVM IR is in llvm_ir.py. Why this shape: numba types
int8*int8 products as int64, so an integer dot written as a numba
loop stays scalar. The row's dot product is instead one LLVM vector loop emitted by an
intrinsic (_row_dot_intrinsic) that keeps 8 float lanes across groups and multiplies bytes with
the CPU's byte dot instruction, as ggml's SIMD kernels do: vpdpbusd on AVX512-VNNI/AVX-VNNI,
vpmaddubsw + vpmaddwd on AVX2 (chosen from numba's target features), LLVM's own lowering of a
widening multiply elsewhere (NEON sdot/smlal, SSE). It beat both a horizontal sum per group and
LLVM's widening multiply (scripts/bench_cpu_quant.py).

The kernels live at module level: numba's disk cache keys a function on its code and its
closure, and a closure holding other jitted functions pickles differently in every process (a
recompile, ~10 s for a quantized model's first prompt, at every start).
"""
import numpy as np
from numba import njit, prange, uint64

from .halves import round_to_half
from .llvm_ir import IQ4_NL_KIND, _half_bits_intrinsic, _row_dot_intrinsic, _row_output_helpers, target_features
from .rounding_ir import _rounding_intrinsics


row_dot, rows_dot, weight_rows_dot, unpack_nibbles, unpack_six, blocks_to_float = _row_dot_intrinsic()
# the block matvecs' output columns a parallel step computes (of one weight: the step picks its
# weight once, not a weight per column)
CHUNK = 16
# MUL_MAT's activation rows a weight row is multiplied by in one rows_dot (its bytes loaded and
# unpacked once for them); the last M % ROWS rows go one at a time
ROWS = 4
# Q4_0's and IQ4_NL's weight rows one weight_rows_dot multiplies by one activation row (each
# activation row outside rows_dot's: a decode step's), a divisor of CHUNK: their float sums
# (ACCUMULATORS vectors a row) fill AVX-512's 32 vector registers, half of them AVX2's 16
WEIGHT_ROWS = 8 if "avx512vl" in target_features() else 4
# the longest weight rows (bytes) weight_rows_dot takes: it reads its rows side by side, a few
# bytes of each in turn, and on longer rows the CPU's prefetcher stops following that (the
# product then waits on memory: scripts/bench_weight_rows.py); longer rows go one at a time
# (row_dot), each read from its start to its end
GROUPED_ROW_BYTES = 384
_float_row, _store_row = _row_output_helpers()
half_to_f32 = _half_bits_intrinsic()


@njit(fastmath=True, cache=True, nogil=True, inline="always")
def _bias_dot(bias, xsum):
    """sum_j bias[j] * xsum[j]: the groups' offsets times the activations' group sums."""
    acc = np.float32(0)
    for j in range(bias.shape[0]):
        acc += bias[j] * xsum[j]
    return acc


NAN_BITS = np.uint32(0x7FC00000)
# the activations' rounding as LLVM vectors, bit for bit quantize_rows' (32) and quantize_rows_q8_k's
round_row_q8_0, round_row_q8_0_pairs, round_row_q8_k = _rounding_intrinsics(int(NAN_BITS))


@njit(cache=True, nogil=True, inline="always")
def has_non_finite(bits, start, stop):
    """Whether values start..stop of a float32 row, given as its uint32 bits, hold an infinity
    or a NaN. A rounded block that held one gets a NaN scale (NAN_BITS, stored as bits) so its
    products are NaN, as a float GEMM's would be non-finite, not finite values (the comparisons
    that find a block's largest magnitude skip NaN; an infinite one divided by zero in Q8_K's
    rounding): these kernels' fastmath lets LLVM assume finite float code, hence the bits."""
    bad = np.uint32(0)
    for i in range(start, stop):
        bad |= np.uint32((bits[i] & np.uint32(0x7FFFFFFF)) >= np.uint32(0x7F800000))
    return bad != 0


@njit(fastmath=True, cache=True, nogil=True)
def quantize_rows(x, g, xq, xd, xsum):
    """x f32 [M, K] -> int8 [M, K] and scales [M, K/g] per group of g (ggml's Q8_0 rounding:
    d = max|x| / 127, q = round(x / d)), and the groups' sums d * sum(q) (for weights with
    offsets, as ggml's Q8_1 s and Q8_K bsums: the sum of the rounded values, whose rounding then
    cancels between a weight's values and its offset; the sum of x did not, and doubled the
    error of a Q4_K product against float64)."""
    m_rows, k = x.shape
    for m in range(m_rows):
        bits = x[m].view(np.uint32)
        for j in range(k // g):
            amax = np.float32(0)
            for i in range(j * g, j * g + g):
                amax = max(amax, abs(x[m, i]))
            d = amax / np.float32(127)
            inv = np.float32(1) / d if d > 0 else np.float32(0)
            total = 0
            for i in range(j * g, j * g + g):
                q = np.int8(np.round(x[m, i] * inv))
                xq[m, i] = q
                total += np.int32(q)
            xd[m, j] = d
            xsum[m, j] = d * np.float32(total)
            if has_non_finite(bits, j * g, j * g + g):
                xd[m:m + 1, j].view(np.uint32)[0] = NAN_BITS
                xsum[m:m + 1, j].view(np.uint32)[0] = NAN_BITS


@njit(fastmath=True, cache=True, nogil=True)
def quantize_rows_q8_k(x, xq, xd, bsums):
    """x f32 [M, K] -> int8 [M, K], one scale per 256 values xd [M, K/256] and the int16 sums of
    each 16 rounded values bsums [M, K/16], as ggml's Q8_K (the K-quants' activations):
    d = max / -127 with max the value of largest magnitude, q = min(127, round(x / d))."""
    m_rows, k = x.shape
    for m in range(m_rows):
        bits = x[m].view(np.uint32)
        for b in range(k // 256):
            if has_non_finite(bits, 256 * b, 256 * b + 256):
                xq[m, 256 * b:256 * b + 256] = 0
                bsums[m, 16 * b:16 * b + 16] = 0
                xd[m:m + 1, b].view(np.uint32)[0] = NAN_BITS
                continue
            amax, vmax = np.float32(0), np.float32(0)
            for i in range(256 * b, 256 * b + 256):
                if abs(x[m, i]) > amax:
                    amax, vmax = abs(x[m, i]), x[m, i]
            if amax == 0:
                xd[m, b] = 0
                for i in range(256 * b, 256 * b + 256):
                    xq[m, i] = 0
                for j in range(16 * b, 16 * b + 16):
                    bsums[m, j] = 0
                continue
            iscale = np.float32(-127) / vmax
            for j in range(16 * b, 16 * b + 16):
                total = 0
                for i in range(16 * j, 16 * j + 16):
                    q = min(127, np.int32(np.round(iscale * x[m, i])))
                    xq[m, i] = q
                    total += q
                bsums[m, j] = total
            xd[m, b] = np.float32(1) / iscale


@njit(cache=True, nogil=True, inline="always")
def _plain(w_row0, x_row):
    """Whether output row i reads activation row i and the first matrix (MUL_MAT's rows)."""
    for i in range(x_row.shape[0]):
        if w_row0[i] != 0 or x_row[i] != i:
            return False
    return True


@njit(fastmath=True, cache=True, nogil=True, inline="always")
def _rows_of_four(q, scale, kind, xq, xd, m):
    """rows_dot of the fused kinds' weight row (q, scale) by activation rows m .. m + ROWS - 1."""
    if kind == 32:
        return rows_dot(q, scale, xq, xd, xd, m, 32, ROWS)
    if kind == 16:
        return rows_dot(q, scale, xq, xd, xd, m, 16, ROWS)
    if kind == 6:
        return rows_dot(q, scale, xq, xd, xd, m, 6, ROWS)
    if kind == 4:
        return rows_dot(q, scale, xq, xd, xd, m, 4, ROWS)
    return rows_dot(q, scale, xq, xd, xd, m, -4, ROWS)


@njit(fastmath=True, parallel=True, cache=True, nogil=True)
def matvec(q, scale, bias, has_bias, kind, w_row0, xq, xd, xsum, x_row, out):
    """out[i, n] = row w_row0[i] + n of W times activation row x_row[i]. kind: 32 or 16 for int8
    weights [rows, K] in groups of that size, 4 for 4-bit ones packed [rows, K/2] (byte i of a
    32-value group: value i low nibble, value i + 16 high), -4 for the same minus 8 (Q4_0), 6
    for Q6_K's 6-bit values (24 bytes per 32, see six_bit_values); W = q*scale (+ bias).
    MUL_MAT's rows (plain) go ROWS at a time through rows_dot."""
    plain = _plain(w_row0, x_row)
    blocked = out.shape[0] // ROWS * ROWS if plain else 0
    for n in prange(out.shape[1]):
        for m0 in range(0, blocked, ROWS):
            dots = _rows_of_four(q[n], scale[n], kind, xq, xd, m0)
            for i in range(ROWS):
                acc = dots[i]
                if has_bias:
                    acc += _bias_dot(bias[n], xsum[m0 + i])
                out[m0 + i, n] = acc
        for m in range(blocked, out.shape[0]):
            r, x = w_row0[m] + n, x_row[m]
            if kind == 32:  # row_dot's kind is a compile-time constant: one branch each
                acc = row_dot(q[r], xq[x], scale[r], xd[x], 32)
            elif kind == 16:
                acc = row_dot(q[r], xq[x], scale[r], xd[x], 16)
            elif kind == 6:
                acc = row_dot(q[r], xq[x], scale[r], xd[x], 6)
            elif kind == 4:
                acc = row_dot(q[r], xq[x], scale[r], xd[x], 4)
            else:
                acc = row_dot(q[r], xq[x], scale[r], xd[x], -4)
            if has_bias:
                acc += _bias_dot(bias[r], xsum[x])
            out[m, n] = acc


@njit(fastmath=True, cache=True, nogil=True)  # matvec's own prange runs it on the threads
def rows_matvec(q, scale, bias, has_bias, kind, half_scales, x, xq, xd, xsum, w_row0, x_row, out):
    """matvec of float32 activation rows x [X, K], each first rounded into xq, xd and xsum as
    quantize_rows rounds them (groups of xq.shape[1] // xd.shape[1]; the scales then to float16
    where half_scales, as ggml's Q8_0/Q8_1): one call a decode step's product of the converted
    types, what layouts/fused._matvec computes in three."""
    quantize_rows(x, xq.shape[1] // xd.shape[1], xq, xd, xsum)
    if half_scales:
        for m in range(xd.shape[0]):
            for j in range(xd.shape[1]):
                xd[m, j] = round_to_half(xd[m, j])
    matvec(q, scale, bias, has_bias, kind, w_row0, xq, xd, xsum, x_row, out)


@njit(fastmath=True, cache=True, nogil=True)
def pair_activations(xq, xp, minus):
    """Q4_0's activations as its row_dot (llvm_ir's q4_0_pairs_dot) reads two blocks at once: in
    each 64 values of a block pair, the values 0-15 of both blocks, then 16-31 of both (an odd
    last block as it is); minus [X, 8 * ceil(blocks / 2)] int32: the pairs' terms of the blocks'
    sums (pair_sums)."""
    n_blocks = xq.shape[1] // 32
    sums = np.empty(xq.shape[1] // 16, np.int32)
    for x in range(xq.shape[0]):
        for p in range(n_blocks // 2):
            b = 64 * p
            for i in range(16):
                xp[x, b + i] = xq[x, b + i]
                xp[x, b + 16 + i] = xq[x, b + 32 + i]
                xp[x, b + 32 + i] = xq[x, b + 16 + i]
                xp[x, b + 48 + i] = xq[x, b + 48 + i]
        if n_blocks % 2:
            b = 32 * (n_blocks - 1)
            for i in range(32):
                xp[x, b + i] = xq[x, b + i]
        for j in range(sums.shape[0]):
            total = 0
            for i in range(16 * j, 16 * j + 16):
                total += np.int32(xq[x, i])
            sums[j] = total
        pair_sums(sums, minus[x])


@njit(fastmath=True, cache=True, nogil=True, inline="always")
def pair_sums(sums, minus):
    """minus [8 * ceil(blocks / 2)] int32 from a row's sums of each 16 rounded values: per block
    pair 4 lanes of 2 S for each block (S its sum of x: the lanes add up to the 8 S of
    sum (u - 8) x = sum u x - 8 S), 8 lanes of S for an odd last block."""
    n_blocks = sums.shape[0] // 2
    for p in range(n_blocks // 2):
        first = sums[4 * p] + sums[4 * p + 1]
        second = sums[4 * p + 2] + sums[4 * p + 3]
        for lane in range(4):
            minus[8 * p + lane] = 2 * first
            minus[8 * p + 4 + lane] = 2 * second
    if n_blocks % 2:
        total = sums[2 * n_blocks - 2] + sums[2 * n_blocks - 1]
        for lane in range(8):
            minus[8 * (n_blocks // 2) + lane] = total


@njit(cache=True, nogil=True, inline="always")
def _paired(kind):
    """Q4_0's and IQ4_NL's blocks, whose row_dot reads the activations in pair order."""
    return kind == 18 or kind == IQ4_NL_KIND


@njit(fastmath=True, cache=True, nogil=True)
def round_rows_q8_0(x, xq, xd, xsum, paired, minus):
    """quantize_rows(x, 32, ...) then the scales to float16 (ggml's Q8_0 for the Q8_0-rounded
    kinds' decode products), in LLVM vectors; where paired (Q4_0, IQ4_NL) xq in pair order and
    minus the pairs' terms (pair_activations: one pass, not two)."""
    sums = np.empty(xq.shape[1] // 16, np.int32)
    for m in range(x.shape[0]):
        if paired:
            round_row_q8_0_pairs(x[m], xq[m], xd[m], sums)
            pair_sums(sums, minus[m])
        else:
            round_row_q8_0(x[m], xq[m], xd[m], sums)
        for j in range(xd.shape[1]):
            d = xd[m, j]
            xsum[m, j] = d * np.float32(sums[2 * j] + sums[2 * j + 1])
            xd[m, j] = round_to_half(d)


@njit(fastmath=True, cache=True, nogil=True)
def round_rows_q8_k(x, xq, xd, bsums):
    """quantize_rows_q8_k in LLVM vectors."""
    sums = np.empty(xq.shape[1] // 16, np.int32)
    for m in range(x.shape[0]):
        round_row_q8_k(x[m], xq[m], xd[m], sums)
        for j in range(sums.shape[0]):
            bsums[m, j] = sums[j]


@njit(fastmath=True, cache=True, nogil=True, inline="always")
def _block_rows_of_four(w, kind, xp, sums, xsum, xd, m):
    """rows_dot of a row of ggml's blocks w by activation rows m .. m + ROWS - 1."""
    if kind == 34:
        return rows_dot(w, xd[0], xp, xd, xd, m, 34, ROWS)
    if kind == 18:
        return rows_dot(w, xd[0], xp, sums, xd, m, 18, ROWS)
    if kind == IQ4_NL_KIND:
        return rows_dot(w, xd[0], xp, sums, xd, m, IQ4_NL_KIND, ROWS)
    if kind == 144:
        return rows_dot(w, xd[0], xp, xsum, xd, m, 144, ROWS)
    if kind == 176:
        return rows_dot(w, xd[0], xp, xsum, xd, m, 176, ROWS)
    if kind == 136:
        return rows_dot(w, xd[0], xp, xsum, xd, m, 136, ROWS)
    return rows_dot(w, xd[0], xp, xsum, xd, m, 210, ROWS)


@njit(fastmath=True, cache=True, nogil=True)  # paired_block_matvecs' own prange runs it on the threads
def block_matvec(blocks, kind, w_row0, xq, xd, xsum, x_row, out):
    """matvec over ggml's blocks in place (blocks uint8 [rows, row bytes]): kind 34 for Q8_0,
    18 for Q4_0, IQ4_NL_KIND for IQ4_NL (xq, xd from quantize_rows, groups of 32), 144 for Q4_K, 176 for Q5_K,
    210 for Q6_K, 136 for IQ4_XS (xq, xd,
    xsum from quantize_rows_q8_k) (llvm_ir.BLOCK_KINDS; the scales and mins are read from the blocks).
    MUL_MAT's rows (plain) go ROWS at a time through rows_dot."""
    # Q4_0 and IQ4_NL: the activations in their pair order and their sums' terms, once per
    # activation row
    n_x, k = xq.shape
    pairs = _paired(kind)
    xp = np.empty_like(xq) if pairs else xq
    sums = np.empty((n_x, 8 * ((k // 32 + 1) // 2) if pairs else 0), np.int32)
    if pairs:
        pair_activations(xq, xp, sums)
    none = np.empty((out.shape[0], 0), np.float32)
    paired_block_matvecs(blocks, blocks[:0], blocks[:0], kind, w_row0, xp, xd, sums, xsum, x_row, out, none, none)


@njit(cache=True, nogil=True, inline="always")
def _n_chunks(out_a, out_b, out_c):
    """The matvecs' parallel steps: CHUNK output columns of one product each."""
    return (out_a.shape[1] + CHUNK - 1) // CHUNK + (out_b.shape[1] + CHUNK - 1) // CHUNK + \
        (out_c.shape[1] + CHUNK - 1) // CHUNK


@njit(cache=True, nogil=True, inline="always")
def _chunk(j, a, b, c, out_a, out_b, out_c):
    """The weight and output of parallel step j, and its columns first .. stop - 1."""
    t = np.int64(j)  # prange's index may be unsigned: with a signed one, a float
    c_a, c_b = (out_a.shape[1] + CHUNK - 1) // CHUNK, (out_b.shape[1] + CHUNK - 1) // CHUNK
    w, out, first = a, out_a, t * CHUNK
    if t >= c_a + c_b:
        w, out, first = c, out_c, (t - c_a - c_b) * CHUNK
    elif t >= c_a:
        w, out, first = b, out_b, (t - c_a) * CHUNK
    return w, out, first, min(first + CHUNK, out.shape[1])


@njit(fastmath=True, cache=True, nogil=True, inline="always")
def _weight_rows(w, kind, first, stop, r0, x, sums, xd, out_row):
    """out_row[n] = row_dot of Q4_0's or IQ4_NL's row r0 + n of w by one activation row (x,
    sums, xd: row_dot's x, scale and xd) for n from first, WEIGHT_ROWS rows a weight_rows_dot:
    the first n it leaves (the last rows of a part chunk, or every row of a weight with rows
    longer than GROUPED_ROW_BYTES, for row_dot)."""
    if w.shape[1] > GROUPED_ROW_BYTES:
        return first
    grouped = first + (stop - first) // WEIGHT_ROWS * WEIGHT_ROWS
    for n in range(first, grouped, WEIGHT_ROWS):
        if kind == 18:
            dots = weight_rows_dot(w, r0 + n, x, sums, xd, 18, WEIGHT_ROWS)
        else:
            dots = weight_rows_dot(w, r0 + n, x, sums, xd, IQ4_NL_KIND, WEIGHT_ROWS)
        for i in range(WEIGHT_ROWS):
            out_row[n + i] = dots[i]
    return grouped


@njit(fastmath=True, parallel=True, cache=True, nogil=True)
def paired_block_matvecs(a, b, c, kind, w_row0, xp, xd, sums, xsum, x_row, out_a, out_b, out_c):
    """block_matvec of up to three weights a, b, c of one kind (b, c with no rows, out_b, out_c no
    columns, where fewer) by the same activations, in one parallel region, with Q4_0's and
    IQ4_NL's activations already in pair order (xp, their terms sums; pair_activations)."""
    blocked = out_a.shape[0] // ROWS * ROWS if _plain(w_row0, x_row) else 0
    for j in prange(_n_chunks(out_a, out_b, out_c)):
        w, out, first, stop = _chunk(j, a, b, c, out_a, out_b, out_c)
        for n in range(first, stop):
            for m0 in range(0, blocked, ROWS):
                dots = _block_rows_of_four(w[n], kind, xp, sums, xsum, xd, m0)
                for i in range(ROWS):
                    out[m0 + i, n] = dots[i]
        for m in range(blocked, out.shape[0]):
            x, grouped = x_row[m], first
            if _paired(kind):
                grouped = _weight_rows(w, kind, first, stop, w_row0[m], xp[x], sums[x], xd[x], out[m])
            for n in range(grouped, stop):
                r = w_row0[m] + n
                if kind == 34:
                    out[m, n] = row_dot(w[r], xp[x], xd[x], xd[x], 34)
                elif kind == 18:
                    out[m, n] = row_dot(w[r], xp[x], sums[x], xd[x], 18)
                elif kind == IQ4_NL_KIND:
                    out[m, n] = row_dot(w[r], xp[x], sums[x], xd[x], IQ4_NL_KIND)
                elif kind == 144:
                    out[m, n] = row_dot(w[r], xp[x], xsum[x], xd[x], 144)
                elif kind == 176:
                    out[m, n] = row_dot(w[r], xp[x], xsum[x], xd[x], 176)
                elif kind == 136:
                    out[m, n] = row_dot(w[r], xp[x], xsum[x], xd[x], 136)
                else:
                    out[m, n] = row_dot(w[r], xp[x], xsum[x], xd[x], 210)


@njit(fastmath=True, cache=True, nogil=True, inline="always")
def is_offset_kind(kind):
    """Q4_1's, Q5_0's and Q5_1's blocks (llvm_ir.OFFSET_BLOCK_KINDS: offset_block_matvec)."""
    return kind == 20 or kind == 22 or kind == 24


@njit(fastmath=True, cache=True, nogil=True, inline="always")
def _offset_rows_of_four(w, kind, xq, xsum, xd, m):
    if kind == 20:
        return rows_dot(w, xd[0], xq, xsum, xd, m, 20, ROWS)
    if kind == 22:
        return rows_dot(w, xd[0], xq, xsum, xd, m, 22, ROWS)
    return rows_dot(w, xd[0], xq, xsum, xd, m, 24, ROWS)


@njit(fastmath=True, parallel=True, cache=True, nogil=True)
def offset_block_matvecs(a, b, c, kind, w_row0, xq, xd, xsum, x_row, out_a, out_b, out_c):
    """paired_block_matvecs over ggml's Q4_1 (kind 20), Q5_0 (22) or Q5_1 (24) blocks in place,
    the activations from quantize_rows (groups of 32; xsum their group sums, for the mins)."""
    blocked = out_a.shape[0] // ROWS * ROWS if _plain(w_row0, x_row) else 0
    for j in prange(_n_chunks(out_a, out_b, out_c)):
        w, out, first, stop = _chunk(j, a, b, c, out_a, out_b, out_c)
        for n in range(first, stop):
            for m0 in range(0, blocked, ROWS):
                dots = _offset_rows_of_four(w[n], kind, xq, xsum, xd, m0)
                for i in range(ROWS):
                    out[m0 + i, n] = dots[i]
            for m in range(blocked, out.shape[0]):
                r, x = w_row0[m] + n, x_row[m]
                if kind == 20:
                    out[m, n] = row_dot(w[r], xq[x], xsum[x], xd[x], 20)
                elif kind == 22:
                    out[m, n] = row_dot(w[r], xq[x], xsum[x], xd[x], 22)
                else:
                    out[m, n] = row_dot(w[r], xq[x], xsum[x], xd[x], 24)


@njit(fastmath=True, cache=True, nogil=True, inline="always")
def is_low_k_kind(kind):
    """Q2_K's and Q3_K's blocks (llvm_ir.LOW_K_KINDS: low_k_block_matvec)."""
    return kind == 84 or kind == 110


@njit(fastmath=True, parallel=True, cache=True, nogil=True)
def low_k_block_matvecs(a, b, c, kind, w_row0, xq, xd, xsum, x_row, out_a, out_b, out_c):
    """paired_block_matvecs over ggml's Q2_K (kind 84) or Q3_K (110) blocks in place, the
    activations from quantize_rows (groups of 16, float32 scales; xsum unread)."""
    blocked = out_a.shape[0] // ROWS * ROWS if _plain(w_row0, x_row) else 0
    for j in prange(_n_chunks(out_a, out_b, out_c)):
        w, out, first, stop = _chunk(j, a, b, c, out_a, out_b, out_c)
        for n in range(first, stop):
            for m0 in range(0, blocked, ROWS):
                if kind == 84:
                    dots = rows_dot(w[n], xd[0], xq, xsum, xd, m0, 84, ROWS)
                else:
                    dots = rows_dot(w[n], xd[0], xq, xsum, xd, m0, 110, ROWS)
                for i in range(ROWS):
                    out[m0 + i, n] = dots[i]
            for m in range(blocked, out.shape[0]):
                r, x = w_row0[m] + n, x_row[m]
                if kind == 84:
                    out[m, n] = row_dot(w[r], xq[x], xsum[x], xd[x], 84)
                else:
                    out[m, n] = row_dot(w[r], xq[x], xsum[x], xd[x], 110)


@njit(cache=True, nogil=True)
def offset_block_matvec(blocks, kind, w_row0, xq, xd, xsum, x_row, out):
    """offset_block_matvecs of one weight."""
    none = np.empty((out.shape[0], 0), np.float32)
    offset_block_matvecs(blocks, blocks[:0], blocks[:0], kind, w_row0, xq, xd, xsum, x_row, out, none, none)


@njit(cache=True, nogil=True)
def low_k_block_matvec(blocks, kind, w_row0, xq, xd, xsum, x_row, out):
    """low_k_block_matvecs of one weight."""
    none = np.empty((out.shape[0], 0), np.float32)
    low_k_block_matvecs(blocks, blocks[:0], blocks[:0], kind, w_row0, xq, xd, xsum, x_row, out, none, none)


@njit(fastmath=True, cache=True, nogil=True)  # the matvecs' own prange runs it on the threads
def rows_block_matvecs(a, b, c, kind, x, xq, xd, xsum, bsums, minus, w_row0, x_row, out_a, out_b, out_c):
    """Up to three products of the same float32 activation rows x [X, K] by weights of one kind
    (ggml's blocks in place; b and c with no rows, out_b and out_c no columns, where fewer):
    out_a = x a^T, ... in one parallel region, the rows rounded once as the kind's ggml vec_dot
    type into xq and xd: Q8_0 with float16 scales for Q8_0, Q4_0, IQ4_NL and the offset kinds
    (xsum f32 [X, K/32]: the mins' sums; Q4_0's and IQ4_NL's xq in pair order, minus int32
    [X, 8 * ceil(K / 64)] their sums' terms), float32 scales per 16 for Q2_K and Q3_K, Q8_K for
    the other K-quants and IQ4_XS (bsums int16 [X, K/16]). A decode step's products (q, k and v;
    gate and up: layouts/fused.group_matvecs), one call, not three a product."""
    paired = _paired(kind)
    if kind == 34 or paired or is_offset_kind(kind):
        round_rows_q8_0(x, xq, xd, xsum, paired, minus)
    elif is_low_k_kind(kind):
        quantize_rows(x, 16, xq, xd, xsum)
    else:
        round_rows_q8_k(x, xq, xd, bsums)
    if is_offset_kind(kind):
        offset_block_matvecs(a, b, c, kind, w_row0, xq, xd, xsum, x_row, out_a, out_b, out_c)
    elif is_low_k_kind(kind):
        low_k_block_matvecs(a, b, c, kind, w_row0, xq, xd, xsum, x_row, out_a, out_b, out_c)
    else:
        paired_block_matvecs(a, b, c, kind, w_row0, xq, xd, minus, bsums, x_row, out_a, out_b, out_c)


@njit(fastmath=True, parallel=True, cache=True, nogil=True)
def dequantize_offset_blocks(blocks, kind, out):
    """dequantize_blocks for ggml's Q4_1 (kind 20), Q5_0 (22) and Q5_1 (24) blocks: d u + m,
    d (u - 16)."""
    for n in prange(blocks.shape[0]):
        o = _float_row(out[n])
        if kind == 20:
            blocks_to_float(blocks[n], o, 20)
        elif kind == 22:
            blocks_to_float(blocks[n], o, 22)
        else:
            blocks_to_float(blocks[n], o, 24)
        _store_row(o, out[n])


@njit(fastmath=True, parallel=True, cache=True, nogil=True)
def dequantize_low_k_blocks(blocks, kind, out):
    """dequantize_blocks for ggml's Q2_K (kind 84) and Q3_K (110) blocks: d sc q - dmin m,
    d (sc - 32) (q - 4)."""
    for n in prange(blocks.shape[0]):
        o = _float_row(out[n])
        if kind == 84:
            blocks_to_float(blocks[n], o, 84)
        else:
            blocks_to_float(blocks[n], o, 110)
        _store_row(o, out[n])


@njit(fastmath=True, parallel=True, cache=True, nogil=True)
def dequantize_blocks(blocks, kind, out):
    """ggml's Q8_0 (kind 34), Q4_0 (18), Q4_K (144), Q5_K (176), Q6_K (210), IQ4_XS (136) or IQ4_NL
    (IQ4_NL_KIND) blocks [N, row bytes] -> out [N, K] as dequantize_rows writes it (float32 or
    bfloat16 bits): d * q, d * (nibble - 8), d sc q - dmin m, (d (ls - 32)) * kvalues_iq4nl[nibble],
    d * kvalues_iq4nl[nibble]; Q4_1's, Q5_0's and Q5_1's (20, 22, 24) through dequantize_offset_blocks,
    Q2_K's and Q3_K's (84, 110) through dequantize_low_k_blocks."""
    if is_offset_kind(kind):
        dequantize_offset_blocks(blocks, kind, out)
        return
    if is_low_k_kind(kind):
        dequantize_low_k_blocks(blocks, kind, out)
        return
    for n in prange(blocks.shape[0]):
        o = _float_row(out[n])
        if kind == 34:  # blocks_to_float's kind is a compile-time constant: one branch each
            blocks_to_float(blocks[n], o, 34)
        elif kind == 18:
            blocks_to_float(blocks[n], o, 18)
        elif kind == IQ4_NL_KIND:
            blocks_to_float(blocks[n], o, IQ4_NL_KIND)
        elif kind == 144:
            blocks_to_float(blocks[n], o, 144)
        elif kind == 176:
            blocks_to_float(blocks[n], o, 176)
        elif kind == 136:
            blocks_to_float(blocks[n], o, 136)
        else:
            blocks_to_float(blocks[n], o, 210)
        _store_row(o, out[n])


@njit(fastmath=True, parallel=True, cache=True, nogil=True)
def dequantize_rows(q, scale, bias, has_bias, out):
    """out [N, K]: float32, or uint16 holding bfloat16 bits (rounded to nearest even)."""
    n_rows, k = q.shape
    n_groups = scale.shape[1]
    g = k // n_groups
    for n in prange(n_rows):
        w = q[n]
        o = _float_row(out[n])
        for j in range(n_groups):
            d = half_to_f32(scale[n, j])
            b = bias[n, j] if has_bias else np.float32(0)
            base = uint64(j * g)
            for i in range(g):
                at = base + uint64(i)
                o[at] = np.float32(w[at]) * d + b
        _store_row(o, out[n])

# packed rows dequantize in two passes: the values to bytes by the IR unpackers (LLVM vector
# code; numba loops over bytes stayed scalar), then to float
@njit(fastmath=True, cache=True, nogil=True)
def _scaled_bytes(u, offset, scale, bias, has_bias, o):
    """o[i] = (u[i] - offset) * scale[group] + bias[group]."""
    g = u.shape[0] // scale.shape[0]
    for j in range(scale.shape[0]):
        d = half_to_f32(scale[j])
        b0 = bias[j] if has_bias else np.float32(0)
        for i in range(g):
            o[j * g + i] = (np.float32(u[j * g + i]) - offset) * d + b0


@njit(fastmath=True, parallel=True, cache=True, nogil=True)
def dequantize_nibbles(packed, scale, bias, has_bias, signed, out):
    offset = np.float32(8) if signed else np.float32(0)
    for n in prange(packed.shape[0]):
        # the nibbles as bytes first, then one int -> float pass: faster than
        # converting each nibble where it is unpacked
        u = np.empty(out.shape[1], np.uint8)
        unpack_nibbles(packed[n], u)
        o = _float_row(out[n])
        _scaled_bytes(u, offset, scale[n], bias[n] if has_bias else bias[0], has_bias, o)
        _store_row(o, out[n])


@njit(fastmath=True, parallel=True, cache=True, nogil=True)
def dequantize_six_bits(packed, scale, out):
    """Q6_K's 6-bit layout (see matvec) -> out, W = (u - 32) * scale per 16 values."""
    for n in prange(packed.shape[0]):
        u = np.empty(out.shape[1], np.uint8)
        unpack_six(packed[n], u)
        o = _float_row(out[n])
        _scaled_bytes(u, np.float32(32), scale[n], scale[n], False, o)
        _store_row(o, out[n])
