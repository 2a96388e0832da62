"""ggml's block types back to float32, rows in parallel: the requantize path's reader.

    dequantize_rows(kind, raw, grid, out)    raw uint8 [rows, row bytes] -> out float32 [rows, n]

kind is the ggml type id; grid the IQ grid type's float32 [G, 8] grid (any array for the other
types). The arithmetic is the gguf package's dequantizers' (gguf.quants), operation for operation
in float32 (no fastmath: no fused multiply-adds, no reassociation), so the values are bit-identical
to `gguf.quants.dequantize`: e.g. Q4_K's (d * sc) * q - dmin * m, Q2_K's the same with 2 bits.
Layouts are ggml's block structs (ggml-common.h).
"""
import numpy as np
from numba import njit, prange

from .llvm_ir import _half_bits_intrinsic

half_to_f32 = _half_bits_intrinsic()

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = 10, 11, 12, 13, 14
IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ4_NL, IQ3_S, IQ2_S, IQ4_XS = 16, 17, 18, 19, 20, 21, 22, 23
BF16, IQ1_M, TQ1_0, TQ2_0, MXFP4 = 30, 29, 34, 35, 39

IQ4NL_VALUES = np.array((-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113), np.float32)
MXFP4_VALUES = np.array((0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12), np.float32)
KSIGNS = np.array([i | ((bin(i).count("1") & 1) << 7) for i in range(128)], np.uint8)  # ggml's ksigns_iq2xs
IQ1_DELTA = np.float32(0.125)
_KINDS = (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, TQ1_0, TQ2_0,
          IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M)
_BLOCK_BYTES = np.zeros(64, np.int64)  # by type id
_BLOCK_BYTES[list(_KINDS)] = (18, 20, 22, 24, 34, 18, 17, 84, 110, 144, 176, 210, 136, 54, 66,
                              66, 74, 82, 98, 110, 50, 56)


@njit(cache=True, nogil=True, inline="always")
def block_bytes(kind):
    return _BLOCK_BYTES[kind]


@njit(cache=True, nogil=True, inline="always")
def _b(b, i):
    """A byte as int64: numba unifies int64 with uint64 as float64, so every integer here is int64."""
    return np.int64(b[i])


@njit(cache=True, nogil=True, inline="always")
def _half(b, o):
    return half_to_f32(np.uint16(_u16(b, o)))


@njit(cache=True, nogil=True, inline="always")
def _u16(b, o):
    return _b(b, o) | (_b(b, o + 1) << 8)


@njit(cache=True, nogil=True, inline="always")
def _u32(b, o):
    return _u16(b, o) | (_u16(b, o + 2) << 16)


