"""ggml's quantizers in native code, rows in parallel: what llama-quantize runs (ggml_quantize_chunk),
bit for bit, with and without an importance matrix.

    quantize_rows(kind, x, qw, use_qw, out, bad)
        x float32 [rows, n]; qw float32 [n] the importance of each column (read when use_qw);
        out uint8 [rows, row bytes] of the type `kind` (ggml's type id); bad uint8 [rows] zeros:
        a row holding NaN or inf is left unwritten and flagged there

Semantics follow ggml-quants.c's quantize_<type> (the functions ggml_quantize_chunk dispatches to):
without an importance matrix the K types and Q4_0..Q5_1 take their quantize_row_*_ref path, with
one the *_impl searches (make_qkx3_quants, make_qp_quants, make_qx_quants weighted by
qw * sqrt(sigma2 + x^2)); IQ4_NL and IQ4_XS always search (ntry 7). Every sum is accumulated in
float32 in C's order and every constant is a float32 (numba would widen a Python float or an int
times a float32 to float64), with no fast-math, so each rounding is C's; nearest_int adds
1.5 * 2^23 as ggml's does. Rows with NaN or inf (which ggml's searches assert against) are flagged, not quantized.
"""
import math

import numpy as np
from numba import njit, prange

from .halves import float_to_half_bits, round_to_half


F = np.float32
EPS = F(1e-15)  # ggml's GROUP_MAX_EPS: a group whose largest |x| is below quantizes to zero
MAGIC = F(12582912.0)  # 1.5 * 2^23
IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)

# ggml's type ids
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = 10, 11, 12, 13, 14
IQ4_NL, IQ4_XS = 20, 23


@njit(cache=True, nogil=True, inline="always")
def nearest_int(v):
    """ggml's nearest_int: round half to even through float32 addition of 1.5 * 2^23."""
    return np.int32(F(v + MAGIC) - MAGIC)


@njit(cache=True, nogil=True, inline="always")
def _put_half(out, at, v):
    h = np.int64(float_to_half_bits(v))
    out[at] = np.uint8(h & 0xFF)
    out[at + 1] = np.uint8(h >> 8)


@njit(cache=True, nogil=True, inline="always")
def _trunc_i8(v):
    """C's (int8_t) of a float: truncation toward zero, then the byte's wrap."""
    return ((np.int64(v) + 128) & 0xFF) - 128


# ------------------------------------------------------------------ scale searches (ggml-quants.c)

@njit(cache=True, nogil=True, inline="always")
def _clamped(v, lo, hi):
    """nearest_int(v) clamped to [lo, hi], kept a float32 (integers are exact there)."""
    r = F(v + MAGIC) - MAGIC
    return lo if r < lo else hi if r > hi else r


@njit(cache=True, nogil=True, inline="always")
def _signed_max_abs(x, n):
    """(the value of largest magnitude, its magnitude) over x[:n], the first of equals."""
    mx = F(0)
    amax = F(0)
    for i in range(n):
        ax = abs(x[i])
        if ax > amax:
            amax = ax
            mx = x[i]
    return mx, amax


@njit(cache=True, nogil=True)
def make_qx_quants(n, nmax, x, L, qw, use_qw, w):
    """Symmetric quants L (int8, 0..2*nmax-1) and their scale; rmse_type 1 (weights x^2 or qw).
    w: scratch of 2n floats (the weights and the weights times x)."""
    mx, amax = _signed_max_abs(x, n)
    if amax < EPS:
        for i in range(n):
            L[i] = 0
        return F(0)
    wx = w[n:2 * n]
    w = w[:n]
    for i in range(n):
        w[i] = qw[i] if use_qw else x[i] * x[i]
        wx[i] = w[i] * x[i]  # C's w*x[i]*l is (w*x[i])*l
    fnmax = F(nmax)
    lo, hi = -fnmax, fnmax - F(1)
    iscale = -fnmax / mx
    sumlx = F(0)
    suml2 = F(0)
    for i in range(n):
        fl = _clamped(iscale * x[i], lo, hi)
        L[i] = np.int32(fl) + nmax
        sumlx += wx[i] * fl
        suml2 += w[i] * fl * fl
    scale = sumlx / suml2 if suml2 != 0 else F(0)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(fnmax + F(0.1) * F(step)) / mx
        sumlx = F(0)
        suml2 = F(0)
        for i in range(n):
            fl = _clamped(iscale * x[i], lo, hi)
            sumlx += wx[i] * fl
            suml2 += w[i] * fl * fl
        if suml2 > 0 and sumlx * sumlx > best * suml2:
            for i in range(n):
                L[i] = np.int32(_clamped(iscale * x[i], lo, hi)) + nmax
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


