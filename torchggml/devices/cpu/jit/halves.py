"""float32 -> float16 rounding in integer steps (ties to even, as numpy's and the CPU's casts):
LLVM lowers a float -> half cast to a runtime function (__truncsfhf2) where the CPU has no F16C,
and numba's JIT cannot link it (an abort). The kernels use these there, the casts elsewhere.

    float_to_half_bits(x) -> uint16    the float16 nearest x, as its bits
    round_to_half(x) -> float32        the same value as float32
"""
import numpy as np
from numba import njit


@njit(cache=True, nogil=True, inline="always")
def float_to_half_bits(x):
    bits = np.int64(np.float32(x).view(np.uint32))
    sign, mag = (bits >> 16) & 0x8000, bits & 0x7FFFFFFF
    if mag >= 0x7F800000:  # inf; NaN keeps its top payload bits, quiet
        return np.uint16(sign | 0x7C00 | ((mag & 0x7FFFFF) >> 13) | (0x200 if mag > 0x7F800000 else 0))
    if mag >= 0x38800000:  # a normal float16 (>= 2^-14): 13 mantissa bits dropped
        mag = (mag + 0xFFF + ((mag >> 13) & 1)) & 0x7FFFE000
        if mag >= 0x47800000:  # 65520 and above: inf
            return np.uint16(sign | 0x7C00)
        return np.uint16(sign | ((mag - 0x38000000) >> 13))
    shift = 126 - (mag >> 23)  # a subnormal float16: a multiple of 2^-24 (1024 of them: 2^-14)
    if shift >= 25 or mag < 0x00800000:
        return np.uint16(sign)
    m = (mag & 0x7FFFFF) | 0x800000
    return np.uint16(sign | ((m + (1 << (shift - 1)) - 1 + ((m >> shift) & 1)) >> shift))


@njit(cache=True, nogil=True, inline="always")
def round_to_half(x):
    h = np.int64(float_to_half_bits(x))
    sign, exponent, mantissa = h >> 15, (h >> 10) & 0x1F, h & 0x3FF
    if exponent == 0x1F and mantissa:  # NaN
        return x
    if exponent == 0x1F:
        value = np.float32(np.inf)
    elif exponent == 0:
        value = np.float32(mantissa) * np.float32(2.0 ** -24)
    else:
        value = np.uint32(((exponent + 112) << 23) | (mantissa << 13)).view(np.float32)
    return -value if sign else value
