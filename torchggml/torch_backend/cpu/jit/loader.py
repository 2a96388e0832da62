"""The CPU's numba kernels, under one loader: each kernel module is imported on first use (so
numba loads only when a kernel first runs), its functions compiled for this CPU per argument
types and cached on disk by numba.

    quant_kernels()    the fused quantized products over the (q, scale, bias) layouts
                       (quant_kernels.py: matvec, quantize_rows, dequantize_*)
    op_kernels()       decode's small nodes (op_kernels.py: norms, softmax, rope, copies...)
"""
from __future__ import annotations

import functools
import importlib


def numba_available() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def set_numba_threads(n: int) -> None:
    """numba's worker count, capped at the pool it started with."""
    import numba
    numba.set_num_threads(max(1, min(int(n), numba.config.NUMBA_NUM_THREADS)))


@functools.lru_cache(maxsize=None)
def _load(name: str):
    return importlib.import_module(f"{__package__}.{name}")


def quant_kernels():
    """The fused products' kernels (quant_kernels.py)."""
    return _load("quant_kernels")


def op_kernels():
    """The small nodes' kernels (op_kernels.py)."""
    return _load("op_kernels")