@njit(cache=True, nogil=True)
def make_q3_quants(n, nmax, x, L):
    """Symmetric quants L (int8, 0..2*nmax-1) by coordinate descent (do_rmse), their scale."""
    mx, amax = _signed_max_abs(x, n)
    if amax < EPS:
        for i in range(n):
            L[i] = 0
        return F(0)
    iscale = -F(nmax) / mx
    sumlx = F(0)
    suml2 = F(0)
    for i in range(n):
        l = min(max(nearest_int(iscale * x[i]), -nmax), nmax - 1)
        L[i] = l
        w = x[i] * x[i]
        sumlx += w * x[i] * F(l)
        suml2 += w * F(l) * F(l)
    for _ in range(5):
        changed = 0
        for i in range(n):
            w = x[i] * x[i]
            li = F(L[i])
            slx = sumlx - w * x[i] * li
            if slx > 0:
                sl2 = suml2 - w * li * li
                new_l = min(max(nearest_int(x[i] * sl2 / slx), -nmax), nmax - 1)
                if new_l != L[i]:
                    slx += w * x[i] * F(new_l)
                    sl2 += w * F(new_l) * F(new_l)
                    if sl2 > 0 and slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l
                        sumlx = slx
                        suml2 = sl2
                        changed += 1
        if changed == 0:
            break
    for i in range(n):
        L[i] += nmax
    return sumlx / suml2 if suml2 > 0 else F(0)


@njit(cache=True, nogil=True)
def make_qkx_quants(n, nmax, x, weights, L, Laux, rmin, rdelta, nstep, use_mad):
    """Asymmetric quants L (uint8, 0..nmax): (scale, the_min) minimising the weighted error;
    make_qkx2_quants, and make_qkx3_quants with its weights given (the two differ only there)."""
    mn = x[0]
    mx = x[0]
    sum_w = weights[0]
    sum_x = sum_w * x[0]
    for i in range(1, n):
        if x[i] < mn:
            mn = x[i]
        if x[i] > mx:
            mx = x[i]
        w = weights[i]
        sum_w += w
        sum_x += w * x[i]
    if mn > 0:
        mn = F(0)
    if mx == mn:
        for i in range(n):
            L[i] = 0
        return F(0), -mn
    fnmax = F(nmax)
    iscale = fnmax / (mx - mn)
    scale = F(1) / iscale
    best_error = F(0)
    top = F(nmax)
    for i in range(n):
        fl = _clamped(iscale * (x[i] - mn), F(0), top)
        L[i] = np.int32(fl)
        diff = scale * fl + mn - x[i]
        diff = abs(diff) if use_mad else diff * diff
        best_error += weights[i] * diff
    for step in range(nstep + 1):
        iscale = (rmin + rdelta * F(step) + fnmax) / (mx - mn)
        sum_l = F(0)
        sum_l2 = F(0)
        sum_xl = F(0)
        for i in range(n):
            fl = _clamped(iscale * (x[i] - mn), F(0), top)
            Laux[i] = np.int32(fl)
            w = weights[i]
            sum_l += w * fl
            sum_l2 += w * fl * fl
            sum_xl += w * fl * x[i]
        D = sum_w * sum_l2 - sum_l * sum_l
        if D > 0:
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            if this_min > 0:
                this_min = F(0)
                this_scale = sum_xl / sum_l2
            cur_error = F(0)
            for i in range(n):
                diff = this_scale * F(Laux[i]) + this_min - x[i]
                diff = abs(diff) if use_mad else diff * diff
                cur_error += weights[i] * diff
            if cur_error < best_error:
                for i in range(n):
                    L[i] = Laux[i]
                best_error = cur_error
                scale = this_scale
                mn = this_min
    return scale, -mn


@njit(cache=True, nogil=True)
def make_qp_quants(n, nmax, x, L, qw):
    """Non-negative quants L (uint8, 0..nmax) of non-negative x (sub-block scales), weighted by qw."""
    mx = F(0)
    for i in range(n):
        mx = mx if mx > x[i] else x[i]
    if mx < EPS:
        for i in range(n):
            L[i] = 0
        return F(0)
    fnmax = F(nmax)
    iscale = fnmax / mx
    for i in range(n):
        L[i] = nearest_int(iscale * x[i]) & 0xFF
    scale = F(1) / iscale
    best_mse = F(0)
    for i in range(n):
        diff = x[i] - scale * F(L[i])
        best_mse += qw[i] * diff * diff
    for step in range(-4, 5):
        if step == 0:
            continue
        iscale_is = (F(0.1) * F(step) + fnmax) / mx
        scale_is = F(1) / iscale_is
        mse = F(0)
        for i in range(n):
            l = min(nmax, nearest_int(iscale_is * x[i]))
            diff = x[i] - scale_is * F(l)
            mse += qw[i] * diff * diff
        if mse < best_mse:
            best_mse = mse
            iscale = iscale_is
    sumlx = F(0)
    suml2 = F(0)
    for i in range(n):
        l = min(nmax, nearest_int(iscale * x[i]))
        L[i] = l & 0xFF
        w = qw[i]
        sumlx += w * x[i] * F(l)
        suml2 += w * F(l) * F(l)
    for _ in range(5):
        changed = 0
        for i in range(n):
            w = qw[i]
            li = F(L[i])
            slx = sumlx - w * x[i] * li
            sl2 = suml2 - w * li * li
            if slx > 0 and sl2 > 0:
                new_l = min(nmax, nearest_int(x[i] * sl2 / slx))
                if new_l != np.int32(L[i]):
                    slx += w * x[i] * F(new_l)
                    sl2 += w * F(new_l) * F(new_l)
                    if slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l & 0xFF
                        sumlx = slx
                        suml2 = sl2
                        changed += 1
        if changed == 0:
            break
    return sumlx / suml2 if suml2 > 0 else F(0)


