"""torchggml.quants against references we did not write.

- dequantize: bit for bit against gguf.quants.dequantize for every type gguf decodes; Q8_1 and
  Q8_K (absent from gguf) against a float64 decode written from ggml's block definitions.
- quantize: byte for byte against gguf.quants.quantize where gguf implements it; Q8_1, Q8_K
  and IQ4_NL against numpy transcriptions of ggml's C reference (quantize_row_*_ref).
  test_quantize_ggml.py checks every quantizable type against llama.cpp's C quantizers.
- a roundtrip sanity bound for every quantizable type, and bad input.
"""
import gguf
import gguf.quants
import numpy as np
import pytest
import torch

from torchggml.quants import dequantize, dequantize_types, quantize, quantize_types
from torchggml.quants.tables import table
from torchggml.types import Type, type_traits
import math
import torchggml as ggml

GGUF_TYPES = {t for t in Type if t.name in gguf.GGMLQuantizationType.__members__}


def gguf_type(t: Type):
    return gguf.GGMLQuantizationType[t.name]


def gguf_can(t: Type, direction: str) -> bool:
    """Whether the installed gguf implements quantize/dequantize of t."""
    if t in (Type.F32, Type.F16):
        return True
    quant = gguf.quants._type_traits.get(gguf_type(t)) if t in GGUF_TYPES else None
    if quant is None:
        return False
    base = getattr(gguf.quants, "__Quant")
    method = f"{direction}_blocks"
    return getattr(quant, method).__func__ is not getattr(base, method).__func__


def bits(a) -> np.ndarray:
    """float32 values as their bit patterns, so comparisons see -0.0 and NaN payloads."""
    a = a.numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


# ----------------------------------------------------------------------------- random blocks

# Byte offsets of each block's fp16 scales (random bytes there would give inf/NaN scales).
F16_SCALE_OFFSETS = {
    Type.Q4_0: [0], Type.Q4_1: [0, 2], Type.Q5_0: [0], Type.Q5_1: [0, 2], Type.Q8_0: [0],
    Type.Q8_1: [0, 2], Type.Q2_K: [80, 82], Type.Q3_K: [108], Type.Q4_K: [0, 2],
    Type.Q5_K: [0, 2], Type.Q6_K: [208], Type.IQ2_XXS: [0], Type.IQ2_XS: [0], Type.IQ2_S: [0],
    Type.IQ3_XXS: [0], Type.IQ3_S: [0], Type.IQ1_S: [0], Type.IQ4_NL: [0], Type.IQ4_XS: [0],
    Type.TQ1_0: [52], Type.TQ2_0: [64], Type.Q1_0: [0], Type.Q2_0: [0],
}


def random_scales(rng, n) -> np.ndarray:
    """Finite scales of both signs over a few decades, as fp16."""
    return (rng.standard_normal(n) * 10.0 ** rng.integers(-4, 1, n)).astype(np.float16)