@njit(cache=True, nogil=True)
def _legacy(kind, b, y):
    """Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4: blocks of 32."""
    size = block_bytes(kind)
    for ib in range(y.shape[0] // 32):
        o, x = ib * size, ib * 32
        if kind == Q8_0:
            d = _half(b, o)
            for j in range(32):
                y[x + j] = np.float32(np.int8(_b(b, o + 2 + j))) * d
        elif kind == Q4_0 or kind == IQ4_NL:
            d = _half(b, o)
            for j in range(16):
                lo, hi = _b(b, o + 2 + j) & 15, _b(b, o + 2 + j) >> 4
                if kind == Q4_0:
                    y[x + j] = d * np.float32(np.int64(lo) - 8)
                    y[x + j + 16] = d * np.float32(np.int64(hi) - 8)
                else:
                    y[x + j] = d * IQ4NL_VALUES[lo]
                    y[x + j + 16] = d * IQ4NL_VALUES[hi]
        elif kind == MXFP4:
            e = np.int64(b[o])
            bits = (np.int64(0x00200000) << e) if e < 2 else ((e - np.int64(1)) << np.int64(23))
            d = np.array([bits], np.uint32).view(np.float32)[0]
            for j in range(16):
                y[x + j] = d * MXFP4_VALUES[_b(b, o + 1 + j) & 15]
                y[x + j + 16] = d * MXFP4_VALUES[_b(b, o + 1 + j) >> 4]
        elif kind == Q4_1:
            d, m = _half(b, o), _half(b, o + 2)
            for j in range(16):
                y[x + j] = d * np.float32(_b(b, o + 4 + j) & 15) + m
                y[x + j + 16] = d * np.float32(_b(b, o + 4 + j) >> 4) + m
        else:  # Q5_0, Q5_1
            d = _half(b, o)
            m = _half(b, o + 2) if kind == Q5_1 else np.float32(0)
            q0 = o + 4 if kind == Q5_1 else o + 2
            qh = _u32(b, q0)
            for j in range(16):
                lo = (_b(b, q0 + 4 + j) & 15) | (((qh >> j) & 1) << 4)
                hi = (_b(b, q0 + 4 + j) >> 4) | (((qh >> (j + 16)) & 1) << 4)
                if kind == Q5_0:
                    y[x + j] = d * np.float32(np.int64(lo) - 16)
                    y[x + j + 16] = d * np.float32(np.int64(hi) - 16)
                else:
                    y[x + j] = d * np.float32(lo) + m
                    y[x + j + 16] = d * np.float32(hi) + m


@njit(cache=True, nogil=True, inline="always")
def _scale_min_k4(s, j):
    """Q4_K / Q5_K's 6-bit scale and min of sub-block j from the 12 scale bytes at s."""
    if j < 4:
        return _b(s, j) & 63, _b(s, j + 4) & 63
    return (_b(s, j + 4) & 15) | ((_b(s, j - 4) >> 2) & 48), (_b(s, j + 4) >> 4) | ((_b(s, j) >> 2) & 48)


@njit(cache=True, nogil=True)
def _k_quants(kind, b, y):
    """Q2_K .. Q6_K, IQ4_XS, TQ1_0, TQ2_0: super-blocks of 256."""
    size = block_bytes(kind)
    pow3 = np.array((1, 3, 9, 27, 81), np.uint8)
    for ib in range(y.shape[0] // 256):
        o, x = ib * size, ib * 256
        blk = b[o:o + size]
        if kind == Q2_K:
            d, dmin = _half(blk, 80), _half(blk, 82)
            for i in range(256):
                h, r = i // 128, i % 128
                q = (_b(blk, 16 + h * 32 + r % 32) >> (2 * (r // 32))) & 3
                sc = _b(blk, i // 16)
                y[x + i] = (d * np.float32(sc & 15)) * np.float32(q) - dmin * np.float32(sc >> 4)
        elif kind == Q3_K:
            d = _half(blk, 108)
            for i in range(256):
                h, r = i // 128, i % 128
                ql = np.int64((_b(blk, 32 + h * 32 + r % 32) >> (2 * (r // 32))) & 3)
                hbit = np.int64((_b(blk, i % 32) >> (i // 32)) & 1)
                k = i // 16
                lo = (_b(blk, 96 + k) & 15) if k < 8 else (_b(blk, 96 + k - 8) >> 4)
                hi = (_b(blk, 104 + k % 4) >> (2 * (k // 4))) & 3
                sc = np.float32(np.int64(lo | (hi << 4)) - 32)
                y[x + i] = (d * sc) * np.float32(ql - 4 * (hbit ^ 1))
        elif kind == Q4_K or kind == Q5_K:
            d, dmin = _half(blk, 0), _half(blk, 2)
            qs = 16 if kind == Q4_K else 48
            for s in range(8):
                sc, m = _scale_min_k4(blk[4:16], s)
                dl, ml = d * np.float32(sc), dmin * np.float32(m)
                for l in range(32):
                    q = np.int64((_b(blk, qs + (s // 2) * 32 + l) >> (4 * (s % 2))) & 15)
                    if kind == Q5_K:
                        q |= np.int64((_b(blk, 16 + l) >> s) & 1) << 4
                    y[x + s * 32 + l] = dl * np.float32(q) - ml
        elif kind == Q6_K:
            d = _half(blk, 208)
            for i in range(256):
                h, r = i // 128, i % 128
                ql = (_b(blk, h * 64 + r % 64) >> (4 * (r // 64))) & 15
                qh = (_b(blk, 128 + h * 32 + r % 32) >> (2 * (r // 32))) & 3
                sc = np.float32(np.int8(_b(blk, 192 + i // 16)))
                y[x + i] = (d * sc) * np.float32(np.int64(ql | (qh << 4)) - 32)
        elif kind == IQ4_XS:
            d = _half(blk, 0)
            sh = _u16(blk, 2)
            for k in range(8):
                lo = np.int64(_b(blk, 4 + k // 2) >> (4 * (k % 2))) & 15
                sc = np.int64(lo | (((sh >> (2 * k)) & 3) << 4)) - 32
                dl = d * np.float32(sc)
                for r in range(32):
                    y[x + k * 32 + r] = dl * IQ4NL_VALUES[(_b(blk, 8 + k * 16 + r % 16) >> (4 * (r // 16))) & 15]
        elif kind == TQ2_0:
            d = _half(blk, 64)
            for i in range(256):
                h, r = i // 128, i % 128
                y[x + i] = d * np.float32(np.int64((_b(blk, h * 32 + r % 32) >> (2 * (r // 32))) & 3) - 1)
        else:  # TQ1_0: base-3 digits, 5 a byte (4 in qh), read by multiplying the byte (mod 256)
            d = _half(blk, 52)
            for i in range(256):
                if i < 160:
                    byte = np.uint8(_b(blk, i % 32) * pow3[i // 32])
                elif i < 240:
                    byte = np.uint8(_b(blk, 32 + (i - 160) % 16) * pow3[(i - 160) // 16])
                else:
                    byte = np.uint8(_b(blk, 48 + (i - 240) % 4) * pow3[(i - 240) // 4])
                y[x + i] = d * np.float32(np.int64((np.int64(byte) * 3) >> 8) - 1)


@njit(cache=True, nogil=True)
def _grid_types(kind, b, grid, y):
    """The IQ grid types: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M."""
    size = block_bytes(kind)
    quarter, half = np.float32(0.25), np.float32(0.5)
    for ib in range(y.shape[0] // 256):
        o, x = ib * size, ib * 256
        blk = b[o:o + size]
        if kind == IQ2_XXS or kind == IQ3_XXS:
            d = _half(blk, 0)
            for ib32 in range(8):  # a u32 of 4x7 sign bits and the scale: after the grid bytes (IQ2_XXS's
                # interleaved with them)
                if kind == IQ2_XXS:
                    aux1 = _u32(blk, 2 + 8 * ib32 + 4)
                else:
                    aux1 = _u32(blk, 66 + 4 * ib32)
                db = d * (half + np.float32(aux1 >> 28)) * (quarter if kind == IQ2_XXS else half)
                for l in range(4):
                    signs = np.int64(KSIGNS[(aux1 >> (7 * l)) & 127])
                    for j in range(8):
                        if kind == IQ2_XXS:
                            g = grid[_b(blk, 2 + 8 * ib32 + l), j]
                        else:
                            g = grid[_b(blk, 2 + 8 * ib32 + 2 * l + j // 4), j % 4]
                        sign = np.float32(-1) if (signs >> j) & 1 else np.float32(1)
                        y[x + ib32 * 32 + l * 8 + j] = db * g * sign
        elif kind == IQ2_XS:
            d = _half(blk, 0)
            for ib32 in range(8):
                for l in range(4):
                    q = _u16(blk, 2 + 2 * (4 * ib32 + l))
                    sc = (_b(blk, 66 + ib32) >> (4 * (l // 2))) & 15
                    db = d * (half + np.float32(sc)) * quarter
                    signs = np.int64(KSIGNS[q >> 9])
                    for j in range(8):
                        sign = np.float32(-1) if (signs >> j) & 1 else np.float32(1)
                        y[x + ib32 * 32 + l * 8 + j] = db * grid[q & 511, j] * sign
        elif kind == IQ2_S:
            d = _half(blk, 0)
            for ib32 in range(8):
                for l in range(4):
                    sc = (_b(blk, 74 + ib32) >> (4 * (l // 2))) & 15
                    db = d * (half + np.float32(sc)) * quarter
                    q = np.int64(_b(blk, 2 + 4 * ib32 + l)) | ((np.int64(_b(blk, 66 + ib32)) << (8 - 2 * l)) & 0x300)
                    signs = _b(blk, 34 + 4 * ib32 + l)
                    for j in range(8):
                        sign = np.float32(-1) if (signs >> j) & 1 else np.float32(1)
                        y[x + ib32 * 32 + l * 8 + j] = db * grid[q, j] * sign
        elif kind == IQ3_S:
            d = _half(blk, 0)
            for ib32 in range(8):
                sc = (_b(blk, 106 + ib32 // 2) >> (4 * (ib32 % 2))) & 15
                db = d * np.float32(1 + 2 * np.int64(sc))
                qh = _b(blk, 66 + ib32)
                for l in range(8):  # 8 grid rows of 4 a sub-block
                    q = np.int64(_b(blk, 2 + 8 * ib32 + l)) | ((np.int64(qh) << (8 - l)) & 256)
                    signs = _b(blk, 74 + 4 * ib32 + l // 2)
                    for j in range(4):
                        bit = 4 * (l % 2) + j
                        sign = np.float32(-1) if (signs >> bit) & 1 else np.float32(1)
                        y[x + ib32 * 32 + l * 4 + j] = db * grid[q, j] * sign
        elif kind == IQ1_S:
            d = _half(blk, 0)
            for ib32 in range(8):
                qh = _u16(blk, 34 + 2 * ib32)
                dl = d * np.float32(2 * ((qh >> 12) & 7) + 1)
                delta = -IQ1_DELTA if qh & 0x8000 else IQ1_DELTA
                for l in range(4):
                    q = np.int64(_b(blk, 2 + 4 * ib32 + l)) | (((qh >> (3 * l)) & 7) << 8)
                    for j in range(8):
                        y[x + ib32 * 32 + l * 8 + j] = dl * (grid[q, j] + delta)
        else:  # IQ1_M: the float16 scale spread over the top nibbles of the four scale words
            sc = np.empty(4, np.uint32)
            for i in range(4):
                sc[i] = _u16(blk, 48 + 2 * i)
            bits = np.uint16((sc[0] >> 12) | ((sc[1] >> 8) & 0xF0) | ((sc[2] >> 4) & 0xF00) | (sc[3] & 0xF000))
            d = half_to_f32(bits)
            for ib32 in range(8):
                for h in range(2):
                    s = (sc[ib32 // 2] >> (6 * (ib32 % 2) + 3 * h)) & 7
                    dl = d * np.float32(2 * s + 1)
                    for l2 in range(2):
                        l = 2 * h + l2
                        qh = _b(blk, 32 + 2 * ib32 + l // 2) >> (4 * (l % 2))
                        q = np.int64(_b(blk, 4 * ib32 + l)) | (np.int64(qh & 7) << 8)
                        delta = -IQ1_DELTA if qh & 8 else IQ1_DELTA
                        for j in range(8):
                            y[x + ib32 * 32 + l * 8 + j] = dl * (grid[q, j] + delta)


@njit(cache=True, nogil=True, parallel=True)
def dequantize_rows(kind, raw, grid, out):
    for r in prange(raw.shape[0]):
        b, y = raw[r], out[r]
        if kind == F16:
            for i in range(y.shape[0]):
                y[i] = _half(b, 2 * i)
        elif kind == BF16:
            for i in range(y.shape[0]):
                y[i] = np.array([_u16(b, 2 * i) << 16], np.uint32).view(np.float32)[0]
        elif kind in (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4):
            _legacy(kind, b, y)
        elif kind in (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, TQ1_0, TQ2_0):
            _k_quants(kind, b, y)
        else:
            _grid_types(kind, b, grid, y)
