"""Argument checks shared by the kernel wrappers, and the table of types the kernels decode."""
from __future__ import annotations

import functools
import os

import torch
import triton.language as tl

from torchggml.types import Type, as_type, type_traits

# Triton picks the interpreter or the compiler when a kernel is decorated, i.e. when this
# package is imported: remember which one our kernels were built for.
BUILT_FOR_INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"

# Priority order of the task; every one has a decoder in decode.py.
SUPPORTED_TYPES: tuple[Type, ...] = (
    Type.Q4_0, Type.Q8_0, Type.Q4_K, Type.Q6_K, Type.Q5_K, Type.Q4_1, Type.Q5_0, Type.Q5_1,
    Type.Q2_K, Type.Q3_K, Type.IQ4_NL, Type.IQ4_XS, Type.MXFP4, Type.TQ1_0, Type.TQ2_0,
    Type.F16, Type.BF16,
)

X_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


def supports(qtype) -> bool:
    """True when the kernels here decode `qtype` (a Type, its id or its name)."""
    try:
        return as_type(qtype) in SUPPORTED_TYPES
    except (ValueError, TypeError):
        return False


def check_qtype(qtype) -> Type:
    if not isinstance(qtype, (Type, int, str)):
        raise TypeError(f"qtype must be a torchggml.Type or its int id, got {type(qtype).__name__}")
    t = as_type(qtype)
    if t not in SUPPORTED_TYPES:
        raise ValueError(f"type {t.name} is not supported by torchggml/devices/triton "
                         f"(supported: {', '.join(s.name for s in SUPPORTED_TYPES)})")
    return t


def triton_interprets() -> bool:
    """Whether triton itself (its jit'd standard library, tl.zeros, tl.sum...) was imported
    for the interpreter."""
    return type(tl.zeros).__name__ == "InterpretedFunction"


def interpreting() -> bool:
    """True when kernels run in Triton's CPU interpreter; refuses a half-switched setup."""
    wanted = os.environ.get("TRITON_INTERPRET") == "1"
    if wanted != BUILT_FOR_INTERPRETER or wanted != triton_interprets():
        raise RuntimeError(
            "TRITON_INTERPRET=1 must be set before triton is first imported, and kept: "
            f"now {wanted}, torchggml/devices/triton built for the interpreter: {BUILT_FOR_INTERPRETER}, "
            f"triton imported for it: {triton_interprets()}")
    return wanted


def check_tensor(name: str, t, dtypes, ndim: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} has dtype {t.dtype}; expected one of {', '.join(map(str, dtypes))}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    return t


@functools.lru_cache(maxsize=None)
def compiled_device_type() -> str | None:
    """The torch device type Triton's active driver compiles for ("cuda" for NVIDIA and AMD),
    or None where no driver is active (no GPU)."""
    try:
        from triton.runtime.driver import driver
        active = driver.active
        if hasattr(active, "get_active_torch_device"):
            return active.get_active_torch_device().type
        # triton before 3.2: the target's backend; ROCm's torch calls its GPUs "cuda" too
        backend = active.get_current_target().backend
        return "cuda" if backend in ("cuda", "hip") else backend
    except Exception:  # noqa: BLE001 - no usable driver
        return None


def runs_on(device: torch.device) -> bool:
    """The kernels run on memory of the driver's device type, and on CPU memory in the
    interpreter."""
    return device.type == compiled_device_type() or (device.type == "cpu" and interpreting())


def check_device(**tensors: torch.Tensor) -> torch.device:
    """All tensors on one device the kernels run on (see runs_on)."""
    devices = {t.device for t in tensors.values()}
    if len(devices) != 1:
        where = ", ".join(f"{n} on {t.device}" for n, t in tensors.items())
        raise ValueError(f"tensors must be on one device: {where}")
    device = devices.pop()
    if runs_on(device):
        return device
    names = ", ".join(tensors)
    raise ValueError(f"{names} on {device}: torchggml/devices/triton needs tensors on its GPU "
                     f"({compiled_device_type() or 'none found'}; CPU tensors only with TRITON_INTERPRET=1)")


def check_blocks(qtype: Type, blocks, ndim: int = 2) -> tuple[int, int]:
    """Validate raw ggml rows (uint8, last dim contiguous); return (type size, values per row)."""
    check_tensor("blocks", blocks, (torch.uint8,), ndim)
    traits = type_traits(qtype)
    row_bytes = blocks.shape[-1]
    if row_bytes == 0 or row_bytes % traits.type_size:
        raise ValueError(f"blocks rows have {row_bytes} bytes: not a positive multiple of the "
                         f"{qtype.name} block size ({traits.type_size} bytes)")
    if blocks.stride(-1) != 1:
        raise ValueError(f"blocks rows must be contiguous (stride {blocks.stride()})")
    if not traits.is_quantized and (blocks.data_ptr() % 2 or any(s % 2 for s in blocks.stride()[:-1])):
        raise ValueError(f"{qtype.name} rows must be 2-byte aligned")
    return traits.type_size, row_bytes // traits.type_size * traits.blck_size


def block_shape(qtype: Type) -> tuple[int, int]:
    """(values per block, bytes per block): the QK and TS constexprs of the kernels."""
    traits = type_traits(qtype)
    return traits.blck_size, traits.type_size


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()
