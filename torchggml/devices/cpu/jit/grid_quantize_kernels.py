"""ggml's IQ grid quantizers in native code, rows in parallel: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
IQ3_S, IQ1_S, IQ1_M, bit for bit as ggml-quants.c's quantize_<type> (what ggml_quantize_chunk runs).

    build_grid_tables(grid, shift, kmap_size, nwant) -> (kmap, neighbours)
        the search tables iq2xs_init_impl / iq3xs_init_impl build from a grid
    quantize_grid_rows(kind, x, qw, use_qw, grid, kmap, neighbours, out, bad)

A grid point is D levels l (0..2 for the 8-wide IQ2 grids, 0..7 for the 4-wide IQ3 ones), held
as their positions 2l+1 (int8 [G, D]); a point's key packs its levels `shift` bits apart. kmap[key]
is the grid index of a point on the grid, else -(o+1) where neighbours[o] counts the grid points
that follow it: the ones at the nwant smallest squared distances, by distance then index.
Each group of D quantized values is snapped to the grid (its own point, else the best of these
neighbours under the weights). Every float operation is a float32 one in C's order (see
quantize_kernels.py's notes).
"""
import math

import numpy as np
from numba import njit, prange

from .halves import float_to_half_bits
from .quantize_kernels import EPS, F, _finite, _put_half, make_qp_quants, nearest_int

IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ3_S, IQ2_S, IQ1_M = 16, 17, 18, 19, 21, 22, 29
FLT_MAX = F(3.4028234663852886e38)
EPS_IQ3_XXS = F(1e-8)  # ggml's GROUP_MAX_EPS_IQ3_XXS and GROUP_MAX_EPS_IQ2_S


# ------------------------------------------------------------------ the tables

@njit(cache=True, nogil=True)
def _distances(i, grid, shift, d2):
    """Squared distances from the point of key i to every grid point."""
    mask = (1 << shift) - 1
    for j in range(grid.shape[0]):
        s = 0
        for k in range(grid.shape[1]):
            diff = np.int64(grid[j, k]) - (2 * ((i >> (shift * k)) & mask) + 1)
            s += diff * diff
        d2[j] = s


@njit(cache=True, nogil=True)
def _threshold(d2, nwant):
    """The nwant-th smallest distinct distance (the largest, where fewer are distinct)."""
    thr = -1
    for _ in range(nwant):
        nxt = np.int64(1) << 40
        for v in d2:
            if thr < v < nxt:
                nxt = v
        if nxt == np.int64(1) << 40:
            break
        thr = nxt
    return thr


