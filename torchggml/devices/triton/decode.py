"""One small decoder per ggml type: ggml block bytes -> float32 values.

Every decoder has the same contract, so the dequantize, get_rows, matvec and GEMM kernels share
them (through `dequant_block`):

    blk: uint8 pointers to block starts, shape [R, B, 1] (R rows x B blocks of the same rows)
    j0:  first value to decode inside each block (a multiple of E)
    E:   number of values per block (constexpr, a power of two dividing the block size; the
         whole block for 32-value types)
    ->   float32 values j0 .. j0+E-1 of every block, shape [R, B, E], in ggml's element order

Work is done on the smallest shape it depends on: per-block scalars (d, dmin) on [R, B, 1, 1],
the K-quants' sub-block scales on [R, B, E/SUB, 1] (SUB = 16 or 32 values), and only the quant
bits per value, on [R, B, E/SUB, SUB]. The arithmetic follows gguf's quants.py step by step
(same products in the same order), so float32 results are bit-exact with it. Block layouts are
those of ggml-common.h; offsets below are in bytes from the block start.
"""
import triton
import triton.language as tl

from torchggml.types import Type

# ggml type ids as constexprs (jit code may only read constexpr globals)
F16 = tl.constexpr(int(Type.F16))
BF16 = tl.constexpr(int(Type.BF16))
Q4_0 = tl.constexpr(int(Type.Q4_0))
Q4_1 = tl.constexpr(int(Type.Q4_1))
Q5_0 = tl.constexpr(int(Type.Q5_0))
Q5_1 = tl.constexpr(int(Type.Q5_1))
Q8_0 = tl.constexpr(int(Type.Q8_0))
Q2_K = tl.constexpr(int(Type.Q2_K))
Q3_K = tl.constexpr(int(Type.Q3_K))
Q4_K = tl.constexpr(int(Type.Q4_K))
Q5_K = tl.constexpr(int(Type.Q5_K))
Q6_K = tl.constexpr(int(Type.Q6_K))
IQ4_NL = tl.constexpr(int(Type.IQ4_NL))
IQ4_XS = tl.constexpr(int(Type.IQ4_XS))
MXFP4 = tl.constexpr(int(Type.MXFP4))
TQ1_0 = tl.constexpr(int(Type.TQ1_0))
TQ2_0 = tl.constexpr(int(Type.TQ2_0))


def _pack_bytes(values) -> int:
    """Eight small signed ints as the bytes of one int64 (a lookup table in a constant)."""
    word = sum((v & 0xFF) << (8 * i) for i, v in enumerate(values))
    return word - (1 << 64) if word >= 1 << 63 else word


# 16-entry lookup tables, split in two int64 words (entries 0-7, 8-15)
_IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
IQ4_LO = tl.constexpr(_pack_bytes(_IQ4_VALUES[:8]))
IQ4_HI = tl.constexpr(_pack_bytes(_IQ4_VALUES[8:]))
_MXFP4_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)  # e2m1, doubled
MXFP4_LO = tl.constexpr(_pack_bytes(_MXFP4_VALUES[:8]))
MXFP4_HI = tl.constexpr(_pack_bytes(_MXFP4_VALUES[8:]))
POW3 = tl.constexpr(_pack_bytes((1, 3, 9, 27, 81)))  # TQ1_0's base-3 digit multipliers


# ---------------------------------------------------------------------------------------------
# byte helpers

@triton.jit
def _u8(ptr):
    """Bytes at `ptr` as int32 in 0..255."""
    return tl.load(ptr).to(tl.int32)


@triton.jit
def _i8(byte):
    """Sign-extend an int32 holding a byte."""
    return byte - ((byte & 0x80) << 1)


@triton.jit
def _f16(ptr):
    """Little-endian fp16 at `ptr` (any alignment) as float32."""
    bits = tl.load(ptr).to(tl.uint16) | (tl.load(ptr + 1).to(tl.uint16) << 8)
    return bits.to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _lut8(word, idx):
    """Signed byte `idx` (0..7) of the int64 constant `word`."""
    table = tl.full(idx.shape, word, tl.int64)
    return _i8(((table >> (idx * 8).to(tl.int64)) & 0xFF).to(tl.int32))


