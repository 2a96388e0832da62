"""ggml blocks -> the fused (q, scale, bias) layouts at load, in native code, rows in parallel
(the MoE experts of these types: their 2-D weights are multiplied on their blocks in place,
fused.IN_PLACE_KINDS). A model's load was this conversion (the torch version in layouts/decompose.py took
~11 CPU s for a 1.1B Q8_0 model: per-field copies, reshapes and float conversions of whole
chunks; here each block is read once and its outputs written once).

    repack_q8_0(blocks, q, scale)               q [N, K] (int8, passed as uint8), scale f32 [N, K/32]
    repack_q4_0(blocks, q, scale)               q uint8 [N, K/2] nibbles, scale uint16 (f16 bits)
    repack_q4_k(blocks, q, scale, bias)         q uint8 [N, K/2], scale and bias f32 [N, K/32]
    repack_q6_k(blocks, q, scale)               q uint8 [N, 3K/4] (6-bit), scale f32 [N, K/16]
    repack_q4_1(blocks, q, scale, bias)         q uint8 [N, K/2], scale and bias f32 [N, K/32]
    repack_q5(blocks, q, scale, bias, has_min)  Q5_0 / Q5_1: q int8 [N, K], scale (and bias) f32 [N, K/32]

blocks: uint8 [N, row bytes] (ggml's blocks of each row); the outputs are the layouts of
layouts/fused.py, bit for bit those of its torch path (decompose + _as_nibbles / _as_six_bits;
tests/test_cpu_quant.py compares them): 4-bit values two to a byte, byte i of a 32-value group
holding values i (low nibble) and i + 16 (high); Q6_K's 6-bit values u = q + 32 as 16 bytes of
low nibbles and 8 bytes of high bit pairs (byte b: values b, b + 8, b + 16, b + 24) per 32.
"""
import numpy as np
from numba import njit, prange

from .llvm_ir import _half_bits_intrinsic

half_to_f32 = _half_bits_intrinsic()


@njit(cache=True, nogil=True, inline="always")
def _half_at(b, at):
    """The float16 at byte `at` of b (little-endian) as float32."""
    return half_to_f32(np.uint16(np.int64(b[at]) | (np.int64(b[at + 1]) << 8)))


@njit(parallel=True, cache=True, nogil=True)
def repack_q8_0(blocks, q, scale):
    for n in prange(blocks.shape[0]):
        b, qr, sr = blocks[n], q[n], scale[n]
        for j in range(sr.shape[0]):
            at = j * 34
            sr[j] = _half_at(b, at)
            for i in range(32):
                qr[j * 32 + i] = b[at + 2 + i]


@njit(parallel=True, cache=True, nogil=True)
def repack_q4_0(blocks, q, scale):
    for n in prange(blocks.shape[0]):
        b, qr, sr = blocks[n], q[n], scale[n]
        for j in range(sr.shape[0]):
            at = j * 18
            sr[j] = np.int64(b[at]) | (np.int64(b[at + 1]) << 8)
            for i in range(16):  # ggml's nibble order is the layout's: the bytes as they are
                qr[j * 16 + i] = b[at + 2 + i]