@njit(parallel=True, cache=True, nogil=True)
def build_grid_tables(grid, shift, kmap_size, nwant):
    kmap = np.full(kmap_size, -1, np.int32)
    for g in range(grid.shape[0]):
        u = 0
        for k in range(grid.shape[1]):
            u |= ((np.int64(grid[g, k]) - 1) // 2) << (shift * k)
        kmap[u] = g
    count = np.zeros(kmap_size, np.int64)
    for i in prange(kmap_size):
        if kmap[i] < 0:
            d2 = np.empty(grid.shape[0], np.int64)
            _distances(i, grid, shift, d2)
            thr = _threshold(d2, nwant)
            count[i] = 1 + np.sum(d2 <= thr)
    offset = np.cumsum(count) - count
    neighbours = np.empty(np.sum(count), np.int32)
    for i in prange(kmap_size):
        if kmap[i] < 0:
            d2 = np.empty(grid.shape[0], np.int64)
            _distances(i, grid, shift, d2)
            thr = _threshold(d2, nwant)
            o = offset[i]
            neighbours[o] = count[i] - 1
            at = o + 1
            prev = -1
            while prev < thr:  # each distinct distance up to thr, its points by index
                v = np.int64(1) << 40
                for d in d2:
                    if prev < d < v:
                        v = d
                for j in range(grid.shape[0]):
                    if d2[j] == v:
                        neighbours[at] = j
                        at += 1
                prev = v
    for i in range(kmap_size):
        if kmap[i] < 0:
            kmap[i] = -(offset[i] + 1)
    return kmap, neighbours


# ------------------------------------------------------------------ the search, shared

@njit(cache=True, nogil=True, inline="always")
def _best_neighbour(neighbours, at, grid, xval, o, waux, scale, L):
    """The neighbour nearest scale * point to xval[o:o+D] under waux; its levels into L[o:]."""
    best = FLT_MAX
    gi = -1
    for j in range(1, neighbours[at] + 1):
        g = neighbours[at + j]
        d2 = F(0)
        for i in range(grid.shape[1]):
            diff = scale * F(grid[g, i]) - xval[o + i]
            d2 += waux[o + i] * diff * diff
        if d2 < best:
            best = d2
            gi = g
    for i in range(grid.shape[1]):
        L[o + i] = (grid[gi, i] - 1) // 2
    return gi


@njit(cache=True, nogil=True, inline="always")
def _levels(xval, o, D, shift, inv, kmaxq, L):
    """Levels of xval[o:o+D] at scale 1/inv into L[o:], their key."""
    u = 0
    for i in range(D):
        l = min(max(nearest_int(F(0.5) * (inv * xval[o + i] - F(1))), 0), kmaxq - 1)
        L[o + i] = l
        u |= l << (shift * i)
    return u


@njit(cache=True, nogil=True, inline="always")
def _key(L, o, D, shift):
    u = 0
    for i in range(D):
        u |= np.int64(L[o + i]) << (shift * i)
    return u


@njit(cache=True, nogil=True, inline="always")
def _snap(xval, o, shift, inv, scale, kmaxq, L, grid, kmap, neighbours, waux):
    """Levels of a group at scale 1/inv snapped to the grid (L[o:]); whether already on it."""
    u = _levels(xval, o, grid.shape[1], shift, inv, kmaxq, L)
    if kmap[u] >= 0:
        return True
    _best_neighbour(neighbours, -kmap[u] - 1, grid, xval, o, waux, scale, L)
    return False


@njit(cache=True, nogil=True, inline="always")
def _fit(weight, xval, L):
    """sum w x q and sum w q^2 for q = 2l+1."""
    sumqx = F(0)
    sumq2 = F(0)
    for i in range(xval.shape[0]):
        w = weight[i]
        q = F(2 * L[i] + 1)
        sumqx += w * xval[i] * q
        sumq2 += w * q * q
    return sumqx, sumq2


@njit(cache=True, nogil=True)
def _search(xval, weight, waux, L, Laux, on, on_aux, grid, kmap, neighbours, shift, kmaxq, nis, step, mx,
            on_init, redo_all):
    """The scale search of IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S over a group: 2*nis+1 scales around
    mx / (2 kmaxq - 1), then the groups off the grid (all of them where redo_all) again at the best."""
    D = grid.shape[1]
    ng = xval.shape[0] // D
    L[:] = 0
    best = F(0)
    scale = mx / F(2 * kmaxq - 1)
    on[:] = on_init
    for s in range(-nis, nis + 1):
        inv = (F(2 * kmaxq - 1) + F(s) * step) / mx
        this_scale = F(1) / inv
        for k in range(ng):
            on_aux[k] = _snap(xval, k * D, shift, inv, this_scale, kmaxq, Laux, grid, kmap, neighbours, waux)
        sumqx, sumq2 = _fit(weight, xval, Laux)
        if sumq2 > 0 and sumqx * sumqx > best * sumq2:
            scale = sumqx / sumq2
            best = scale * sumqx
            L[:] = Laux
            on[:] = on_aux
    if not on.all() and scale > 0:
        inv = F(1) / scale
        for k in range(ng):
            if redo_all or not on[k]:
                _snap(xval, k * D, shift, inv, scale, kmaxq, L, grid, kmap, neighbours, waux)
        sumqx, sumq2 = _fit(weight, xval, L)
        if sumq2 > 0:
            scale = sumqx / sumq2
    return scale


@njit(cache=True, nogil=True, inline="always")
def _sigma2(xbl, factor):
    s = F(0)
    for i in range(xbl.shape[0]):
        s += xbl[i] * xbl[i]
    return factor * s / F(xbl.shape[0])


@njit(cache=True, nogil=True, inline="always")
def _weights(xb, qw, at, use_qw, sigma2, plain_bias, weight, waux):
    """qw * sqrt(sigma2 + x^2) with an importance matrix, else plain_bias * sigma2 + x^2 (x^2 where
    plain_bias is 0); waux their square roots."""
    for i in range(xb.shape[0]):
        if use_qw:
            weight[i] = qw[at + i] * F(math.sqrt(sigma2 + xb[i] * xb[i]))
        elif plain_bias != 0:
            weight[i] = plain_bias * sigma2 + xb[i] * xb[i]
        else:
            weight[i] = xb[i] * xb[i]
        waux[i] = F(math.sqrt(weight[i]))


@njit(cache=True, nogil=True, inline="always")
def _signs(xb, o, weight, xval, even):
    """|x| of 8 values into xval and their sign bits; where `even`, an odd count of negatives
    flips the value of least weight * x^2 (stored with its sign bit toggled) and 7 bits are kept."""
    nflip = 0
    s = 0
    for i in range(8):
        if xb[o + i] >= 0:
            xval[o + i] = xb[o + i]
        else:
            xval[o + i] = -xb[o + i]
            nflip += 1
            s |= 1 << i
    if even and nflip % 2:
        imin = 0
        mn = weight[o] * xb[o] * xb[o]
        for i in range(1, 8):
            ax = weight[o + i] * xb[o + i] * xb[o + i]
            if ax < mn:
                mn = ax
                imin = i
        xval[o + imin] = -xval[o + imin]
        s ^= 1 << imin
    return s & 127 if even else s


@njit(cache=True, nogil=True, inline="always")
def _group_max(xval):
    m = xval[0]
    for i in range(1, xval.shape[0]):
        m = m if m > xval[i] else xval[i]
    return m


@njit(cache=True, nogil=True, inline="always")
def _scale_nibble(inv, scale):
    return min(max(nearest_int(F(0.5) * (inv * scale - F(1))), 0), 15)


# ------------------------------------------------------------------ the types

@njit(cache=True, nogil=True)
def iq2_xxs_row(x, qw, out, grid, kmap, neighbours):
    """66 bytes a block: d, then per group of 32 four grid indices and a uint32 of 4x7 sign bits
    and the 4-bit scale."""
    weight = np.empty(32, F)
    waux = np.empty(32, F)
    xval = np.empty(32, F)
    L = np.zeros(32, np.int32)
    Laux = np.zeros(32, np.int32)
    scales = np.zeros(8, F)
    signs = np.zeros(4, np.int64)
    for b in range(x.shape[0] // 256):
        xbl = x[256 * b:256 * b + 256]
        o = 66 * b
        out[o:o + 66] = 0
        sigma2 = _sigma2(xbl, F(1))
        max_scale = F(0)
        for ib in range(8):
            xb = xbl[32 * ib:32 * ib + 32]
            _weights(xb, qw, 256 * b + 32 * ib, True, sigma2, F(0), weight, waux)
            for k in range(4):
                signs[k] = _signs(xb, 8 * k, weight, xval, True)
            scales[ib] = 0
            if _group_max(xval) < EPS:
                continue
            scale = make_qp_quants(32, 4, xval, L, weight)
            eff_max = scale * F(3)
            if eff_max <= 0:
                continue
            best = F(0)
            for s in range(-6, 7):
                inv = (F(5) + F(s) * F(0.1)) / eff_max
                this_scale = F(1) / inv
                for k in range(4):
                    _snap(xval, 8 * k, 2, inv, this_scale, 3, Laux, grid, kmap, neighbours, waux)
                sumqx, sumq2 = _fit(weight, xval, Laux)
                if sumq2 > 0 and sumqx * sumqx > best * sumq2:
                    scale = sumqx / sumq2
                    best = scale * sumqx
                    L[:] = Laux
            if scale > 0:
                inv = F(1) / scale
                for k in range(4):
                    _snap(xval, 8 * k, 2, inv, scale, 3, L, grid, kmap, neighbours, waux)
                sumqx, sumq2 = _fit(weight, xval, L)
                if sumq2 > 0:
                    scale = sumqx / sumq2
            if scale < 0:
                scale = -scale
                for k in range(4):
                    signs[k] = ~signs[k] & 127
            q = o + 2 + 8 * ib
            for k in range(4):
                out[q + k] = np.uint8(kmap[_key(L, 8 * k, 8, 2)])
            _put_u32(out, q + 4, signs[0] | (signs[1] << 7) | (signs[2] << 14) | (signs[3] << 21))
            scales[ib] = scale
            max_scale = max_scale if max_scale > scale else scale
        if max_scale == 0:
            out[o + 2:o + 66] = 0
            continue
        d = max_scale / F(31)
        _put_half(out, o, d)
        inv = F(1) / d
        for ib in range(8):
            out[o + 2 + 8 * ib + 7] |= np.uint8(_scale_nibble(inv, scales[ib]) << 4)


@njit(cache=True, nogil=True, inline="always")
def _put_u32(out, at, v):
    for i in range(4):
        out[at + i] = np.uint8((v >> (8 * i)) & 0xFF)


@njit(cache=True, nogil=True)
def iq2_xs_s_row(x, qw, use_qw, out, grid, kmap, neighbours, is_s):
    """IQ2_XS (74 bytes: d, 32 uint16 of a 9-bit grid index and 7 sign bits, 8 bytes of 4-bit
    scales; needs an importance matrix) and IQ2_S (82 bytes: d, 32 low index bytes, 32 sign
    bytes, 8 bytes of 2-bit high index parts, 8 bytes of scales): groups of 16, two of 8 values."""
    size = 82 if is_s else 74
    weight = np.empty(16, F)
    waux = np.empty(16, F)
    xval = np.empty(16, F)
    L = np.zeros(16, np.int32)
    Laux = np.zeros(16, np.int32)
    on = np.zeros(2, np.bool_)
    on_aux = np.zeros(2, np.bool_)
    scales = np.zeros(16, F)
    signs = np.zeros(2, np.int64)
    for b in range(x.shape[0] // 256):
        xbl = x[256 * b:256 * b + 256]
        o = size * b
        out[o:o + size] = 0
        sigma2 = _sigma2(xbl, F(2) if is_s else F(1))
        max_scale = F(0)
        for ib in range(16):
            xb = xbl[16 * ib:16 * ib + 16]
            _weights(xb, qw, 256 * b + 16 * ib, use_qw, sigma2, F(0.25), weight, waux)
            for k in range(2):
                signs[k] = _signs(xb, 8 * k, weight, xval, not is_s)
            scales[ib] = 0
            if _group_max(xval) < (EPS_IQ3_XXS if is_s else EPS):
                continue
            scale = _search(xval, weight, waux, L, Laux, on, on_aux, grid, kmap, neighbours, 2, 3, 9, F(0.1),
                            _group_max(xval), True, False)
            if scale < 0:
                scale = -scale
                for k in range(2):
                    signs[k] = ~signs[k] & (0xFF if is_s else 127)
            for k in range(2):
                gi = np.int64(kmap[_key(L, 8 * k, 8, 2)])
                i8 = 2 * ib + k
                if is_s:
                    out[o + 2 + i8] = np.uint8(gi & 255)
                    out[o + 66 + i8 // 4] |= np.uint8((gi >> 8) << (2 * (i8 % 4)))
                    out[o + 34 + i8] = np.uint8(signs[k])
                else:
                    v = gi | (signs[k] << 9)
                    out[o + 2 + 2 * i8] = np.uint8(v & 0xFF)
                    out[o + 3 + 2 * i8] = np.uint8(v >> 8)
            scales[ib] = scale
            max_scale = max_scale if max_scale > scale else scale
        if max_scale == 0:
            if not is_s:
                out[o + 2:o + 66] = 0
            continue
        d = max_scale / F(31)
        _put_half(out, o, d * F(0.9875) if is_s else d)
        inv = F(1) / d
        at = o + (74 if is_s else 66)
        for ib in range(16):
            out[at + ib // 2] |= np.uint8(_scale_nibble(inv, scales[ib]) << (4 * (ib % 2)))


@njit(cache=True, nogil=True)
def iq3_row(x, qw, use_qw, out, grid, kmap, neighbours, is_s):
    """IQ3_XXS (98 bytes: d, 64 grid indices, 8 uint32 of 4x7 sign bits and a 4-bit scale) and
    IQ3_S (110 bytes: d, 64 low index bytes, 8 bytes of high index bits, 32 sign bytes, 4 bytes
    of scales): groups of 32, eight of 4 values."""
    size = 110 if is_s else 98
    weight = np.empty(32, F)
    waux = np.empty(32, F)
    xval = np.empty(32, F)
    L = np.zeros(32, np.int32)
    Laux = np.zeros(32, np.int32)
    on = np.zeros(8, np.bool_)
    on_aux = np.zeros(8, np.bool_)
    scales = np.zeros(8, F)
    signs = np.zeros(4, np.int64)
    for b in range(x.shape[0] // 256):
        xbl = x[256 * b:256 * b + 256]
        o = size * b
        out[o:o + size] = 0
        sigma2 = _sigma2(xbl, F(2))
        max_scale = F(0)
        packed = 0  # IQ3_S's groups written: ggml's index and sign pointers skip a group of zeros
        for ib in range(8):
            xb = xbl[32 * ib:32 * ib + 32]
            _weights(xb, qw, 256 * b + 32 * ib, use_qw, sigma2, F(0), weight, waux)
            for k in range(4):
                signs[k] = _signs(xb, 8 * k, weight, xval, not is_s)
            scales[ib] = 0
            mx = _group_max(xval)
            if (is_s and mx == 0) or (not is_s and mx < EPS_IQ3_XXS):
                continue
            scale = _search(xval, weight, waux, L, Laux, on, on_aux, grid, kmap, neighbours, 3, 8,
                            9 if is_s else 15, F(0.2), mx, not is_s, is_s)
            if scale < 0:
                scale = -scale
                for k in range(4):
                    signs[k] = ~signs[k] & (0xFF if is_s else 127)
            for k in range(8):
                gi = np.int64(kmap[_key(L, 4 * k, 4, 3)])
                out[o + 2 + 8 * (packed if is_s else ib) + k] = np.uint8(gi & 255)
                if is_s:
                    out[o + 66 + ib] |= np.uint8((gi >> 8) << k)
            if is_s:
                for k in range(4):
                    out[o + 74 + 4 * packed + k] = np.uint8(signs[k])
                packed += 1
            else:
                _put_u32(out, o + 66 + 4 * ib, signs[0] | (signs[1] << 7) | (signs[2] << 14) | (signs[3] << 21))
            scales[ib] = scale
            max_scale = max_scale if max_scale > scale else scale
        if max_scale == 0:
            if not is_s:
                out[o + 2:o + 98] = 0
            continue
        d = max_scale / F(31)
        _put_half(out, o, d * (F(1.033) if is_s else F(1.0125)))
        inv = F(1) / d
        for ib in range(8):
            l = np.uint8(_scale_nibble(inv, scales[ib]))
            if is_s:
                out[o + 106 + ib // 2] |= l << (4 * (ib % 2))
            else:
                out[o + 66 + 4 * ib + 3] |= l << 4


# ------------------------------------------------------------------ IQ1_S / IQ1_M

@njit(cache=True, nogil=True, inline="always")
def _iq1_values(minus):
    """The three values of a level, shifted by -delta (minus) or +delta."""
    if minus:
        return np.array([-1.125, -0.125, 0.875], F)
    return np.array([-0.875, 0.125, 1.125], F)


@njit(cache=True, nogil=True, inline="always")
def _iq1_neighbour(neighbours, at, grid, xb, o, weight, scale, xx, L):
    """The neighbour whose values xx[l] at `scale` are nearest xb[o:o+8] under the weights."""
    best = FLT_MAX
    gi = -1
    for j in range(1, neighbours[at] + 1):
        g = neighbours[at + j]
        d2 = F(0)
        for i in range(8):
            diff = scale * xx[(grid[g, i] - 1) // 2] - xb[o + i]
            d2 += weight[o + i] * diff * diff
        if d2 < best:
            best = d2
            gi = g
    for i in range(8):
        L[o + i] = (grid[gi, i] - 1) // 2
    return gi


@njit(cache=True, nogil=True, inline="always")
def _abs_max(xb):
    m = abs(xb[0])
    for i in range(1, xb.shape[0]):
        m = m if m > abs(xb[i]) else abs(xb[i])
    return m


@njit(cache=True, nogil=True, inline="always")
def _levels_of_split(order, i1, i2, L):
    """Levels 0 / 1 / 2 of the values below i1, between, from i2 on (in sorted order)."""
    for j in range(order.shape[0]):
        L[order[j]] = 0 if j < i1 else 1 if j < i2 else 2


@njit(cache=True, nogil=True)
def iq1_s_row(x, qw, out, grid, kmap, neighbours):
    """50 bytes a block: d, 32 low index bytes, 8 uint16 of 4x3 high index bits, a 3-bit scale
    and the delta's sign; groups of 32, split exhaustively into three levels (sorted values)."""
    xp, xm = _iq1_values(False), _iq1_values(True)
    weight = np.empty(32, F)
    sumx = np.zeros(33, F)
    sumw = np.zeros(33, F)
    L = np.zeros(32, np.int32)
    index = np.zeros(4, np.int64)
    scales = np.zeros(8, F)
    shifts = np.zeros(8, np.int64)
    for b in range(x.shape[0] // 256):
        xbl = x[256 * b:256 * b + 256]
        o = 50 * b
        out[o:o + 50] = 0
        sigma2 = _sigma2(xbl, F(2))
        max_scale = F(0)
        for ib in range(8):
            xb = xbl[32 * ib:32 * ib + 32]
            for i in range(32):
                weight[i] = qw[256 * b + 32 * ib + i] * F(math.sqrt(sigma2 + xb[i] * xb[i]))
            mx = _abs_max(xb)
            scales[ib] = 0
            shifts[ib] = 1
            if mx < F(1e-12):
                continue
            order = np.argsort(xb, kind="mergesort")  # glibc's qsort: a stable merge sort
            for j in range(32):
                i = order[j]
                sumx[j + 1] = sumx[j] + weight[i] * xb[i]
                sumw[j + 1] = sumw[j] + weight[i]
            best = -FLT_MAX
            scale = mx
            b1, b2, shift = -1, -1, 0
            for i1 in range(33):
                for i2 in range(i1, 33):
                    for sgn in (1, -1):
                        xx = xp if sgn == 1 else xm
                        sumqx = (sumx[i1] - sumx[0]) * xx[0] + (sumx[i2] - sumx[i1]) * xx[1] + (sumx[32] - sumx[i2]) * xx[2]
                        sumq2 = ((sumw[i1] - sumw[0]) * xx[0] * xx[0] + (sumw[i2] - sumw[i1]) * xx[1] * xx[1]
                                 + (sumw[32] - sumw[i2]) * xx[2] * xx[2])
                        if sumq2 > 0 and sumqx * sumqx > best * sumq2:
                            scale = sumqx / sumq2
                            best = scale * sumqx
                            b1, b2, shift = i1, i2, sgn
            if b1 < 0 or b2 < 0 or shift == 0:
                continue
            _levels_of_split(order, b1, b2, L)
            if scale < 0:
                for j in range(32):
                    L[j] = 2 - L[j]
                scale = -scale
                shift = -shift
            xx = xp if shift == 1 else xm
            on = True
            for k in range(4):
                gi = np.int64(kmap[_key(L, 8 * k, 8, 2)])
                if gi < 0:
                    on = False
                    gi = _iq1_neighbour(neighbours, -gi - 1, grid, xb, 8 * k, weight, scale, xx, L)
                index[k] = gi
            if not on:
                sumqx = F(0)
                sumq2 = F(0)
                for k in range(4):
                    for j in range(8):
                        w = weight[8 * k + j]
                        q = xx[(grid[index[k], j] - 1) // 2]
                        sumqx += w * q * xb[8 * k + j]
                        sumq2 += w * q * q
                if sumqx > 0 and sumq2 > 0:
                    scale = sumqx / sumq2
            h = 0
            for k in range(4):
                out[o + 2 + 4 * ib + k] = np.uint8(index[k] & 255)
                h |= (index[k] >> 8) << (3 * k)
            out[o + 34 + 2 * ib] = np.uint8(h & 0xFF)
            out[o + 35 + 2 * ib] = np.uint8(h >> 8)
            scales[ib] = scale
            shifts[ib] = shift
            max_scale = max_scale if max_scale > scale else scale
        if max_scale == 0:
            continue
        d = max_scale / F(15)
        _put_half(out, o, d * F(1.125))
        inv = F(1) / d
        for ib in range(8):
            l = min(max(nearest_int(F(0.5) * (inv * scales[ib] - F(1))), 0), 7)
            if shifts[ib] == -1:
                l |= 8
            out[o + 35 + 2 * ib] |= np.uint8(l << 4)


@njit(cache=True, nogil=True, inline="always")
def _iq1m_values(bk, k, xp, xm):
    """The values of group k (0, 1) of a block of 16 whose shift pair is bk (+,+ / +,- / -,+ / -,-)."""
    if k == 0:
        return xp if bk < 2 else xm
    return xp if bk % 2 == 0 else xm


@njit(cache=True, nogil=True)
def iq1_m_row(x, qw, use_qw, out, grid, kmap, neighbours):
    """56 bytes a block: 32 low index bytes, 16 bytes of two 3-bit high index parts and delta
    signs, 4 uint16 of 3-bit scales carrying the float16 d's nibbles on top; groups of 16."""
    xp, xm = _iq1_values(False), _iq1_values(True)
    weight = np.empty(16, F)
    waux = np.empty(16, F)
    px = np.zeros((2, 17), F)
    pw = np.zeros((2, 17), F)
    L = np.zeros(16, np.int32)
    index = np.zeros(2, np.int64)
    scales = np.zeros(16, F)
    shifts = np.zeros(16, np.int64)
    sc = np.zeros(4, np.int64)
    masks = (0x00, 0x80, 0x08, 0x88)
    cp1, cp2 = xp[0] * xp[0] - xp[1] * xp[1], xp[1] * xp[1] - xp[2] * xp[2]
    cm1, cm2 = xm[0] * xm[0] - xm[1] * xm[1], xm[1] * xm[1] - xm[2] * xm[2]
    p2, m2 = xp[2], xm[2]
    qxp = np.zeros(2, F)
    qxm = np.zeros(2, F)
    q2p = np.zeros(2, F)
    q2m = np.zeros(2, F)
    sumqx = np.zeros(4, F)
    sumq2 = np.zeros(4, F)
    for b in range(x.shape[0] // 256):
        xbl = x[256 * b:256 * b + 256]
        o = 56 * b
        out[o:o + 56] = 0
        sigma2 = _sigma2(xbl, F(2))
        max_scale = F(0)
        for ib in range(16):
            xb = xbl[16 * ib:16 * ib + 16]
            _weights(xb, qw, 256 * b + 16 * ib, use_qw, sigma2, F(0), weight, waux)
            mx = _abs_max(xb)
            scales[ib] = 0
            shifts[ib] = 0
            if mx < F(1e-7):
                continue
            order = np.argsort(xb, kind="mergesort")
            for j in range(16):
                i = order[j]
                h = 0 if i < 8 else 1
                px[h, j + 1] = px[h, j] + weight[i] * xb[i]
                px[1 - h, j + 1] = px[1 - h, j]
                pw[h, j + 1] = pw[h, j] + weight[i]
                pw[1 - h, j + 1] = pw[1 - h, j]
            best = -FLT_MAX
            scale = mx
            b1, b2, bk = -1, -1, -1
            for i1 in range(17):
                for i2 in range(i1, 17):
                    for h in range(2):
                        sx = px[h, i1] + px[h, i2]
                        qxp[h] = px[h, 16] * p2 - sx
                        qxm[h] = px[h, 16] * m2 - sx
                        q2p[h] = pw[h, 16] * p2 * p2 + pw[h, i1] * cp1 + pw[h, i2] * cp2
                        q2m[h] = pw[h, 16] * m2 * m2 + pw[h, i1] * cm1 + pw[h, i2] * cm2
                    sumqx[0], sumqx[1], sumqx[2], sumqx[3] = qxp[0] + qxp[1], qxp[0] + qxm[1], qxm[0] + qxp[1], qxm[0] + qxm[1]
                    sumq2[0], sumq2[1], sumq2[2], sumq2[3] = q2p[0] + q2p[1], q2p[0] + q2m[1], q2m[0] + q2p[1], q2m[0] + q2m[1]
                    for k in range(4):
                        if sumq2[k] > 0 and sumqx[k] * sumqx[k] > best * sumq2[k]:
                            scale = sumqx[k] / sumq2[k]
                            best = scale * sumqx[k]
                            b1, b2, bk = i1, i2, k
            if b1 < 0 or b2 < 0 or bk < 0:
                continue
            _levels_of_split(order, b1, b2, L)
            if scale < 0:
                for j in range(16):
                    L[j] = 2 - L[j]
                scale = -scale
                bk = 3 - bk
            on = True
            for k in range(2):
                gi = np.int64(kmap[_key(L, 8 * k, 8, 2)])
                if gi < 0:
                    on = False
                    gi = _iq1_neighbour(neighbours, -gi - 1, grid, xb, 8 * k, weight, scale,
                                        _iq1m_values(bk, k, xp, xm), L)
                index[k] = gi
            if not on:
                sqx = F(0)
                sq2 = F(0)
                for k in range(2):
                    xx = _iq1m_values(bk, k, xp, xm)
                    for j in range(8):
                        w = weight[8 * k + j]
                        q = xx[(grid[index[k], j] - 1) // 2]
                        sqx += w * q * xb[8 * k + j]
                        sq2 += w * q * q
                if sqx > 0 and sq2 > 0:
                    scale = sqx / sq2
            out[o + 2 * ib] = np.uint8(index[0] & 255)
            out[o + 2 * ib + 1] = np.uint8(index[1] & 255)
            out[o + 32 + ib] = np.uint8((index[0] >> 8) | ((index[1] >> 8) << 4))
            scales[ib] = scale
            shifts[ib] = bk
            max_scale = max_scale if max_scale > scale else scale
        if max_scale == 0:
            continue
        d = max_scale / F(15)
        inv = F(1) / d
        sqx = F(0)
        sq2 = F(0)
        sc[:] = 0
        for ib in range(16):
            l = min(max(nearest_int(F(0.5) * (inv * scales[ib] - F(1))), 0), 7)
            sc[ib // 4] |= l << (3 * (ib % 4))
            out[o + 32 + ib] |= np.uint8(masks[shifts[ib]])
            xb = xbl[16 * ib:16 * ib + 16]
            _weights(xb, qw, 256 * b + 16 * ib, use_qw, sigma2, F(0), weight, waux)
            qh = np.int64(out[o + 32 + ib])
            for k in range(2):
                xx = _iq1m_values(shifts[ib], k, xp, xm)
                gi = np.int64(out[o + 2 * ib + k]) + ((qh << (8 - 4 * k)) & 0x700)
                for j in range(8):
                    w = weight[8 * k + j]
                    q = xx[(grid[gi, j] - 1) // 2] * F(2 * l + 1)
                    sqx += w * q * xb[8 * k + j]
                    sq2 += w * q * q
        if sq2 > 0:
            d = sqx / sq2
        s = np.int64(float_to_half_bits(d * F(1.1125)))
        sc[0] |= (s & 0x000F) << 12
        sc[1] |= (s & 0x00F0) << 8
        sc[2] |= (s & 0x0F00) << 4
        sc[3] |= s & 0xF000
        for i in range(4):
            out[o + 48 + 2 * i] = np.uint8(sc[i] & 0xFF)
            out[o + 49 + 2 * i] = np.uint8((sc[i] >> 8) & 0xFF)


# ------------------------------------------------------------------ the entry points

@njit(cache=True, nogil=True)
def _grid_row(kind, x, qw, use_qw, grid, kmap, neighbours, out):
    if kind == IQ2_XXS:
        iq2_xxs_row(x, qw, out, grid, kmap, neighbours)
    elif kind == IQ2_XS:
        iq2_xs_s_row(x, qw, use_qw, out, grid, kmap, neighbours, False)
    elif kind == IQ2_S:
        iq2_xs_s_row(x, qw, use_qw, out, grid, kmap, neighbours, True)
    elif kind == IQ3_XXS:
        iq3_row(x, qw, use_qw, out, grid, kmap, neighbours, False)
    elif kind == IQ3_S:
        iq3_row(x, qw, use_qw, out, grid, kmap, neighbours, True)
    elif kind == IQ1_S:
        iq1_s_row(x, qw, out, grid, kmap, neighbours)
    elif kind == IQ1_M:
        iq1_m_row(x, qw, use_qw, out, grid, kmap, neighbours)


@njit(parallel=True, cache=True, nogil=True)
def quantize_grid_rows(kind, x, qw, use_qw, grid, kmap, neighbours, out, bad):
    for r in prange(x.shape[0]):
        if _finite(x[r]):
            _grid_row(kind, x[r], qw, use_qw, grid, kmap, neighbours, out[r])
        else:
            bad[r] = 1