@triton.jit
def _lut16(idx, LO: tl.constexpr, HI: tl.constexpr):
    """Entry `idx` (0..15) of the table stored as the bytes of LO (0-7) and HI (8-15)."""
    return tl.where(idx < 8, _lut8(LO, idx & 7), _lut8(HI, idx & 7)).to(tl.float32)


@triton.jit
def _nibbles32(blk, E: tl.constexpr, QS: tl.constexpr):
    """4-bit codes of a whole 32-value block whose 16 bytes at QS hold values 0-15 in their low
    nibbles and 16-31 in their high nibbles (Q4_0, Q4_1, Q5_x, IQ4_NL, MXFP4): each byte is
    loaded once and split, [R, B, 16] bytes -> [R, B, 32] codes."""
    tl.static_assert(E == 32, "32-value blocks are decoded whole")
    byte = _u8(blk + QS + tl.arange(0, 16)[None, None, :])
    q = tl.permute(tl.join(byte & 0xF, byte >> 4), (0, 1, 3, 2))  # [R, B, 2 halves, 16]
    return tl.reshape(q, (q.shape[0], q.shape[1], 32))


@triton.jit
def _crumb(blk, j, QS: tl.constexpr):
    """2-bit code of element j (0..255) of the K-quant packing used by Q2_K, Q3_K and TQ2_0:
    each 128 values use 32 bytes at QS, value 32*s + l in bits 2s..2s+1 of byte l."""
    return (_u8(blk + QS + (j // 128) * 32 + (j % 32)) >> (((j // 32) % 4) * 2)) & 3


@triton.jit
def _bit256(blk, j, QH: tl.constexpr):
    """High bit of element j (0..255): bit j//32 of byte QH + j%32 (Q3_K hmask, Q5_K qh)."""
    return (_u8(blk + QH + (j % 32)) >> (j // 32)) & 1


@triton.jit
def _nibble256(blk, j, QS: tl.constexpr):
    """4-bit code of element j (0..255) for Q4_K/Q5_K: each 64 values use 32 bytes at QS,
    low nibbles first."""
    return (_u8(blk + QS + (j // 64) * 32 + (j % 32)) >> (((j // 32) % 2) * 4)) & 0xF


@triton.jit
def _scale_min_k4(blk, s, SC: tl.constexpr):
    """6-bit scale and min of sub-block s (0..7) from the 12 packed bytes at SC (Q4_K, Q5_K)."""
    low = s < 4
    b_s = _u8(blk + SC + s)            # s < 4: scale bits; s >= 4: high bits of the min
    b_s4 = _u8(blk + SC + s + 4)       # s < 4: min bits;   s >= 4: low nibbles of both
    b_sm4 = _u8(blk + SC + (s % 4))    # s >= 4: high bits of the scale
    scale = tl.where(low, b_s & 63, (b_s4 & 0xF) | ((b_sm4 >> 2) & 0x30))
    minimum = tl.where(low, b_s4 & 63, (b_s4 >> 4) | ((b_s >> 2) & 0x30))
    return scale.to(tl.float32), minimum.to(tl.float32)


@triton.jit
def _values(j0, E: tl.constexpr):
    """Positions j0 .. j0+E-1 as a [1, 1, E] tensor (decoders without sub-block scales)."""
    return (j0 + tl.arange(0, E))[None, None, :]


@triton.jit
def _sub_blocks(blk, j0, E: tl.constexpr, SUB: tl.constexpr):
    """4-D views for decoders with per-SUB-values scales: blk as [R, B, 1, 1], the sub-block
    indices as [1, 1, E/SUB, 1] and the positions as [1, 1, E/SUB, SUB]."""
    tl.static_assert(E % SUB == 0, "a decode step must cover whole sub-blocks")
    s = (j0 // SUB + tl.arange(0, E // SUB))[None, None, :, None]
    j = s * SUB + tl.arange(0, SUB)[None, None, None, :]
    return tl.expand_dims(blk, 3), s, j


@triton.jit
def _merge_sub_blocks(w):
    """[R, B, E/SUB, SUB] -> [R, B, E] (order kept)."""
    return tl.reshape(w, (w.shape[0], w.shape[1], w.shape[2] * w.shape[3]))


# ---------------------------------------------------------------------------------------------
# plain types: one "block" is one value (E == 1)

@triton.jit
def _dq_f16(blk, j0, E: tl.constexpr):
    bits = tl.load(blk.to(tl.pointer_type(tl.uint16)) + _values(j0, E))
    return bits.to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _dq_bf16(blk, j0, E: tl.constexpr):
    bits = tl.load(blk.to(tl.pointer_type(tl.uint16)) + _values(j0, E)).to(tl.int32)
    return (bits << 16).to(tl.float32, bitcast=True)


# ---------------------------------------------------------------------------------------------
# 32-value blocks

@triton.jit
def _dq_q4_0(blk, j0, E: tl.constexpr):  # d:f16 @0, qs[16] @2
    q = _nibbles32(blk, E, 2) - 8
    return _f16(blk) * q.to(tl.float32)


@triton.jit
def _dq_q4_1(blk, j0, E: tl.constexpr):  # d:f16 @0, m:f16 @2, qs[16] @4
    q = _nibbles32(blk, E, 4)
    return _f16(blk) * q.to(tl.float32) + _f16(blk + 2)


@triton.jit
def _dq_q5_0(blk, j0, E: tl.constexpr):  # d:f16 @0, qh:u32 @2 (bit j = 5th bit of value j), qs[16] @6
    j = _values(j0, E)
    high = (_u8(blk + 2 + j // 8) >> (j % 8)) & 1
    q = (_nibbles32(blk, E, 6) | (high << 4)) - 16
    return _f16(blk) * q.to(tl.float32)


@triton.jit
def _dq_q5_1(blk, j0, E: tl.constexpr):  # d:f16 @0, m:f16 @2, qh:u32 @4, qs[16] @8
    j = _values(j0, E)
    high = (_u8(blk + 4 + j // 8) >> (j % 8)) & 1
    q = _nibbles32(blk, E, 8) | (high << 4)
    return _f16(blk) * q.to(tl.float32) + _f16(blk + 2)


@triton.jit
def _dq_q8_0(blk, j0, E: tl.constexpr):  # d:f16 @0, qs:i8[32] @2
    q = _i8(_u8(blk + 2 + _values(j0, E)))
    return q.to(tl.float32) * _f16(blk)


@triton.jit
def _dq_iq4_nl(blk, j0, E: tl.constexpr):  # d:f16 @0, qs[16] @2 indexing the non-linear table
    return _f16(blk) * _lut16(_nibbles32(blk, E, 2), IQ4_LO, IQ4_HI)


@triton.jit
def _dq_mxfp4(blk, j0, E: tl.constexpr):  # e:e8m0 @0, qs[16] @1 indexing e2m1 values
    e = _u8(blk)
    # half of 2^(e-127), as ggml_e8m0_to_fp32_half: subnormal for e < 2
    bits = tl.where(e < 2, 0x00200000 << e, (e - 1) << 23)
    d = bits.to(tl.float32, bitcast=True)
    return d * _lut16(_nibbles32(blk, E, 1), MXFP4_LO, MXFP4_HI)


# ---------------------------------------------------------------------------------------------
# 256-value super-blocks (K-quants, IQ4_XS, ternary)

@triton.jit
def _dq_q2_k(blk, j0, E: tl.constexpr):
    # scales[16] @0 (per 16 values: low nibble scale, high nibble min), qs[64] @16, d @80, dmin @82
    blk, s, j = _sub_blocks(blk, j0, E, 16)
    sc = _u8(blk + s)
    dl = _f16(blk + 80) * (sc & 0xF).to(tl.float32)
    ml = _f16(blk + 82) * (sc >> 4).to(tl.float32)
    return _merge_sub_blocks(dl * _crumb(blk, j, 16).to(tl.float32) - ml)


@triton.jit
def _dq_q3_k(blk, j0, E: tl.constexpr):  # hmask[32] @0, qs[64] @32, scales[12] @96 (16 x 6 bits), d @108
    blk, s, j = _sub_blocks(blk, j0, E, 16)
    low = (_u8(blk + 96 + s % 8) >> ((s // 8) * 4)) & 0xF
    high = (_u8(blk + 104 + s % 4) >> ((s // 4) * 2)) & 3
    dl = _f16(blk + 108) * ((low | (high << 4)) - 32).to(tl.float32)
    # the 3rd bit, when clear, subtracts 4
    q = _crumb(blk, j, 32) - ((1 - _bit256(blk, j, 0)) << 2)
    return _merge_sub_blocks(dl * q.to(tl.float32))


@triton.jit
def _dq_q4_k(blk, j0, E: tl.constexpr):  # d @0, dmin @2, scales[12] @4, qs[128] @16
    blk, s, j = _sub_blocks(blk, j0, E, 32)
    scale, minimum = _scale_min_k4(blk, s, 4)
    d = _f16(blk) * scale
    dm = _f16(blk + 2) * minimum
    return _merge_sub_blocks(d * _nibble256(blk, j, 16).to(tl.float32) - dm)


@triton.jit
def _dq_q5_k(blk, j0, E: tl.constexpr):  # d @0, dmin @2, scales[12] @4, qh[32] @16, qs[128] @48
    blk, s, j = _sub_blocks(blk, j0, E, 32)
    scale, minimum = _scale_min_k4(blk, s, 4)
    d = _f16(blk) * scale
    dm = _f16(blk + 2) * minimum
    q = _nibble256(blk, j, 48) | (_bit256(blk, j, 16) << 4)
    return _merge_sub_blocks(d * q.to(tl.float32) - dm)


@triton.jit
def _dq_q6_k(blk, j0, E: tl.constexpr):  # ql[128] @0, qh[64] @128, scales:i8[16] @192, d @208
    blk, s, j = _sub_blocks(blk, j0, E, 16)
    low = (_u8(blk + (j // 128) * 64 + (j % 64)) >> (((j // 64) % 2) * 4)) & 0xF
    q = (low | (_crumb(blk, j, 128) << 4)) - 32
    d = _f16(blk + 208) * _i8(_u8(blk + 192 + s)).to(tl.float32)
    return _merge_sub_blocks(d * q.to(tl.float32))


@triton.jit
def _dq_iq4_xs(blk, j0, E: tl.constexpr):  # d @0, scales_h:u16 @2, scales_l[4] @4, qs[128] @8
    blk, s, j = _sub_blocks(blk, j0, E, 32)
    high = ((_u8(blk + 2) | (_u8(blk + 3) << 8)) >> (2 * s)) & 3
    low = (_u8(blk + 4 + s // 2) >> ((s % 2) * 4)) & 0xF
    dl = _f16(blk) * ((low | (high << 4)) - 32).to(tl.float32)
    idx = (_u8(blk + 8 + s * 16 + (j % 16)) >> (((j // 16) % 2) * 4)) & 0xF
    return _merge_sub_blocks(dl * _lut16(idx, IQ4_LO, IQ4_HI))


@triton.jit
def _dq_tq1_0(blk, j0, E: tl.constexpr):  # qs[48] @0 (5 base-3 digits a byte), qh[4] @48 (4 digits), d @52
    # values 0-159: digit j//32 of byte j%32; 160-239: digit (j-160)//16 of byte 32+(j-160)%16;
    # 240-255: digit (j-240)//4 of byte 48+(j-240)%4. A digit is read by multiplying the byte by
    # 3^digit (mod 256) and taking the top of byte*3.
    j = _values(j0, E)
    j1 = tl.maximum(j - 160, 0)
    j2 = tl.maximum(j - 240, 0)
    offset = tl.where(j < 160, j % 32, tl.where(j < 240, 32 + j1 % 16, 48 + j2 % 4))
    digit = tl.where(j < 160, j // 32, tl.where(j < 240, j1 // 16, j2 // 4))
    byte = (_u8(blk + offset) * _lut8(POW3, digit)) & 0xFF
    q = ((byte * 3) >> 8) - 1
    return _f16(blk + 52) * q.to(tl.float32)


@triton.jit
def _dq_tq2_0(blk, j0, E: tl.constexpr):  # qs[64] @0 (2 bits a value), d @64
    q = _crumb(blk, _values(j0, E), 0) - 1
    return _f16(blk + 64) * q.to(tl.float32)


# ---------------------------------------------------------------------------------------------

@triton.jit
def dequant_block(blk, j0, QTYPE: tl.constexpr, E: tl.constexpr):
    """Decode values j0 .. j0+E-1 of the blocks at `blk` for ggml type QTYPE (see the module
    docstring)."""
    if QTYPE == Q4_0:
        w = _dq_q4_0(blk, j0, E)
    elif QTYPE == Q4_1:
        w = _dq_q4_1(blk, j0, E)
    elif QTYPE == Q5_0:
        w = _dq_q5_0(blk, j0, E)
    elif QTYPE == Q5_1:
        w = _dq_q5_1(blk, j0, E)
    elif QTYPE == Q8_0:
        w = _dq_q8_0(blk, j0, E)
    elif QTYPE == Q2_K:
        w = _dq_q2_k(blk, j0, E)
    elif QTYPE == Q3_K:
        w = _dq_q3_k(blk, j0, E)
    elif QTYPE == Q4_K:
        w = _dq_q4_k(blk, j0, E)
    elif QTYPE == Q5_K:
        w = _dq_q5_k(blk, j0, E)
    elif QTYPE == Q6_K:
        w = _dq_q6_k(blk, j0, E)
    elif QTYPE == IQ4_NL:
        w = _dq_iq4_nl(blk, j0, E)
    elif QTYPE == IQ4_XS:
        w = _dq_iq4_xs(blk, j0, E)
    elif QTYPE == MXFP4:
        w = _dq_mxfp4(blk, j0, E)
    elif QTYPE == TQ1_0:
        w = _dq_tq1_0(blk, j0, E)
    elif QTYPE == TQ2_0:
        w = _dq_tq2_0(blk, j0, E)
    elif QTYPE == F16:
        w = _dq_f16(blk, j0, E)
    else:
        tl.static_assert(QTYPE == BF16, "torchggml/devices/triton: no decoder for this ggml type")
        w = _dq_bf16(blk, j0, E)
    return w


@triton.jit
def load_weight_tile(base, row_offs, k0, b_end, QTYPE: tl.constexpr, QK: tl.constexpr,
                     TS: tl.constexpr, NB: tl.constexpr, E: tl.constexpr):
    """Values k0 .. k0 + NB*E - 1 of the rows at base + row_offs (a uint8 pointer and [R] int32
    byte offsets) as a float32 [R, NB*E] tile: NB whole blocks (E == QK, k0 on a block boundary)
    or a part of one block (NB == 1, E < QK, E divides QK). Blocks at or past b_end read as
    zeros (their loads are clamped in range)."""
    b = k0 // QK + tl.arange(0, NB)
    in_range = b < b_end
    b = tl.minimum(b, b_end - 1)
    # one scalar pointer plus 32-bit offsets: half the registers of a 64-bit pointer per value
    blk = base + (row_offs[:, None, None] + (b * TS)[None, :, None])
    w = dequant_block(blk, k0 % QK, QTYPE, E)
    w = tl.where(in_range[None, :, None], w, 0.0)
    return tl.reshape(w, (row_offs.shape[0], NB * E))
