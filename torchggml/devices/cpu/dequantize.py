"""ggml's block types to float32 in native code (numba, rows in parallel): what the requantize
path reads a quantized tensor through, bit-identical to `gguf.quants.dequantize`.

    dequantize_native(qtype, raw, out=None)   uint8 [rows, row_bytes] -> float32 [rows, n]
    DEQUANTIZE_TYPES                          the types it reads

The kernels are in jit/dequantize_kernels.py.
"""
from __future__ import annotations

import functools

import numpy as np

from ...types import Type, as_type, blck_size, row_size

DEQUANTIZE_TYPES = (Type.F16, Type.BF16, Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1, Type.Q8_0, Type.Q2_K,
                    Type.Q3_K, Type.Q4_K, Type.Q5_K, Type.Q6_K, Type.IQ4_NL, Type.IQ4_XS, Type.TQ1_0, Type.TQ2_0,
                    Type.MXFP4, Type.IQ2_XXS, Type.IQ2_XS, Type.IQ2_S, Type.IQ3_XXS, Type.IQ3_S, Type.IQ1_S,
                    Type.IQ1_M)
_GRIDS = {Type.IQ2_XXS: "iq2xxs", Type.IQ2_XS: "iq2xs", Type.IQ2_S: "iq2s", Type.IQ3_XXS: "iq3xxs",
          Type.IQ3_S: "iq3s", Type.IQ1_S: "iq1s", Type.IQ1_M: "iq1s"}


@functools.lru_cache(maxsize=None)
def _grid(t: Type) -> np.ndarray:
    if t not in _GRIDS:
        return np.zeros((1, 8), np.float32)
    from ...quants.tables import table
    return np.ascontiguousarray(table(_GRIDS[t], "cpu").numpy())


def dequantize_native(qtype, raw: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """raw: a tensor's rows as bytes, uint8 [rows, row_size(qtype, n)] (a read-only mapping is
    fine); returns float32 [rows, n] (written into `out` when given)."""
    from .jit.loader import dequantize_kernels
    t = as_type(qtype)
    if t not in DEQUANTIZE_TYPES:
        raise ValueError(f"dequantize_native: no native dequantizer for {t.name}; "
                         f"these have one: {', '.join(q.name for q in DEQUANTIZE_TYPES)}")
    if raw.ndim != 2 or raw.dtype != np.uint8:
        raise ValueError(f"dequantize_native({t.name}): raw must be uint8 [rows, row bytes], got {raw.dtype} "
                         f"{raw.shape}")
    n = raw.shape[1] // row_size(t, blck_size(t)) * blck_size(t)
    if row_size(t, n) != raw.shape[1]:
        raise ValueError(f"dequantize_native({t.name}): a row of {raw.shape[1]} bytes is not whole blocks")
    if out is None:
        out = np.empty((raw.shape[0], n), np.float32)
    elif out.shape != (raw.shape[0], n) or out.dtype != np.float32:
        raise ValueError(f"dequantize_native({t.name}): out must be float32 {(raw.shape[0], n)}, "
                         f"got {out.dtype} {out.shape}")
    if raw.shape[0]:
        dequantize_kernels().dequantize_rows(int(t), raw, _grid(t), out)
    return out
