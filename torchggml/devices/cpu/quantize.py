"""ggml's quantizers in native code (numba, rows in parallel): what llama-quantize writes, bit for
bit, with or without an importance matrix.

    quantize_native(qtype, x, imatrix=None)   float [rows, n] -> uint8 [rows, row_bytes]
    NATIVE_TYPES                              the types it writes

This is ggml_quantize_chunk's behaviour (ggml-quants.c's quantize_<type>), not the reference
quantize_row_*_ref that torchggml.quants.quantize follows: the two agree without an importance
matrix except for IQ4_NL (ggml_quantize_chunk searches 15 scales a block, the reference one).
The kernels are in jit/quantize_kernels.py, the IQ grid types' in jit/grid_quantize_kernels.py
(their search tables built here from the grids, as ggml's iq2xs_init_impl / iq3xs_init_impl do).
"""
from __future__ import annotations

import functools

import numpy as np

from ...types import Type, as_type, blck_size, row_size

NATIVE_TYPES = (Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1, Type.Q8_0, Type.Q2_K, Type.Q3_K, Type.Q4_K,
                Type.Q5_K, Type.Q6_K, Type.IQ4_NL, Type.IQ4_XS,
                Type.IQ2_XXS, Type.IQ2_XS, Type.IQ2_S, Type.IQ3_XXS, Type.IQ3_S, Type.IQ1_S, Type.IQ1_M)
# ggml's quantizers of these assert an importance matrix (ggml_quantize_requires_imatrix)
NEEDS_IMATRIX = (Type.IQ2_XXS, Type.IQ2_XS, Type.IQ1_S)
# per grid type: (its grid's table name, bits between levels in a key, key space, nwant: how many
# of the nearest distinct distances give a point off the grid its neighbours)
_GRIDS = {Type.IQ2_XXS: ("iq2xxs", 2, 43692, 2), Type.IQ2_XS: ("iq2xs", 2, 43692, 2),
          Type.IQ2_S: ("iq2s", 2, 43692, 1), Type.IQ3_XXS: ("iq3xxs", 3, 4096, 2),
          Type.IQ3_S: ("iq3s", 3, 4096, 3), Type.IQ1_S: ("iq1s", 2, 43692, 3), Type.IQ1_M: ("iq1s", 2, 43692, 3)}
_NO_IMATRIX = np.zeros(1, np.float32)
_NO_IMATRIX.flags.writeable = False


@functools.lru_cache(maxsize=None)
def grid_tables(t: Type):
    """(grid positions int8 [G, D], kmap, neighbours) of an IQ grid type: each grid value's rank
    among the grid's distinct values is its level l, held as 2l+1."""
    from ...quants.tables import table
    from .jit.loader import quantize_kernels  # noqa: F401  (the loader's compile notice)
    from .jit import grid_quantize_kernels as k
    name, shift, kmap_size, nwant = _GRIDS[t]
    values = table(name, "cpu").numpy()
    levels = np.unique(values)
    grid = (2 * np.searchsorted(levels, values) + 1).astype(np.int8)
    kmap, neighbours = k.build_grid_tables(grid, shift, kmap_size, nwant)
    return grid, kmap, neighbours


def quantize_native(qtype, x, imatrix=None, out: np.ndarray | None = None) -> np.ndarray:
    """x: float32-convertible [rows, n] (numpy or torch; a float16 numpy array is converted
    HALF_VALUES values at a time: the kernels are compiled for float32 rows only); imatrix: the mean squared activation of
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
    if imatrix is None and t in NEEDS_IMATRIX:
        raise ValueError(f"quantize_native({t.name}): {t.name} needs an importance matrix (imatrix), "
                         f"as ggml's quantizer does")
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
    # numba compiles a kernel per argument type, and a read-only array (a file's mapping) is
    # another type than a writable one: the inputs go in read-only always, so one compile serves
    qw = _read_only(qw)
    bad = np.zeros(rows, np.uint8)
    step = max(1, HALF_VALUES // n) if half else max(rows, 1)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        xf = _read_only(x[r0:r1].astype(np.float32) if half else x)
        if t in _GRIDS:
            from .jit import grid_quantize_kernels as k
            k.quantize_grid_rows(int(t), xf, qw, imatrix is not None, *grid_tables(t), out[r0:r1], bad[r0:r1])
        else:
            quantize_kernels().quantize_rows(int(t), xf, qw, imatrix is not None, out[r0:r1], bad[r0:r1])
    if bad.any():
        r = int(np.argmax(bad))
        c = int(np.argmax(~np.isfinite(x[r])))
        raise ValueError(f"quantize_native({t.name}): x has a non-finite value ({x[r, c]} at row {r}, "
                         f"column {c}); block types cannot hold NaN or inf")
    return out


HALF_VALUES = 1 << 20  # a float16 input's values converted to float32 at once


def _read_only(a: np.ndarray) -> np.ndarray:
    if not a.flags.writeable:
        return a
    view = a.view()
    view.flags.writeable = False
    return view


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
