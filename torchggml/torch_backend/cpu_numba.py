"""numba kernels for the CPU device's small per-node work (decode steps): one compiled call per
node instead of several torch dispatches (cpu_ops.py binds them).

Every kernel takes 4-D numpy views [ne3, ne2, ne1, ne0] with any strides and does the same
arithmetic as the torch kernels it stands in for (kernels/): float32 element-wise, float64 row
sums where ggml sums in ggml_float, angles in float64. F16 values travel as uint16 bits and are
converted by LLVM's half<->float instructions (vcvtph2ps/vcvtps2ph on x86's F16C, fcvt on ARM),
so a float32 -> F16 store rounds to nearest even as torch's does. numba is not told fastmath:
LLVM then neither reorders sums nor fuses multiplies and adds; its numpy error model keeps IEEE
division (x / 0 is inf or NaN, as in ggml, not a ZeroDivisionError).

    row_norm(x, out, eps, rms)                       NORM / RMS_NORM over ne0
    soft_max(x, out, mask, slopes, sinks, scale, has_mask, has_sinks)
    rope(x, out, pos, factors, inv_freq, ramp, has_factors, freq_scale, mscale, start, width,
         interleaved, copy_rest)                     NORMAL / NEOX rotation
    set_rows(rows, idx, dst) -> first bad index position or -1
    copy(src, dst)                                   same shape, element by element, tiled
    swiglu(x, gate, out)                             silu(x) * gate
    binary(a, b, out, op)                            a + - * / b (op 0..3), b tiled over a
    transpose(src, dst)                              dst[c, r] = src[r, c], 2-D, any element type
    get_block_rows(table, ids, out, kind) -> first bad index position or -1
                                                     out[i3, i2, j] = dequantized table[i3, i2, ids[..]]
                                                     for kind in BLOCK_KINDS (bit-exact as ggml/gguf)
    half_products(a, a_strides, b, b_strides, out, k, r2, r3)
                                                     out[i3, i2, m, n] = sum_k a[i3 / r3, i2 / r2, n, k]
                                                     * b[i3, i2, m, k], a F16, b F32 (flat, k contiguous)
"""
from __future__ import annotations

import functools

# the block types get_block_rows dequantizes, by kind number
BLOCK_KINDS = ("Q4_0", "Q8_0", "Q4_K", "Q6_K")


@functools.lru_cache(maxsize=None)
def numba_ops():
    """The kernels as a module (cpu_numba_kernels), compiled per argument types on first use and
    cached on disk."""
    from . import cpu_numba_kernels
    return cpu_numba_kernels