def random_blocks(t: Type, n_blocks: int, rng) -> np.ndarray:
    """Random bytes [n_blocks, type_size] whose scale fields hold sane finite values."""
    tr = type_traits(t)
    if t in (Type.F32, Type.F16, Type.BF16):  # plain types: finite values
        x = (rng.standard_normal(n_blocks) * 100).astype(np.float32)
        if t == Type.F16:
            return x.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
        b = x.view(np.uint8).reshape(n_blocks, 4)
        return b if t == Type.F32 else b[:, 2:].copy()  # bf16: the high half of an fp32
    b = rng.integers(0, 256, size=(n_blocks, tr.type_size), dtype=np.uint8)
    for off in F16_SCALE_OFFSETS.get(t, []):
        b[:, off:off + 2] = random_scales(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    if t == Type.Q8_K:
        b[:, 0:4] = (rng.standard_normal(n_blocks) * 1e-3).astype(np.float32).view(np.uint8).reshape(-1, 4)
    if t == Type.IQ1_M:  # the fp16 scale is spread over the top nibbles of 4 uint16s
        d = random_scales(rng, n_blocks).view(np.uint16).astype(np.uint32)
        words = b[:, 48:56].copy().view(np.uint16)
        for k in range(4):
            words[:, k] = (words[:, k] & 0x0FFF) | (((d >> (4 * k)) & 0xF) << 12)
        b[:, 48:56] = words.view(np.uint8)
    # MXFP4's e8m0 byte stays fully random: every exponent (subnormal, overflow) is valid
    return b


# ----------------------------------------------------------------------- float64 decoders

def decode_q8_1(b: np.ndarray) -> np.ndarray:
    """block_q8_1 {half d; half s; int8 qs[32]}: y = d * qs."""
    d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
    qs = b[:, 4:].view(np.int8).astype(np.float64)
    return (d * qs).astype(np.float32)


def decode_q8_k(b: np.ndarray) -> np.ndarray:
    """block_q8_K {float d; int8 qs[256]; int16 bsums[16]}: y = d * qs."""
    d = b[:, 0:4].copy().view(np.float32).astype(np.float64)
    qs = b[:, 4:260].view(np.int8).astype(np.float64)
    return (d * qs).astype(np.float32)  # a float32 times an int8 is exact in float64


def decode_q1_0(b: np.ndarray) -> np.ndarray:
    """block_q1_0 {half d; uint8 qs[16]} (dequantize_row_q1_0): bit j % 8 of byte j // 8 set -> +d, else -d."""
    d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
    bit = (b[:, 2:, None] >> np.arange(8)) & 1                        # [n, byte, bit]
    return np.where(bit.reshape(len(b), 128) == 1, d, -d).astype(np.float32)


def decode_q2_0(b: np.ndarray) -> np.ndarray:
    """block_q2_0 {half d; uint8 qs[16]} (dequantize_row_q2_0): q = bits 2(j % 4) of byte j // 4,
    y = (q - 1) d."""
    d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
    q = (b[:, 2:, None] >> (2 * np.arange(4))) & 3                    # [n, byte, pair]
    return ((q.reshape(len(b), 64).astype(np.float64) - 1) * d).astype(np.float32)


FLOAT64_DECODERS = {Type.Q8_1: decode_q8_1, Type.Q8_K: decode_q8_k, Type.Q1_0: decode_q1_0,
                    Type.Q2_0: decode_q2_0}


def reference_dequantize(t: Type, b: np.ndarray) -> np.ndarray:
    if t in FLOAT64_DECODERS:
        return FLOAT64_DECODERS[t](b.reshape(-1, type_traits(t).type_size)).reshape(*b.shape[:-1], -1)
    return gguf.quants.dequantize(b, gguf_type(t))


# ------------------------------------------------------------------------ dequantize table

DEQUANT_TYPES = dequantize_types()
# (leading shape, blocks per row): one block, several rows x blocks, and a batch dimension
SHAPES = [((1,), 1), ((3,), 4), ((2, 3), 2)]


def test_every_type_gguf_decodes_is_covered():
    missing = [t.name for t in GGUF_TYPES if gguf_can(t, "dequantize") and t not in DEQUANT_TYPES]
    assert not missing, f"gguf decodes {missing} but torchggml.quants does not"
    unchecked = [t.name for t in DEQUANT_TYPES if t not in FLOAT64_DECODERS and not gguf_can(t, "dequantize")]
    assert not unchecked, f"no reference for {unchecked}"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("t", DEQUANT_TYPES, ids=lambda t: t.name)
def test_dequantize_random_blocks_bit_exact(t, shape):
    lead, per_row = shape
    rng = np.random.default_rng([int(t), per_row, len(lead)])
    n_rows = int(np.prod(lead))
    b = random_blocks(t, n_rows * per_row, rng).reshape(*lead, -1)
    out = dequantize(t, torch.from_numpy(b))
    ref = reference_dequantize(t, b)
    assert out.dtype == torch.float32
    assert tuple(out.shape) == (*lead, per_row * type_traits(t).blck_size)
    np.testing.assert_array_equal(bits(out), bits(ref), err_msg=f"{t.name} differs from the reference")


GGUF_QUANTIZED = [t for t in DEQUANT_TYPES if t in GGUF_TYPES and gguf_can(t, "quantize")]


@pytest.mark.parametrize("t", GGUF_QUANTIZED, ids=lambda t: t.name)
def test_dequantize_gguf_quantized_bit_exact(t):
    rng = np.random.default_rng(int(t))
    x = (rng.standard_normal((4, 2 * type_traits(t).blck_size)) * 3).astype(np.float32)
    b = np.ascontiguousarray(gguf.quants.quantize(x, gguf_type(t))).view(np.uint8)
    out = dequantize(t, torch.from_numpy(b))
    np.testing.assert_array_equal(bits(out), bits(gguf.quants.dequantize(b, gguf_type(t))))


@pytest.mark.parametrize("t", [Type.Q4_0, Type.Q4_K, Type.IQ2_XS, Type.MXFP4], ids=lambda t: t.name)
def test_dequantize_non_contiguous_and_empty(t):
    rng = np.random.default_rng(7)
    size = type_traits(t).type_size
    b = torch.from_numpy(random_blocks(t, 12, rng)).reshape(3, 4 * size)
    strided = b.t().contiguous().t()  # same values, column-major storage
    assert torch.equal(dequantize(t, strided), dequantize(t, b))
    empty = dequantize(t, torch.empty(0, 2 * size, dtype=torch.uint8))
    assert tuple(empty.shape) == (0, 2 * type_traits(t).blck_size)


@pytest.mark.parametrize("t", [Type.F32, Type.F16, Type.BF16], ids=lambda t: t.name)
def test_dequantize_plain_accepts_its_own_dtype(t):
    x = torch.randn(3, 8).to(type_traits(t).dtype)
    assert torch.equal(dequantize(t, x), x.float())
    assert torch.equal(dequantize(t, x.view(torch.uint8)), x.float())


# --------------------------------------------------------------------------- quantize table

def quantize_inputs(n_blocks: int, blck: int) -> list[np.ndarray]:
    """float32 rows of several magnitudes, plus awkward blocks: all zero, a constant, a tie
    between +max and -max, values that land on a .5 after scaling, and one huge outlier."""
    rng = np.random.default_rng(blck + n_blocks)
    rows = [(rng.standard_normal((3, n_blocks * blck)) * s).astype(np.float32) for s in (1, 1e-3, 50)]
    special = rng.standard_normal((7, blck)).astype(np.float32)
    special[0] = 0
    special[1] = 0.75
    special[2, 0], special[2, 1] = -4, 4
    special[3] = np.arange(blck) % 50 - np.float32(24.5)  # scale 1 for q8: exact .5 ties
    special[3, 0] = 127
    special[3, 5] = np.float32(0.49999997)
    special[4, 3] = 1e4
    special[5] = np.float32(2.0) ** (np.arange(blck) % 20 - 10)  # powers of two (mxfp4)
    special[5, 1::2] = np.nextafter(special[5, 1::2], np.float32(0))  # and just below them
    special[6] = np.where(np.arange(blck) % 2 == 0, np.float32(0.5), np.float32(-0.5))
    special[6, 7] = 1  # ternary: 0.5 / max lands on a tie
    rows.append(special)
    return rows


GGUF_QUANTIZE = [t for t in quantize_types() if t in GGUF_TYPES and gguf_can(t, "quantize")]


@pytest.mark.parametrize("t", GGUF_QUANTIZE, ids=lambda t: t.name)
def test_quantize_matches_gguf_bytes(t):
    for x in quantize_inputs(3, max(32, type_traits(t).blck_size)):
        ref = np.ascontiguousarray(gguf.quants.quantize(x, gguf_type(t))).view(np.uint8)
        out = quantize(t, torch.from_numpy(x))
        assert out.dtype == torch.uint8
        np.testing.assert_array_equal(out.numpy(), ref.reshape(out.shape), err_msg=t.name)


def test_quantize_batch_dimension():
    x = torch.randn(2, 3, 64)
    assert torch.equal(quantize(Type.Q4_0, x).reshape(6, -1), quantize(Type.Q4_0, x.reshape(6, 64)))
    assert quantize(Type.Q4_0, x).shape == (2, 3, 36)


def test_quantize_bf16_special_values():
    x = np.array([np.nan, -np.inf, np.inf, 1 + 2 ** -8, 1 + 3 * 2 ** -8, -0.0, 3e38, 1e-40],
                 dtype=np.float32)
    x = np.concatenate([x, np.array([0x7F800001, 0xFFC00001], dtype=np.uint32).view(np.float32)])
    ref = gguf.quants.quantize(x.reshape(1, -1), gguf.GGMLQuantizationType.BF16)
    np.testing.assert_array_equal(quantize(Type.BF16, torch.from_numpy(x)).numpy(), ref.reshape(-1))


# ------------------------------- types gguf cannot quantize: numpy transcriptions of ggml C

def c_round(v: np.ndarray) -> np.ndarray:
    """C roundf in float64 (adding 0.5 to a float32 value is exact there)."""
    v = v.astype(np.float64)
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def first_absmax(xb: np.ndarray) -> float:
    """ggml's `if (ax > amax) { amax = ax; max = x; }` scan."""
    amax, mx = np.float32(0), np.float32(0)
    for v in xb:
        if abs(v) > amax:
            amax, mx = abs(v), v
    return mx


def ref_quantize_q8_1(x: np.ndarray) -> np.ndarray:
    out = []
    for xb in x.reshape(-1, 32):
        d = np.abs(xb).max() / np.float32(127)
        id_ = np.float32(1) / d if d else np.float32(0)
        q = c_round(xb * id_).astype(np.int8)
        s = np.float32(int(q.astype(np.int64).sum())) * d
        out.append(np.concatenate([np.float16([d, s]).view(np.uint8), q.view(np.uint8)]))
    return np.stack(out)


def ref_quantize_q8_k(x: np.ndarray) -> np.ndarray:
    out = []
    for xb in x.reshape(-1, 256):
        mx = first_absmax(xb)
        if mx == 0:
            d, q = np.float32(0), np.zeros(256, np.int8)
        else:
            iscale = np.float32(-127) / mx
            q = np.minimum(127, np.rint(iscale * xb)).astype(np.int8)  # nearest_int: ties to even
            d = np.float32(1) / iscale
        bsums = q.reshape(16, 16).astype(np.int16).sum(axis=1, dtype=np.int16)
        out.append(np.concatenate([np.float32([d]).view(np.uint8), q.view(np.uint8), bsums.view(np.uint8)]))
    return np.stack(out)


IQ4NL_VALUES = np.array(gguf.quants.IQ4_NL.kvalues, dtype=np.float32)


def best_index_int8(v: float) -> int:
    """ggml's best_index_int8: binary search, the upper neighbour unless the lower is nearer."""
    vals = IQ4NL_VALUES
    if v <= vals[0]:
        return 0
    if v >= vals[-1]:
        return 15
    lo, hi = 0, 15
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if v < vals[mid]:
            hi = mid
        else:
            lo = mid
    return lo if v - vals[lo] < vals[hi] - v else hi


def ref_quantize_iq4_nl(xb: np.ndarray) -> tuple[float, list[int]]:
    """quantize_row_iq4_nl_ref for one block: (d in float64, indices); d=0 for dead blocks."""
    mx = first_absmax(xb)
    if abs(mx) < 1e-15:
        return 0.0, None
    inv = np.float32(1) / (mx / np.float32(-127))
    index = [best_index_int8(np.float32(inv * v)) for v in xb]
    q = IQ4NL_VALUES[index].astype(np.float64)
    w = xb.astype(np.float64) ** 2
    return float((w * q * xb).sum() / (w * q * q).sum()), index


def fp16_ulps(a: float, b: float) -> int:
    ia, ib = (int(np.float16(v).view(np.int16)) for v in (a, b))
    return abs(ia - ib)


@pytest.mark.parametrize("t,reference", [(Type.Q8_1, ref_quantize_q8_1), (Type.Q8_K, ref_quantize_q8_k)],
                         ids=["Q8_1", "Q8_K"])
def test_quantize_q8_matches_ggml_reference(t, reference):
    for x in quantize_inputs(2, type_traits(t).blck_size):
        out = quantize(t, torch.from_numpy(x))
        np.testing.assert_array_equal(out.numpy().reshape(-1, type_traits(t).type_size), reference(x))


def test_quantize_iq4_nl_matches_ggml_reference():
    for x in quantize_inputs(3, 32):
        out = quantize(Type.IQ4_NL, torch.from_numpy(x)).numpy().reshape(-1, 18)
        for block, xb in zip(out, x.reshape(-1, 32)):
            d_ref, index = ref_quantize_iq4_nl(xb)
            d = float(block[:2].copy().view(np.float16)[0])
            # ggml sums in float32 in C order, we sum in float32 pairwise, the reference in
            # float64: the fp16 scale may differ in its last place, never more
            assert fp16_ulps(d, d_ref) <= 1, (d, d_ref)
            if index is not None:
                got = np.stack([block[2:] & 0xF, block[2:] >> 4]).reshape(32)
                np.testing.assert_array_equal(got, index)
            else:
                assert d == 0


def ref_quantize_q1_0(x: np.ndarray) -> np.ndarray:
    """quantize_row_q1_0_ref: d = (sum |x| in float32, left to right) / 128; bit set where x >= 0."""
    out = []
    for xb in x.reshape(-1, 128):
        total = np.float32(0)
        for v in xb:
            total = np.float32(total + np.float32(abs(v)))
        d = np.float16(total / np.float32(128))
        bits = (xb >= 0).astype(np.uint8).reshape(16, 8)
        qs = (bits << np.arange(8, dtype=np.uint8)).sum(axis=1).astype(np.uint8)
        out.append(np.concatenate([np.array([d]).view(np.uint8), qs]))
    return np.stack(out)


def ref_quantize_q2_0(x: np.ndarray) -> np.ndarray:
    """quantize_row_q2_0_ref: d = max |x|; q = roundf(x / d) + 1 clamped to [0, 3], 2 bits each."""
    out = []
    for xb in x.reshape(-1, 64):
        d = np.abs(xb).max()
        id_ = np.float32(1) / d if d > 0 else np.float32(0)
        q = np.clip(c_round(xb * id_) + 1, 0, 3).astype(np.uint8).reshape(16, 4)
        qs = (q << (2 * np.arange(4, dtype=np.uint8))).sum(axis=1).astype(np.uint8)
        out.append(np.concatenate([np.array([np.float16(d)]).view(np.uint8), qs]))
    return np.stack(out)


def ref_quantize_nvfp4(x: np.ndarray) -> np.ndarray:
    """quantize_row_nvfp4_ref: per 16 values a ue4m3 scale of amax / 6 (gguf's converters), then
    the nearest doubled e2m1 value, first on ties; element j low and j + 8 high nibble."""
    nv = gguf.quants.NVFP4
    kvalues = np.array(nv.kvalues, dtype=np.float32)
    out = []
    for xb in x.reshape(-1, 64):
        scales, nibbles = [], []
        for sub in xb.reshape(4, 16):
            ue = nv.fp32_to_ue4m3(np.array([np.abs(sub).max() / np.float32(6)], dtype=np.float32))[0]
            d = np.float32(nv.ue4m3_to_fp32(np.array([ue], dtype=np.uint8))[0])
            idx = [int(np.argmin(np.abs(kvalues * d - v))) for v in sub]
            scales.append(ue)
            nibbles += [idx[j] | (idx[j + 8] << 4) for j in range(8)]
        out.append(np.array(scales + nibbles, dtype=np.uint8))
    return np.stack(out)


@pytest.mark.parametrize("t,reference", [(Type.Q1_0, ref_quantize_q1_0), (Type.Q2_0, ref_quantize_q2_0),
                                         (Type.NVFP4, ref_quantize_nvfp4)], ids=["Q1_0", "Q2_0", "NVFP4"])
def test_quantize_low_bit_matches_ggml_reference(t, reference):
    for x in quantize_inputs(2, type_traits(t).blck_size):
        out = quantize(t, torch.from_numpy(x))
        np.testing.assert_array_equal(out.numpy().reshape(-1, type_traits(t).type_size), reference(x))


# -------------------------------------------------------------------------------- roundtrip

# normalized RMS error bound of dequantize(quantize(x)): Gaussian x, except for the
# ternary types, whose data is ternary (times a scale) and comes back up to fp16 rounding
ROUNDTRIP_RMSE = {Type.F32: 0, Type.F16: 1e-3, Type.BF16: 5e-3, Type.Q8_0: 0.01, Type.Q8_1: 0.01,
                  Type.Q8_K: 0.01, Type.Q5_0: 0.06, Type.Q5_1: 0.06, Type.Q4_0: 0.12,
                  Type.Q4_1: 0.12, Type.IQ4_NL: 0.12, Type.MXFP4: 0.2, Type.TQ1_0: 1e-3,
                  Type.TQ2_0: 1e-3,
                  # measured 0.30, 0.15, 0.072, 0.036, 0.018, 0.077 (the bits per weight)
                  Type.Q2_K: 0.35, Type.Q3_K: 0.18, Type.Q4_K: 0.085, Type.Q5_K: 0.043,
                  Type.Q6_K: 0.022, Type.IQ4_XS: 0.09,
                  # sign times mean |x| (sqrt(1 - 2/pi) = 0.60 for Gaussian x); {-1, 0, 1, 2} max|x|; fp4
                  Type.Q1_0: 0.62, Type.Q2_0: 0.75, Type.NVFP4: 0.15}


@pytest.mark.parametrize("t", quantize_types(), ids=lambda t: t.name)
def test_roundtrip(t):
    gen = torch.Generator().manual_seed(int(t))
    x = torch.randn(4, 2 * type_traits(t).blck_size, generator=gen)
    if t in (Type.TQ1_0, Type.TQ2_0):
        x = x.round().clamp(-1, 1) * 0.3
    y = dequantize(t, quantize(t, x))
    assert y.shape == x.shape
    rmse = ((y - x).pow(2).mean() / x.pow(2).mean()).sqrt().item()
    assert rmse <= ROUNDTRIP_RMSE[t], f"{t.name}: relative RMS error {rmse:.3g}"


# ------------------------------------------------------------------ tables against gguf's

def test_small_tables_match_gguf():
    ksigns = np.frombuffer(gguf.quants.IQ2_XXS.ksigns, dtype=np.uint8)
    assert np.array_equal(table("ksigns", "cpu").numpy(), ksigns)
    assert table("iq4nl", "cpu").tolist() == list(gguf.quants.IQ4_NL.kvalues)
    assert table("mxfp4", "cpu").tolist() == list(gguf.quants.MXFP4.kvalues)
    expected_bits = np.where((ksigns[:, None] >> np.arange(8)) & 1, -1.0, 1.0)
    assert np.array_equal(table("ksign_bits", "cpu").numpy(), expected_bits)


# -------------------------------------------------------------------------------- bad input

BYTES = torch.zeros(1, 18, dtype=torch.uint8)  # one Q4_0 block

BAD_CALLS = [
    ("dequantize float blocks", lambda: dequantize(Type.Q4_0, torch.zeros(2, 18)), TypeError, "uint8"),
    ("dequantize numpy", lambda: dequantize(Type.Q4_0, BYTES.numpy()), TypeError, "torch.Tensor"),
    ("dequantize partial block", lambda: dequantize(Type.Q4_0, BYTES[:, :17]), ValueError, "18-byte blocks"),
    ("dequantize scalar", lambda: dequantize(Type.Q8_0, BYTES[0, 0]), ValueError, "dimension"),
    ("dequantize unknown id", lambda: dequantize(999, BYTES), ValueError, "999"),
    ("dequantize unknown name", lambda: dequantize("q4_9", BYTES), ValueError, "q4_9"),
    ("dequantize unsupported", lambda: dequantize(Type.I32, BYTES[:, :4]), ValueError, "I32"),
    ("quantize int", lambda: quantize(Type.Q8_0, torch.zeros(1, 32).int()), TypeError, "floating"),
    ("quantize partial block", lambda: quantize(Type.Q4_0, torch.zeros(2, 33)), ValueError, "block size 32"),
    ("quantize unsupported", lambda: quantize(Type.IQ2_XXS, torch.zeros(1, 256)), ValueError, "IQ2_XXS"),
    ("quantize list", lambda: quantize(Type.Q4_0, [0.0] * 32), TypeError, "torch.Tensor"),
]


@pytest.mark.parametrize("call,error,message", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_bad_input_raises(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("value", [math.nan, math.inf], ids=["nan", "inf"])
def test_quantize_refuses_non_finite_values(value):
    x = torch.ones(2, 32)
    x[1, 5] = value
    with pytest.raises(ValueError, match=r"quantize\(Q4_0\): x has a non-finite value .* at index \(1, 5\)"):
        ggml.quants.quantize("Q4_0", x)