@njit(parallel=True, cache=True, nogil=True)
def repack_q4_k(blocks, q, scale, bias):
    for n in prange(blocks.shape[0]):
        b, qr, sr, br = blocks[n], q[n], scale[n], bias[n]
        for blk in range(sr.shape[0] // 8):
            at = blk * 144
            d, dmin = _half_at(b, at), _half_at(b, at + 2)
            sc = b[at + 4: at + 16]
            for g in range(8):  # the 6-bit scale and min of sub-block g (ggml's k_scale_min)
                if g < 4:
                    s, m = sc[g] & 63, sc[g + 4] & 63
                else:
                    s = (sc[g + 4] & 15) | ((sc[g - 4] >> 6) << 4)
                    m = (sc[g + 4] >> 4) | ((sc[g] >> 6) << 4)
                sr[blk * 8 + g] = d * np.float32(s)
                br[blk * 8 + g] = -(dmin * np.float32(m))
            # qs: 32 bytes per pair of sub-blocks, the first's values in the low nibbles
            for pair in range(4):
                src = at + 16 + pair * 32
                for half in range(2):
                    shift = 4 * half
                    out = (blk * 8 + pair * 2 + half) * 16
                    for i in range(16):
                        lo = (b[src + i] >> shift) & 15
                        hi = (b[src + i + 16] >> shift) & 15
                        qr[out + i] = lo | (hi << 4)


@njit(parallel=True, cache=True, nogil=True)
def repack_q6_k(blocks, q, scale):
    for n in prange(blocks.shape[0]):
        b, qr, sr = blocks[n], q[n], scale[n]
        u = np.empty(256, np.uint8)  # one block's 6-bit values
        for blk in range(sr.shape[0] // 16):
            at = blk * 210
            d = _half_at(b, at + 208)
            for g in range(16):
                sr[blk * 16 + g] = d * np.float32(np.int8(b[at + 192 + g]))
            for h in range(2):  # ggml's Q6_K: value h*128 + l from ql, qh by l's position
                for l in range(128):
                    low = (b[at + h * 64 + (l % 64)] >> (4 * (l // 64))) & 15
                    high = (b[at + 128 + h * 32 + (l % 32)] >> (2 * (l // 32))) & 3
                    u[h * 128 + l] = low | (high << 4)
            for grp in range(8):  # the layout: 24 bytes per 32 values
                v, out = grp * 32, (blk * 8 + grp) * 24
                for i in range(16):
                    qr[out + i] = (u[v + i] & 15) | ((u[v + i + 16] & 15) << 4)
                for i in range(8):
                    qr[out + 16 + i] = ((u[v + i] >> 4) | ((u[v + i + 8] >> 4) << 2)
                                        | ((u[v + i + 16] >> 4) << 4) | ((u[v + i + 24] >> 4) << 6))


@njit(parallel=True, cache=True, nogil=True)
def repack_q4_1(blocks, q, scale, bias):
    for n in prange(blocks.shape[0]):
        b, qr, sr, br = blocks[n], q[n], scale[n], bias[n]
        for j in range(sr.shape[0]):
            at = j * 20
            sr[j], br[j] = _half_at(b, at), _half_at(b, at + 2)
            for i in range(16):  # ggml's nibble order is the layout's: the bytes as they are
                qr[j * 16 + i] = b[at + 4 + i]


@njit(parallel=True, cache=True, nogil=True)
def repack_q5(blocks, q, scale, bias, has_min):
    """Q5_0 (has_min False: q = u - 16) or Q5_1 (True: q = u, bias m), u the 4 low bits of qs
    and the fifth from qh (bit i: value i)."""
    size = 24 if has_min else 22
    for n in prange(blocks.shape[0]):
        b, qr, sr = blocks[n], q[n], scale[n]
        for j in range(sr.shape[0]):
            at = j * size
            sr[j] = _half_at(b, at)
            if has_min:
                bias[n, j] = _half_at(b, at + 2)
            h = at + size - 20
            qh = np.uint32(b[h]) | (np.uint32(b[h + 1]) << 8) | (np.uint32(b[h + 2]) << 16) | (np.uint32(b[h + 3]) << 24)
            offset = 0 if has_min else 16
            for i in range(16):
                byte = b[h + 4 + i]
                lo = np.int32(byte & 15) | np.int32(((qh >> np.uint32(i)) & np.uint32(1)) << np.uint32(4))
                hi = np.int32(byte >> 4) | np.int32(((qh >> np.uint32(i + 16)) & np.uint32(1)) << np.uint32(4))
                qr[j * 32 + i] = lo - offset
                qr[j * 32 + 16 + i] = hi - offset
