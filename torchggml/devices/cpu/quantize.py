"""ggml's quantizers in native code (numba, rows in parallel): what llama-quantize writes, bit for
bit, with or without an importance matrix.

    quantize_native(qtype, x, imatrix=None)   float [rows, n] -> uint8 [rows, row_bytes]
    NATIVE_TYPES                              the types it writes

This is ggml_quantize_chunk's behaviour (ggml-quants.c's quantize_<type>), not the reference
quantize_row_*_ref that torchggml.quants.quantize follows: the two agree without an importance
matrix except for IQ4_NL (ggml_quantize_chunk searches 15 scales a block, the reference one).
The kernels are in jit/quantize_kernels.py.
"""
from __future__ import annotations

import numpy as np

from ...types import Type, as_type, blck_size, row_size

NATIVE_TYPES = (Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1, Type.Q8_0, Type.Q2_K, Type.Q3_K, Type.Q4_K,
                Type.Q5_K, Type.Q6_K, Type.IQ4_NL, Type.IQ4_XS)
_NO_IMATRIX = np.zeros(1, np.float32)


def quantize_native(qtype, x, imatrix=None, out: np.ndarray | None = None) -> np.ndarray:
    """x: float32-convertible [rows, n] (numpy or torch; a float16 numpy array is converted in the
    kernel, a row at a time); imatrix: the mean squared activation of
    each of the n columns (llama.cpp's importance matrix for this tensor), or None.
    Returns uint8 [rows, row_size(qtype, n)] (written into `out` when given)."""
    from .jit.loader import quantize_kernels
    t = as_type(qtype)
    if t not in NATIVE_TYPES:
        raise ValueError(f"quantize_native: no native quantizer for {t.name}; "
                         f"these have one: {', '.join(q.name for q in NATIVE_TYPES)}")
    half = isinstance(x, np.ndarray) and x.dtype == np.float16
    x = _as_rows(x) if half else _as_f32_rows(x)
    rows, n = x.shape
    if n % blck_size(t):
        raise ValueError(f"quantize_native({t.name}): row of {n} values is not a multiple of the block size "
                         f"{blck_size(t)}")
    qw = _NO_IMATRIX
    if imatrix is not None:
        qw = np.ascontiguousarray(_as_f32(imatrix).reshape(-1))
        if qw.shape[0] != n:
            raise ValueError(f"quantize_native({t.name}): importance matrix of {qw.shape[0]} values "
                             f"for rows of {n}")
    if out is None:
        out = np.empty((rows, row_size(t, n)), dtype=np.uint8)
    elif out.shape != (rows, row_size(t, n)) or out.dtype != np.uint8:
        raise ValueError(f"quantize_native({t.name}): out must be uint8 {(rows, row_size(t, n))}, "
                         f"got {out.dtype} {out.shape}")
    bad = np.zeros(rows, np.uint8)
    if rows and half:  # converted to float32 a row at a time, in the kernel
        quantize_kernels().quantize_rows_f16(int(t), x.view(np.int16), qw, imatrix is not None, out, bad)
    elif rows:
        quantize_kernels().quantize_rows(int(t), x, qw, imatrix is not None, out, bad)
    if bad.any():
        r = int(np.argmax(bad))
        c = int(np.argmax(~np.isfinite(x[r])))
        raise ValueError(f"quantize_native({t.name}): x has a non-finite value ({x[r, c]} at row {r}, "
                         f"column {c}); block types cannot hold NaN or inf")
    return out


def _as_f32(a) -> np.ndarray:
    if hasattr(a, "detach"):  # a torch tensor
        a = a.detach().cpu().float().numpy()
    return np.asarray(a, dtype=np.float32)


def _as_f32_rows(x) -> np.ndarray:
    return _as_rows(_as_f32(x))


def _as_rows(x: np.ndarray) -> np.ndarray:
    if x.ndim == 1:
        x = x.reshape(1, -1)
    if x.ndim != 2:
        x = x.reshape(-1, x.shape[-1])
    return np.ascontiguousarray(x)
