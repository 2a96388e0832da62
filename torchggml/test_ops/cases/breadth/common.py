"""What the breadth families share: upstream's type lists (the types this torchggml has), a
case table per family, tensors made as views (upstream's `v` flag) and the reference helpers."""
from __future__ import annotations

import torch

import torchggml as ggml
from ..matmul import random_blocks
from ..table import CaseTable
from ..values import quantized_roundtrip, rounded
from ....types import type_traits

T = ggml.Type


def types_named(*names: str) -> tuple:
    """The named types this torchggml defines (upstream's lists name types still being added)."""
    return tuple(T[n] for n in names if n in T.__members__)


ALL_TYPES = types_named("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q1_0", "Q2_0", "MXFP4",
                        "NVFP4", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "TQ2_0", "IQ2_XXS", "IQ2_XS", "IQ2_S",
                        "IQ3_XXS", "IQ1_S", "IQ1_M", "IQ4_NL", "IQ3_S", "IQ4_XS")
BASE_TYPES = types_named("F32", "F16", "Q8_0", "Q1_0", "Q2_0", "Q4_0", "Q4_1", "Q4_K", "MXFP4", "NVFP4", "IQ2_XXS")
OTHER_TYPES = types_named("Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q1_0", "Q2_0", "Q2_K", "Q3_K", "Q5_K", "Q6_K", "TQ2_0",
                          "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ1_S", "IQ1_M", "IQ4_NL", "IQ3_S", "IQ4_XS", "BF16")
FLOAT_TYPES = (T.F32, T.F16, T.BF16)


def has(name: str) -> bool:
    """The builder exists in this torchggml (families of ops other branches add slot in)."""
    return hasattr(ggml, name)


def blck(type) -> int:
    return type_traits(type).blck_size


def block_init(type):
    """How a block-type input is filled: quantized from floats, or random blocks where torchggml
    cannot quantize the type."""
    from ....quants import quantize_types
    if not type_traits(type).is_quantized or type in quantize_types():
        return None
    return random_blocks


def inits(types_by_input: dict) -> dict:
    return {i: make for i, ty in types_by_input.items() if (make := block_init(ty)) is not None}


def stored(type, x: torch.Tensor) -> torch.Tensor:
    """float64 values as `type` stores them (rounded or quantized), read back as float64."""
    if type == T.F32:
        return x.float().double()
    if type in (T.F16, T.BF16):
        return rounded(type, x)
    if type in (T.I32, T.I16, T.I8, T.I64):
        return x
    return quantized_roundtrip(type, x)


def maybe_view(ctx, type, ne, v: bool):
    """(root, tensor): with v, the tensor is a view of the first ne[0] of 3*ne[0]-wide rows (upstream's
    non-contiguous variant); references read `root[..., :ne0]`."""
    if not v:
        t = ggml.new_tensor(ctx, type, list(ne))
        return t, t
    wide = [ne[0] * 3, *ne[1:]]
    root = ggml.new_tensor(ctx, type, wide)
    return root, ggml.view_4d(ctx, root, *ne, root.nb[1], root.nb[2], root.nb[3], 0)


def viewed(x: torch.Tensor, ne0: int, v: bool) -> torch.Tensor:
    return x[..., :ne0] if v else x


def new_table() -> CaseTable:
    return CaseTable()


def view_of_bigger(ctx, type, ne, mult):
    """(root, view): the view is the first ne of a root mult times as large per dim (upstream's
    strided variants); corner(root values, ne) is what the view reads."""
    root = ggml.new_tensor(ctx, type, [n * m for n, m in zip(ne, mult)])
    if all(m == 1 for m in mult):
        return root, root
    return root, ggml.view_4d(ctx, root, *ne, root.nb[1], root.nb[2], root.nb[3], 0)


def corner(x: torch.Tensor, ne) -> torch.Tensor:
    return x[:ne[3], :ne[2], :ne[1], :ne[0]]
