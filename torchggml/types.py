"""ggml's type table: ids, names, block sizes, type sizes and torch dtypes."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import IntEnum

import torch


class Type(IntEnum):
    """ggml_type: the ids are ggml's (and GGUF's) on-disk ids."""
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41
    Q2_0 = 42


@dataclass(frozen=True)
class TypeTraits:
    name: str
    blck_size: int
    type_size: int
    dtype: torch.dtype | None  # torch dtype of one element for plain types; None for block types

    @property
    def is_quantized(self) -> bool:
        return self.dtype is None


# (block size, bytes per block) for block types; plain types have block size 1.
_TRAITS: dict[Type, TypeTraits] = {
    Type.F32: TypeTraits("f32", 1, 4, torch.float32),
    Type.F16: TypeTraits("f16", 1, 2, torch.float16),
    Type.BF16: TypeTraits("bf16", 1, 2, torch.bfloat16),
    Type.F64: TypeTraits("f64", 1, 8, torch.float64),
    Type.I8: TypeTraits("i8", 1, 1, torch.int8),
    Type.I16: TypeTraits("i16", 1, 2, torch.int16),
    Type.I32: TypeTraits("i32", 1, 4, torch.int32),
    Type.I64: TypeTraits("i64", 1, 8, torch.int64),
    Type.Q4_0: TypeTraits("q4_0", 32, 18, None),
    Type.Q4_1: TypeTraits("q4_1", 32, 20, None),
    Type.Q5_0: TypeTraits("q5_0", 32, 22, None),
    Type.Q5_1: TypeTraits("q5_1", 32, 24, None),
    Type.Q8_0: TypeTraits("q8_0", 32, 34, None),
    Type.Q8_1: TypeTraits("q8_1", 32, 36, None),
    Type.Q2_K: TypeTraits("q2_K", 256, 84, None),
    Type.Q3_K: TypeTraits("q3_K", 256, 110, None),
    Type.Q4_K: TypeTraits("q4_K", 256, 144, None),
    Type.Q5_K: TypeTraits("q5_K", 256, 176, None),
    Type.Q6_K: TypeTraits("q6_K", 256, 210, None),
    Type.Q8_K: TypeTraits("q8_K", 256, 292, None),
    Type.IQ2_XXS: TypeTraits("iq2_xxs", 256, 66, None),
    Type.IQ2_XS: TypeTraits("iq2_xs", 256, 74, None),
    Type.IQ2_S: TypeTraits("iq2_s", 256, 82, None),
    Type.IQ3_XXS: TypeTraits("iq3_xxs", 256, 98, None),
    Type.IQ3_S: TypeTraits("iq3_s", 256, 110, None),
    Type.IQ1_S: TypeTraits("iq1_s", 256, 50, None),
    Type.IQ1_M: TypeTraits("iq1_m", 256, 56, None),
    Type.IQ4_NL: TypeTraits("iq4_nl", 32, 18, None),
    Type.IQ4_XS: TypeTraits("iq4_xs", 256, 136, None),
    Type.TQ1_0: TypeTraits("tq1_0", 256, 54, None),
    Type.TQ2_0: TypeTraits("tq2_0", 256, 66, None),
    Type.MXFP4: TypeTraits("mxfp4", 32, 17, None),
    Type.NVFP4: TypeTraits("nvfp4", 64, 36, None),
    Type.Q1_0: TypeTraits("q1_0", 128, 18, None),
    Type.Q2_0: TypeTraits("q2_0", 64, 18, None),
}

_BY_DTYPE = {tr.dtype: t for t, tr in _TRAITS.items() if tr.dtype is not None}
_BY_DTYPE[torch.uint8] = Type.I8  # raw bytes are viewed as I8 when wrapped


def as_type(t) -> Type:
    """Accept a Type, its integer id or its name ("q4_0", "Q4_0")."""
    if isinstance(t, Type):
        return t
    if isinstance(t, str):
        try:
            return Type[t.upper()]
        except KeyError:
            raise ValueError(f"unknown ggml type name {t!r}") from None
    try:
        return Type(int(t))
    except ValueError:
        raise ValueError(f"unknown ggml type id {t!r}") from None


def type_traits(t) -> TypeTraits:
    return _TRAITS[as_type(t)]


def type_name(t) -> str:
    return type_traits(t).name


def type_size(t) -> int:
    return type_traits(t).type_size


def blck_size(t) -> int:
    return type_traits(t).blck_size


def is_quantized(t) -> bool:
    return type_traits(t).is_quantized


def type_to_dtype(t) -> torch.dtype:
    dtype = type_traits(t).dtype
    if dtype is None:
        raise TypeError(f"{type_name(t)} is a block type: it has no torch dtype (use raw uint8 blocks)")
    return dtype


def dtype_to_type(dtype: torch.dtype) -> Type:
    try:
        return _BY_DTYPE[dtype]
    except KeyError:
        raise TypeError(f"torch dtype {dtype} has no ggml type") from None


def row_size(t, ne: int) -> int:
    """Bytes of one row of `ne` elements (ggml_row_size)."""
    tr = type_traits(t)
    if ne % tr.blck_size:
        raise ValueError(f"row of {ne} elements is not a multiple of {tr.name}'s block size {tr.blck_size}")
    return tr.type_size * ne // tr.blck_size


@functools.lru_cache(maxsize=None)
def _has_float64(device_type: str) -> bool:
    try:
        torch.zeros((), dtype=torch.float64, device=device_type)
    except (RuntimeError, TypeError):
        return False
    return True


def wide_float(device: torch.device) -> torch.dtype:
    """The dtype for sums and angles on a torch device: float64 (ggml's ggml_float), or float32
    on a device type without float64 (MPS); asked of torch once per device type."""
    return torch.float64 if _has_float64(torch.device(device).type) else torch.float32
