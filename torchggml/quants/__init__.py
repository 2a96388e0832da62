"""Reference quantize / dequantize of ggml's types in vectorised torch.

    dequantize(qtype, blocks)  uint8 [..., row_bytes]  -> float32 [..., n_values]
    quantize(qtype, x)         float  [..., n_values]  -> uint8 [..., row_bytes]

Both run on the input's device. dequantize equals the gguf package's `gguf.quants` bit for
bit (Q8_1 and Q8_K, which gguf lacks, follow ggml's block definitions). quantize equals
llama.cpp's quantize_row_*_ref bit for bit for every type it accepts, and so gguf's
quantizers where gguf has one; the searching quantizers (K types, IQ4) keep C's float32
evaluation order for that (_c_order). This is the CPU path of torchggml and the oracle the
Triton kernels are tested against.
"""
from __future__ import annotations

import torch

from ..types import Type, as_type, type_traits
from . import iquants, kquants, legacy, lowbit, mxfp4, ternary
from .plain import PLAIN_DTYPES, dequantize_plain, quantize_plain

__all__ = ["dequantize", "quantize", "dequantize_types", "quantize_types"]

_DEQUANTIZE = {**legacy.DEQUANTIZE, **kquants.DEQUANTIZE, **iquants.DEQUANTIZE,
               **ternary.DEQUANTIZE, **mxfp4.DEQUANTIZE, **lowbit.DEQUANTIZE}
_QUANTIZE = {**legacy.QUANTIZE, **kquants.QUANTIZE, **iquants.QUANTIZE,
             **ternary.QUANTIZE, **mxfp4.QUANTIZE, **lowbit.QUANTIZE}


def dequantize_types() -> list[Type]:
    """Every type `dequantize` accepts."""
    return sorted([*PLAIN_DTYPES, *_DEQUANTIZE])


def quantize_types() -> list[Type]:
    """Every type `quantize` accepts."""
    return sorted([*PLAIN_DTYPES, *_QUANTIZE])


def _resolve(qtype, table: dict, what: str) -> Type:
    t = as_type(qtype)  # ValueError for unknown ids and names
    if t not in table and t not in PLAIN_DTYPES:
        raise ValueError(f"{what} does not support type {t.name}")
    return t


def _check_tensor(x, name: str, what: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what}: {name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 0:
        raise ValueError(f"{what}: {name} must have at least one dimension (rows are the last)")


def dequantize(qtype, blocks: torch.Tensor) -> torch.Tensor:
    """Blocks of `qtype` (a Type, id or name), uint8 [..., row_bytes] -> float32 [..., n].

    For F32/F16/BF16 `blocks` may also be a tensor of the type's own dtype [..., n].
    """
    t = _resolve(qtype, _DEQUANTIZE, "dequantize")
    _check_tensor(blocks, "blocks", "dequantize")
    traits = type_traits(t)
    if t in PLAIN_DTYPES and blocks.dtype == PLAIN_DTYPES[t]:
        return dequantize_plain(t, blocks)
    if blocks.dtype != torch.uint8:
        raise TypeError(f"dequantize({t.name}): blocks must be uint8 bytes, got {blocks.dtype}")
    row_bytes = blocks.shape[-1]
    if row_bytes % traits.type_size:
        raise ValueError(f"dequantize({t.name}): row of {row_bytes} bytes is not a whole number "
                         f"of {traits.type_size}-byte blocks (blocks shape {tuple(blocks.shape)})")
    n_values = row_bytes // traits.type_size * traits.blck_size
    if t in PLAIN_DTYPES:
        return dequantize_plain(t, blocks)
    out_shape = (*blocks.shape[:-1], n_values)
    if blocks.numel() == 0:
        return torch.empty(out_shape, dtype=torch.float32, device=blocks.device)
    return _DEQUANTIZE[t](blocks.reshape(-1, traits.type_size)).reshape(out_shape)


def quantize(qtype, x: torch.Tensor) -> torch.Tensor:
    """Floating values [..., n] -> blocks of `qtype` (a Type, id or name), uint8 [..., row_bytes].

    Values are first converted to float32, as gguf does; n must be a multiple of the block size.
    """
    t = _resolve(qtype, _QUANTIZE, "quantize")
    _check_tensor(x, "x", "quantize")
    if not x.is_floating_point():
        raise TypeError(f"quantize({t.name}): x must be a floating-point tensor, got {x.dtype}")
    traits = type_traits(t)
    n = x.shape[-1]
    if n % traits.blck_size:
        raise ValueError(f"quantize({t.name}): row of {n} values is not a multiple of the block "
                         f"size {traits.blck_size} (x shape {tuple(x.shape)})")
    x = x.float()
    if t in PLAIN_DTYPES:
        return quantize_plain(t, x)
    finite = torch.isfinite(x)
    if not bool(finite.all()):  # a block's scale would be NaN/inf and every value of it lost
        bad = tuple(int(i) for i in (~finite).nonzero()[0])
        raise ValueError(f"quantize({t.name}): x has a non-finite value ({float(x[bad])} at index {bad}); "
                         f"block types cannot hold NaN or inf")
    out_shape = (*x.shape[:-1], n // traits.blck_size * traits.type_size)
    if x.numel() == 0:
        return torch.empty(out_shape, dtype=torch.uint8, device=x.device)
    return _QUANTIZE[t](x.reshape(-1, traits.blck_size)).reshape(out_shape)
