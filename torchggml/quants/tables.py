"""Lookup tables of the block formats, built once per torch device.

The big IQ grids come from the gguf package (it ships them, hex-packed, and expands them in
`init_grid`); the small tables are computed here. Every table is a tensor cached per
(name, device), so the hot paths only index.
"""
from __future__ import annotations

import functools

import numpy as np
import torch

# Non-linear 4-bit values of IQ4_NL / IQ4_XS (ggml's kvalues_iq4nl).
IQ4NL_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)

# e2m1 (fp4) values, doubled so they are integers; the block scale carries the half.
MXFP4_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)

# gguf.quants class name of each IQ grid.
_GRID_SOURCES = {
    "iq2xxs": "IQ2_XXS",   # 256 x 8
    "iq2xs": "IQ2_XS",     # 512 x 8
    "iq2s": "IQ2_S",       # 1024 x 8
    "iq3xxs": "IQ3_XXS",   # 256 x 4
    "iq3s": "IQ3_S",       # 512 x 4
    "iq1s": "IQ1_S",       # 2048 x 8 (values -1, 0, 1)
}


def _grid_from_gguf(name: str) -> np.ndarray:
    try:
        import gguf.quants
        quant = getattr(gguf.quants, _GRID_SOURCES[name])
    except (ImportError, AttributeError) as e:
        raise RuntimeError(f"the {name} grid comes from the gguf package, which lacks it "
                           f"(install a recent gguf): {e}") from None
    quant.init_grid()
    return np.asarray(quant.grid, dtype=np.float32).reshape(quant.grid_shape)


def _sign_bits() -> np.ndarray:
    """[256, 8] float32: -1 where bit j of the byte is set, else +1."""
    byte = np.arange(256).reshape(-1, 1)
    bits = (byte >> np.arange(8).reshape(1, -1)) & 1
    return np.where(bits == 1, -1.0, 1.0).astype(np.float32)


def _ksigns() -> np.ndarray:
    """ggml's ksigns_iq2xs: 7 stored sign bits plus an 8th that makes the parity even."""
    i = np.arange(128)
    parity = np.array([bin(v).count("1") & 1 for v in range(128)])
    return (i | (parity << 7)).astype(np.uint8)


def _build(name: str) -> np.ndarray:
    if name in _GRID_SOURCES:
        return _grid_from_gguf(name)
    if name == "sign_bits":
        return _sign_bits()
    if name == "ksigns":
        return _ksigns()
    if name == "ksign_bits":  # ksigns expanded to +-1 per bit: [128, 8]
        return _sign_bits()[_ksigns()]
    if name == "iq4nl":
        return np.array(IQ4NL_VALUES, dtype=np.float32)
    if name == "mxfp4":
        return np.array(MXFP4_VALUES, dtype=np.float32)
    raise KeyError(f"no lookup table named {name!r}")


@functools.lru_cache(maxsize=None)
def _host_table(name: str) -> torch.Tensor:
    return torch.from_numpy(_build(name))


@functools.lru_cache(maxsize=None)
def _device_table(name: str, device: torch.device) -> torch.Tensor:
    return _host_table(name).to(device)


def table(name: str, device: torch.device) -> torch.Tensor:
    """The named table on `device` (built on first use, then cached)."""
    return _device_table(name, torch.device(device))