@njit(cache=True, nogil=True, inline="always")
def _sum_sq(x):
    """sum(x^2), in order."""
    s = F(0)
    for j in range(x.shape[0]):
        s += x[j] * x[j]
    return s


@njit(cache=True, nogil=True, inline="always")
def _row_sigma2(x):
    """sum(x^2) / n over the row (the legacy types' imatrix weighting)."""
    return _sum_sq(x) / F(x.shape[0])


@njit(cache=True, nogil=True, inline="always")
def _imatrix_weights(x, qw, sigma2, weight):
    """weight = qw * sqrt(sigma2 + x^2); returns their sum, in order."""
    s = F(0)
    for j in range(x.shape[0]):
        weight[j] = qw[j] * F(math.sqrt(sigma2 + x[j] * x[j]))
        s += weight[j]
    return s


# ------------------------------------------------------------------ 32-value blocks

@njit(cache=True, nogil=True)
def q8_0_row(x, out):
    for b in range(x.shape[0] // 32):
        xb = x[32 * b:32 * b + 32]
        o = 34 * b
        amax = F(0)
        for j in range(32):
            a = abs(xb[j])
            amax = amax if amax > a else a
        d = amax / F(127)
        inv = F(1) / d if d != 0 else F(0)
        _put_half(out, o, d)
        for j in range(32):
            v = np.float64(xb[j] * inv)  # roundf: half away from zero (exact in float64)
            r = math.floor(abs(v) + 0.5)
            out[o + 2 + j] = np.uint8(np.int64(-r if v < 0 else r) & 0xFF)


@njit(cache=True, nogil=True, inline="always")
def _signed_max(xb):
    amax = F(0)
    mx = F(0)
    for j in range(xb.shape[0]):
        a = abs(xb[j])
        if amax < a:
            amax = a
            mx = xb[j]
    return mx


@njit(cache=True, nogil=True, inline="always")
def _min_max(xb):
    mn = F(3.4028234663852886e38)  # C's FLT_MAX
    mx = -mn
    for j in range(xb.shape[0]):
        if xb[j] < mn:
            mn = xb[j]
        if xb[j] > mx:
            mx = xb[j]
    return mn, mx


@njit(cache=True, nogil=True, inline="always")
def _put_qh(out, at, L, nib):
    """The fifth bits of 32 quants L (0..31) as a little-endian uint32 at `at`, then their
    nibbles (value j low, j + 16 high) at `nib`."""
    qh = 0
    for j in range(16):
        a, b = np.int64(L[j]), np.int64(L[j + 16])
        out[nib + j] = np.uint8((a & 0xF) | ((b & 0xF) << 4))
        qh |= ((a >> 4) & 1) << j
        qh |= ((b >> 4) & 1) << (j + 16)
    for k in range(4):
        out[at + k] = np.uint8((qh >> (8 * k)) & 0xFF)


@njit(cache=True, nogil=True)
def _q4_0_like(x, qw, use_qw, out, nmax, size):
    """Q4_0 (nmax 8) and Q5_0 (nmax 16): d, then the quants (Q5_0: their fifth bits first)."""
    L = np.empty(32, np.int32)
    weight = np.empty(32, np.float32)
    Ls = np.empty(32, np.int8)
    wbuf = np.empty(64, np.float32)
    sigma2 = _row_sigma2(x) if use_qw else F(0)
    top = 2 * nmax - 1
    for b in range(x.shape[0] // 32):
        xb = x[32 * b:32 * b + 32]
        o = size * b
        if use_qw:
            _imatrix_weights(xb, qw[32 * b:32 * b + 32], sigma2, weight)
            d = make_qx_quants(32, nmax, xb, Ls, weight, True, wbuf)
            for j in range(32):
                L[j] = Ls[j]
        else:
            d = _signed_max(xb) / F(-nmax)
            inv = F(1) / d if d != 0 else F(0)
            for j in range(32):  # C: MIN(top, (int8_t)(x*id + nmax + 0.5f)) stored in a uint8_t
                L[j] = min(top, _trunc_i8(xb[j] * inv + (F(nmax) + F(0.5)))) & 0xFF
        _put_half(out, o, d)
        if nmax == 8:
            for j in range(16):
                out[o + 2 + j] = np.uint8((L[j] & 0xFF) | ((L[j + 16] << 4) & 0xFF))
        else:
            _put_qh(out, o + 2, L, o + 6)


@njit(cache=True, nogil=True)
def _q4_1_like(x, qw, use_qw, out, nmax, size):
    """Q4_1 (nmax 15) and Q5_1 (nmax 31): d, m = min, then the quants."""
    L = np.empty(32, np.int32)
    Lu = np.empty(32, np.uint8)
    Laux = np.empty(32, np.uint8)
    weight = np.empty(32, np.float32)
    sigma2 = _row_sigma2(x) if use_qw else F(0)
    for b in range(x.shape[0] // 32):
        xb = x[32 * b:32 * b + 32]
        o = size * b
        if use_qw:
            _imatrix_weights(xb, qw[32 * b:32 * b + 32], sigma2, weight)
            d, the_min = make_qkx_quants(32, nmax, xb, weight, Lu, Laux, F(-0.9), F(0.05), 36, False)
            m = -the_min
            for j in range(32):
                L[j] = Lu[j]
        else:
            m, mx = _min_max(xb)
            d = (mx - m) / F(nmax)
            inv = F(1) / d if d != 0 else F(0)
            for j in range(32):
                v = (xb[j] - m) * inv + F(0.5)
                L[j] = min(15, _trunc_i8(v)) if nmax == 15 else np.int64(v) & 0xFF
        _put_half(out, o, d)
        _put_half(out, o + 2, m)
        if nmax == 15:
            for j in range(16):
                out[o + 4 + j] = np.uint8((L[j] & 0xFF) | ((L[j + 16] << 4) & 0xFF))
        else:
            _put_qh(out, o + 4, L, o + 8)


# ------------------------------------------------------------------ K super-blocks of 256

@njit(cache=True, nogil=True, inline="always")
def _pack_2bit(out, at, L):
    """256 quants of 0..3: byte 32k + l holds values 128k' + l, +32, +64, +96 (2 bits each)."""
    for j in range(0, 256, 128):
        for l in range(32):
            out[at + j // 4 + l] = np.uint8((L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4)
                                             | (L[j + l + 96] << 6)) & 0xFF)


@njit(cache=True, nogil=True)
def q2_k_row(x, qw, use_qw, out):
    L = np.empty(256, np.uint8)
    Laux = np.empty(16, np.uint8)
    weight = np.empty(16, np.float32)
    scales = np.empty(16, np.float32)
    mins = np.empty(16, np.float32)
    sw = np.empty(16, np.float32)
    Ls = np.empty(16, np.uint8)
    Lm = np.empty(16, np.uint8)
    sc = np.empty(16, np.int64)
    for b in range(x.shape[0] // 256):
        xb = x[256 * b:256 * b + 256]
        o = 84 * b
        if use_qw:
            sumx2 = _sum_sq(xb)
            sigma2 = sumx2 / F(256)
            for j in range(16):
                xs = xb[16 * j:16 * j + 16]
                sw[j] = _imatrix_weights(xs, qw[256 * b + 16 * j:256 * b + 16 * j + 16], sigma2, weight)
                scales[j], mins[j] = make_qkx_quants(16, 3, xs, weight, L[16 * j:16 * j + 16], Laux,
                                                     F(-0.9), F(0.05), 36, False)
            dm = make_qp_quants(16, 15, scales, Ls, sw)
            mm = make_qp_quants(16, 15, mins, Lm, sw)
            for j in range(16):
                sc[j] = (np.int64(Ls[j]) | (np.int64(Lm[j]) << 4)) & 0xFF
        else:
            max_scale = F(0)
            max_min = F(0)
            for j in range(16):
                xs = xb[16 * j:16 * j + 16]
                for l in range(16):
                    weight[l] = abs(xs[l])
                scales[j], mins[j] = make_qkx_quants(16, 3, xs, weight, L[16 * j:16 * j + 16], Laux,
                                                     F(-0.5), F(0.1), 15, True)
                if scales[j] > max_scale:
                    max_scale = scales[j]
                if mins[j] > max_min:
                    max_min = mins[j]
            dm = F(0)
            mm = F(0)
            for j in range(16):
                sc[j] = 0
            if max_scale > 0:
                iscale = F(15) / max_scale
                for j in range(16):
                    sc[j] = nearest_int(iscale * scales[j]) & 0xFF
                dm = max_scale / F(15)
            if max_min > 0:
                iscale = F(15) / max_min
                for j in range(16):
                    sc[j] = (sc[j] | (np.int64(nearest_int(iscale * mins[j])) << 4)) & 0xFF
                mm = max_min / F(15)
        _put_half(out, o + 80, dm)
        _put_half(out, o + 82, mm)
        dm = round_to_half(dm)
        mm = round_to_half(mm)
        for j in range(16):
            out[o + j] = np.uint8(sc[j])
            d = dm * F(sc[j] & 0xF)
            if d == 0:
                continue
            m = mm * F(sc[j] >> 4)
            for ii in range(16):
                L[16 * j + ii] = min(max(nearest_int((xb[16 * j + ii] + m) / d), 0), 3)
        _pack_2bit(out, o + 16, L)


@njit(cache=True, nogil=True)
def q3_k_row(x, qw, use_qw, out):
    L = np.empty(256, np.int8)
    weight = np.empty(16, np.float32)
    scales = np.empty(16, np.float32)
    sw = np.empty(16, np.float32)
    Ls = np.empty(16, np.int8)
    wbuf = np.empty(32, np.float32)
    lsc = np.zeros(16, np.int64)  # the 6-bit scales as stored, 0..63
    Lu = np.empty(256, np.int64)
    for b in range(x.shape[0] // 256):
        xb = x[256 * b:256 * b + 256]
        o = 110 * b
        if use_qw:
            sumx2 = _sum_sq(xb)
            sigma2 = F(2) * sumx2 / F(256)
            for j in range(16):
                xs = xb[16 * j:16 * j + 16]
                sw[j] = _imatrix_weights(xs, qw[256 * b + 16 * j:256 * b + 16 * j + 16], sigma2, weight)
                scales[j] = make_qx_quants(16, 4, xs, L[16 * j:16 * j + 16], weight, True, wbuf)
            d_block = make_qx_quants(16, 32, scales, Ls, sw, True, wbuf)
            for j in range(16):
                lsc[j] = Ls[j]
        else:
            max_scale = F(0)
            amax = F(0)
            for j in range(16):
                scales[j] = make_q3_quants(16, 4, xb[16 * j:16 * j + 16], L[16 * j:16 * j + 16])
                a = abs(scales[j])
                if a > amax:
                    amax = a
                    max_scale = scales[j]
            d_block = F(0)
            for j in range(16):
                lsc[j] = 0
            if max_scale != 0:
                iscale = F(-32) / max_scale
                for j in range(16):
                    l = ((np.int64(nearest_int(iscale * scales[j])) + 128) & 0xFF) - 128  # int8_t
                    lsc[j] = min(max(l, -32), 31) + 32
                d_block = F(1) / iscale
        # scales: low nibbles of 0-7 then 8-15 in bytes 0-7, the top bit pairs in bytes 8-11
        for k in range(12):
            out[o + 96 + k] = 0
        for j in range(16):
            l = lsc[j]
            if j < 8:
                out[o + 96 + j] = np.uint8(l & 0xF)
            else:
                out[o + 96 + j - 8] |= np.uint8((l & 0xF) << 4)
            out[o + 96 + 8 + j % 4] |= np.uint8(((l >> 4) << (2 * (j // 4))) & 0xFF)
        _put_half(out, o + 108, d_block)
        dd = round_to_half(d_block)
        for j in range(256):
            Lu[j] = L[j]
        for j in range(16):
            s = np.int64(out[o + 96 + j]) & 0xF if j < 8 else np.int64(out[o + 96 + j - 8]) >> 4
            s = (s | (((np.int64(out[o + 104 + j % 4]) >> (2 * (j // 4))) & 3) << 4)) - 32
            d = dd * F(s)
            if d == 0:
                continue
            for ii in range(16):
                Lu[16 * j + ii] = min(max(nearest_int(xb[16 * j + ii] / d), -4), 3) + 4
        for k in range(32):
            out[o + k] = 0
        for j in range(256):
            if Lu[j] > 3:
                out[o + j % 32] |= np.uint8(1 << (j // 32))
                Lu[j] -= 4
        _pack_2bit(out, o + 32, Lu)


@njit(cache=True, nogil=True, inline="always")
def _pack_scale_min(out, at, ls, lm):
    """8 6-bit scales and mins (uint8 values as C stores them) into Q4_K/Q5_K's 12 bytes."""
    for j in range(8):
        a, m = np.int64(ls[j]) & 0xFF, np.int64(lm[j]) & 0xFF
        if j < 4:
            out[at + j] = np.uint8(a)
            out[at + j + 4] = np.uint8(m)
        else:
            out[at + j + 4] = np.uint8(((a & 0xF) | ((m & 0xF) << 4)) & 0xFF)
            out[at + j - 4] |= np.uint8(((a >> 4) << 6) & 0xFF)
            out[at + j] |= np.uint8(((m >> 4) << 6) & 0xFF)


@njit(cache=True, nogil=True, inline="always")
def _scale_min_at(out, at, j):
    """ggml's get_scale_min_k4 over the packed bytes."""
    if j < 4:
        return np.int64(out[at + j]) & 63, np.int64(out[at + j + 4]) & 63
    return ((np.int64(out[at + j + 4]) & 0xF) | ((np.int64(out[at + j - 4]) >> 6) << 4),
            (np.int64(out[at + j + 4]) >> 4) | ((np.int64(out[at + j]) >> 6) << 4))


@njit(cache=True, nogil=True)
def _q45_k_row(x, qw, use_qw, out, nmax, size):
    """Q4_K (nmax 15) and Q5_K (nmax 31): d, dmin, 12 scale bytes, then the quants."""
    L = np.empty(256, np.uint8)
    Laux = np.empty(32, np.uint8)
    weight = np.empty(32, np.float32)
    scales = np.empty(8, np.float32)
    mins = np.empty(8, np.float32)
    sw = np.empty(8, np.float32)
    Ls = np.empty(8, np.uint8)
    Lm = np.empty(8, np.uint8)
    for b in range(x.shape[0] // 256):
        xb = x[256 * b:256 * b + 256]
        o = size * b
        if use_qw:
            sum_x2 = _sum_sq(xb)
            sigma2 = F(2) * sum_x2 / F(256)
            for j in range(8):
                xs = xb[32 * j:32 * j + 32]
                sw[j] = _imatrix_weights(xs, qw[256 * b + 32 * j:256 * b + 32 * j + 32], sigma2, weight)
                scales[j], mins[j] = make_qkx_quants(32, nmax, xs, weight, L[32 * j:32 * j + 32], Laux,
                                                     F(-0.9), F(0.05), 36, False)
            d_block = make_qp_quants(8, 63, scales, Ls, sw)
            m_block = make_qp_quants(8, 63, mins, Lm, sw)
            if nmax == 31:
                for j in range(8):
                    Ls[j] = min(63, Ls[j])
                    Lm[j] = min(63, Lm[j])
        else:
            max_scale = F(0)
            max_min = F(0)
            for j in range(8):
                xs = xb[32 * j:32 * j + 32]
                sum_x2 = F(0)
                for l in range(32):
                    sum_x2 += xs[l] * xs[l]
                av_x = F(math.sqrt(sum_x2 / F(32)))
                for l in range(32):
                    weight[l] = av_x + abs(xs[l])
                if nmax == 15:
                    scales[j], mins[j] = make_qkx_quants(32, 15, xs, weight, L[32 * j:32 * j + 32], Laux,
                                                         F(-1.0), F(0.1), 20, False)
                else:
                    scales[j], mins[j] = make_qkx_quants(32, 31, xs, weight, L[32 * j:32 * j + 32], Laux,
                                                         F(-0.5), F(0.1), 15, False)
                if scales[j] > max_scale:
                    max_scale = scales[j]
                if mins[j] > max_min:
                    max_min = mins[j]
            inv_scale = F(63) / max_scale if max_scale > 0 else F(0)
            inv_min = F(63) / max_min if max_min > 0 else F(0)
            for j in range(8):
                Ls[j] = min(63, nearest_int(inv_scale * scales[j]) & 0xFF)
                Lm[j] = min(63, nearest_int(inv_min * mins[j]) & 0xFF)
            d_block = max_scale / F(63)
            m_block = max_min / F(63)
        _pack_scale_min(out, o + 4, Ls, Lm)
        _put_half(out, o, d_block)
        _put_half(out, o + 2, m_block)
        dd = round_to_half(d_block)
        dmin = round_to_half(m_block)
        for j in range(8):
            s, m = _scale_min_at(out, o + 4, j)
            d = dd * F(s)
            if d == 0:
                continue
            dm = dmin * F(m)
            for ii in range(32):
                L[32 * j + ii] = min(max(nearest_int((xb[32 * j + ii] + dm) / d), 0), nmax)
        if nmax == 15:
            for j in range(0, 256, 64):
                for l in range(32):
                    out[o + 16 + j // 2 + l] = np.uint8(L[j + l] | (L[j + l + 32] << 4))
        else:
            qh, ql = o + 16, o + 48
            for k in range(32):
                out[qh + k] = 0
            for n in range(0, 256, 64):
                m1 = 1 << (n // 32)
                for j in range(32):
                    l1 = np.int64(L[n + j])
                    if l1 > 15:
                        l1 -= 16
                        out[qh + j] |= np.uint8(m1)
                    l2 = np.int64(L[n + j + 32])
                    if l2 > 15:
                        l2 -= 16
                        out[qh + j] |= np.uint8(m1 << 1)
                    out[ql + n // 2 + j] = np.uint8(l1 | (l2 << 4))


@njit(cache=True, nogil=True)
def q6_k_row(x, qw, use_qw, out):
    L = np.empty(256, np.int8)
    scales = np.empty(16, np.float32)
    wbuf = np.empty(32, np.float32)
    for b in range(x.shape[0] // 256):
        xb = x[256 * b:256 * b + 256]
        o = 210 * b
        max_scale = F(0)
        max_abs = F(0)
        for j in range(16):
            scale = make_qx_quants(16, 32, xb[16 * j:16 * j + 16], L[16 * j:16 * j + 16],
                                   qw[256 * b + 16 * j:256 * b + 16 * j + 16], use_qw, wbuf)
            scales[j] = scale
            if abs(scale) > max_abs:
                max_abs = abs(scale)
                max_scale = scale
        if max_abs < EPS:
            for k in range(210):
                out[o + k] = 0
            continue
        iscale = F(-128) / max_scale
        _put_half(out, o + 208, F(1) / iscale)
        dd = round_to_half(F(1) / iscale)
        for j in range(16):
            s = ((np.int64(min(127, nearest_int(iscale * scales[j]))) + 128) & 0xFF) - 128  # int8_t
            out[o + 192 + j] = np.uint8(s & 0xFF)
            d = dd * F(s)
            if d == 0:
                continue
            for ii in range(16):
                L[16 * j + ii] = min(max(nearest_int(xb[16 * j + ii] / d), -32), 31) + 32
        for j in range(0, 256, 128):
            ql, qh = o + j // 2, o + 128 + j // 4
            for l in range(32):
                a, b2 = np.int64(L[j + l]), np.int64(L[j + l + 32])
                c, e = np.int64(L[j + l + 64]), np.int64(L[j + l + 96])
                out[ql + l] = np.uint8((a & 0xF) | ((c & 0xF) << 4))
                out[ql + l + 32] = np.uint8((b2 & 0xF) | ((e & 0xF) << 4))
                out[qh + l] = np.uint8(((a >> 4) | ((b2 >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6)) & 0xFF)


# ------------------------------------------------------------------ IQ4_NL / IQ4_XS

@njit(cache=True, nogil=True, inline="always")
def best_index_iq4(v):
    """ggml's best_index_int8 over kvalues_iq4nl: the nearest value's index (ties up)."""
    if v <= F(IQ4NL[0]):
        return 0
    if v >= F(IQ4NL[15]):
        return 15
    ml, mu = 0, 15
    while mu - ml > 1:
        mav = (ml + mu) // 2
        if v < F(IQ4NL[mav]):
            mu = mav
        else:
            ml = mav
    return mu - 1 if v - F(IQ4NL[mu - 1]) < F(IQ4NL[mu]) - v else mu


@njit(cache=True, nogil=True)
def _iq4_sub_block(xb, weight, Lb, ntry):
    """One block of 32: its scale (0 for a block of zeros, Lb then untouched), quants in Lb."""
    amax = F(0)
    mx = F(0)
    for j in range(32):
        a = abs(xb[j])
        if a > amax:
            amax = a
            mx = xb[j]
    if amax < EPS:
        return F(0)
    v0 = F(IQ4NL[0])
    d = -mx / v0 if ntry > 0 else mx / v0
    inv = F(1) / d
    sumqx = F(0)
    sumq2 = F(0)
    for j in range(32):
        l = best_index_iq4(inv * xb[j])
        Lb[j] = l
        q = F(IQ4NL[l])
        w = weight[j]
        sumqx += w * q * xb[j]
        sumq2 += w * q * q
    d = sumqx / sumq2 if sumq2 > 0 else F(0)
    best = d * sumqx
    for itry in range(-ntry, ntry + 1):
        inv = F(itry + np.int64(IQ4NL[0])) / mx
        sumqx = F(0)
        sumq2 = F(0)
        for j in range(32):
            q = F(IQ4NL[best_index_iq4(inv * xb[j])])
            w = weight[j]
            sumqx += w * q * xb[j]
            sumq2 += w * q * q
        if sumq2 > 0 and sumqx * sumqx > best * sumq2:
            d = sumqx / sumq2
            best = d * sumqx
    return d


@njit(cache=True, nogil=True, inline="always")
def _iq4_weights(xb, qw, at, use_qw, sigma2, weight):
    if use_qw:
        _imatrix_weights(xb, qw[at:at + 32], sigma2, weight)
    else:
        for j in range(32):
            weight[j] = xb[j] * xb[j]


@njit(cache=True, nogil=True)
def iq4_nl_row(x, qw, use_qw, out):
    L = np.zeros(32, np.int64)
    weight = np.empty(32, np.float32)
    for b in range(x.shape[0] // 32):
        xb = x[32 * b:32 * b + 32]
        o = 18 * b
        sigma2 = F(0)
        for j in range(32):
            sigma2 += xb[j] * xb[j]
        sigma2 *= F(2) / F(32)
        _iq4_weights(xb, qw, 32 * b, use_qw, sigma2, weight)
        d = _iq4_sub_block(xb, weight, L, 7)
        _put_half(out, o, d)
        inv = F(1) / d if d != 0 else F(0)
        for j in range(32):
            L[j] = best_index_iq4(inv * xb[j])
        for j in range(16):
            out[o + 2 + j] = np.uint8(L[j] | (L[j + 16] << 4))


@njit(cache=True, nogil=True)
def iq4_xs_row(x, qw, use_qw, out):
    L = np.zeros(256, np.int64)
    weight = np.empty(32, np.float32)
    scales = np.empty(8, np.float32)
    for b in range(x.shape[0] // 256):
        xb = x[256 * b:256 * b + 256]
        o = 136 * b
        sigma2 = F(0)
        for j in range(256):
            sigma2 += xb[j] * xb[j]
        sigma2 *= F(2) / F(256)
        max_scale = F(0)
        amax_scale = F(0)
        for ib in range(8):
            xs = xb[32 * ib:32 * ib + 32]
            _iq4_weights(xs, qw, 256 * b + 32 * ib, use_qw, sigma2, weight)
            d = _iq4_sub_block(xs, weight, L[32 * ib:32 * ib + 32], 7)
            scales[ib] = d
            if abs(d) > amax_scale:
                amax_scale = abs(d)
                max_scale = d
        d = -max_scale / F(32)
        _put_half(out, o, d)
        inv = F(1) / d if d != 0 else F(0)
        scales_h = 0
        for k in range(4):
            out[o + 4 + k] = 0
        for ib in range(8):
            l = min(max(nearest_int(inv * scales[ib]), -32), 31)
            dl = d * F(l)
            idl = F(1) / dl if dl != 0 else F(0)
            for j in range(32):
                L[32 * ib + j] = best_index_iq4(idl * xb[32 * ib + j])
            l += 32
            if ib % 2 == 0:
                out[o + 4 + ib // 2] = np.uint8(l & 0xF)
            else:
                out[o + 4 + ib // 2] |= np.uint8((l & 0xF) << 4)
            scales_h |= (np.int64(l) >> 4) << (2 * ib)
        out[o + 2] = np.uint8(scales_h & 0xFF)
        out[o + 3] = np.uint8((scales_h >> 8) & 0xFF)
        for i in range(8):
            for j in range(16):
                out[o + 8 + 16 * i + j] = np.uint8(L[32 * i + j] | (L[32 * i + 16 + j] << 4))


# ------------------------------------------------------------------ the entry point

@njit(cache=True, nogil=True)
def _quantize_row(kind, x, qw, use_qw, out):
    if kind == Q8_0:
        q8_0_row(x, out)
    elif kind == Q4_0:
        _q4_0_like(x, qw, use_qw, out, 8, 18)
    elif kind == Q4_1:
        _q4_1_like(x, qw, use_qw, out, 15, 20)
    elif kind == Q5_0:
        _q4_0_like(x, qw, use_qw, out, 16, 22)
    elif kind == Q5_1:
        _q4_1_like(x, qw, use_qw, out, 31, 24)
    elif kind == Q2_K:
        q2_k_row(x, qw, use_qw, out)
    elif kind == Q3_K:
        q3_k_row(x, qw, use_qw, out)
    elif kind == Q4_K:
        _q45_k_row(x, qw, use_qw, out, 15, 144)
    elif kind == Q5_K:
        _q45_k_row(x, qw, use_qw, out, 31, 176)
    elif kind == Q6_K:
        q6_k_row(x, qw, use_qw, out)
    elif kind == IQ4_NL:
        iq4_nl_row(x, qw, use_qw, out)
    elif kind == IQ4_XS:
        iq4_xs_row(x, qw, use_qw, out)


@njit(cache=True, nogil=True, inline="always")
def _finite(x):
    for j in range(x.shape[0]):
        if not np.isfinite(x[j]):
            return False
    return True


@njit(parallel=True, cache=True, nogil=True)
def quantize_rows(kind, x, qw, use_qw, out, bad):
    for r in prange(x.shape[0]):
        if _finite(x[r]):
            _quantize_row(kind, x[r], qw, use_qw, out[r])
        else:
            bad[r] = 1
