"""What the case modules share: value generators for `init`, the torch-order equivalents of
ggml's permute and repeat, rounding a float64 reference to the output's type, and a
quantization round trip through the gguf package."""
from __future__ import annotations

import numpy as np
import torch

import torchggml as ggml

T = ggml.Type
FLOAT_TYPES = (T.F32, T.F16, T.BF16)


def torch_shape(t) -> tuple:
    return tuple(reversed(t.ne))


def uniform(lo: float, hi: float):
    """An `init` entry: uniform values in [lo, hi)."""
    def make(t, gen):
        return torch.rand(torch_shape(t), generator=gen, dtype=torch.float64) * (hi - lo) + lo
    return make


def randint(lo: int, hi: int):
    """An `init` entry: integers in [lo, hi)."""
    def make(t, gen):
        return torch.randint(lo, hi, torch_shape(t), generator=gen)
    return make


def distinct(t, gen):
    """An `init` entry: a random permutation of distinct values in [-1, 1) per tensor (no ties)."""
    n = t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]
    values = (torch.randperm(n, generator=gen).double() / n) * 2 - 1
    return values.reshape(torch_shape(t))


def rounded(type, x: torch.Tensor) -> torch.Tensor:
    """A float64 reference rounded to an F16/BF16 output's precision. ggml computes in float32
    and rounds once on store; comparing against the rounded exact value keeps thresholds tight
    (only values on a rounding boundary can differ, by one unit in the last place)."""
    if type in (T.F16, T.BF16):
        return x.to(ggml.type_to_dtype(type)).double()
    return x


def ggml_permute(x: torch.Tensor, axes) -> torch.Tensor:
    """torch-order values of ggml.permute(a, *axes): ggml dim i goes to dim axes[i]; torch dim
    3 - i is ggml dim i."""
    order = [0] * 4
    for i, ax in enumerate(axes):
        order[3 - ax] = 3 - i
    return x.permute(order)


def tile(b, like):
    return b.repeat(*[s // bs for s, bs in zip(like.shape, b.shape)])


def quantized_roundtrip(qtype, x: torch.Tensor, ne0: int | None = None) -> torch.Tensor:
    """x (float64, torch order) quantized to qtype in rows of ne0 values in element order and
    dequantized again, by the gguf package; for the types gguf cannot quantize (IQ4_NL, the K
    types, IQ4_XS, NVFP4, Q1_0, Q2_0) by torchggml.quants, which tests/test_quantize_ggml.py
    checks bit for bit against llama.cpp's quantizers. Values go through float32 first, as ggml's copy does."""
    import gguf
    rows = x.reshape(-1, ne0 or x.shape[-1]).float()
    try:
        gtype = gguf.GGMLQuantizationType(int(qtype))
        blocks = gguf.quants.quantize(rows.numpy(), gtype)
    except (NotImplementedError, ValueError):  # gguf cannot quantize the type, or does not know it
        from ...quants import dequantize, quantize
        out = dequantize(qtype, quantize(qtype, rows))
    else:
        out = torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(blocks, gtype)))
    return out.double().reshape(x.shape)
