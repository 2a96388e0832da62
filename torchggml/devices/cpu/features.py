"""What this CPU can do, and which CPU product path runs (TORCHGGML_CPU_PATH overrides).

Paths for quantized MUL_MAT weights in the CPU's repack buffer:
    fused    numba-compiled fused dequantize-and-multiply over the (q, scale, bias) layout, every
             block type (layouts/fused.py); per micro-batch dequantize + torch GEMM for M >= 4.
    int4     torch's int4 weight-only GEMM (Q4_0/Q4_1/Q4_K only; the rest dequantize per call).
    dequant  no repacking: weights stay ggml blocks and are dequantized at every call.
`fused` is the default when numba imports, else `int4`.
"""
from __future__ import annotations

import functools
import os

import torch

from ... import config

PATHS = ("fused", "int4", "dequant")
PATH_ENV = "TORCHGGML_CPU_PATH"
GEMM_ENV = "TORCHGGML_CPU_GEMM"


def _torch_query(name: str) -> bool:
    fn = getattr(torch.cpu, name, None)
    try:
        return bool(fn()) if fn is not None else False
    except RuntimeError:
        return False


@functools.lru_cache(maxsize=None)
def cpu_features() -> dict[str, str]:
    """ggml-style feature flags ("1" where present) from torch's own capability queries."""
    feats = {"CPU_CAPABILITY": torch.backends.cpu.get_cpu_capability()}
    for flag, query in (("AVX2", "_is_avx2_supported"), ("AVX512", "_is_avx512_supported"),
                        ("AVX512_VNNI", "_is_vnni_supported"), ("AVX512_BF16", "_is_avx512_bf16_supported"),
                        ("AMX_INT8", "_is_amx_tile_supported"), ("AMX_FP16", "_is_amx_fp16_supported")):
        if _torch_query(query):
            feats[flag] = "1"
    if feats["CPU_CAPABILITY"] in ("SVE256", "SVE128", "SVE") or "arm" in os.uname().machine or "aarch64" in os.uname().machine:
        feats["NEON"] = "1"
        if feats["CPU_CAPABILITY"].startswith("SVE"):
            feats["SVE"] = "1"
    return feats


def _gemm_choice() -> str:
    choice = config.text(GEMM_ENV).strip().lower()
    if choice and choice not in ("f32", "bf16", "int8"):
        raise ValueError(f"{GEMM_ENV}={choice!r}: expected f32, bf16 or int8")
    return choice


def fastest_gemm_dtype() -> torch.dtype:
    """The dtype prompt products dequantize into: bf16 where the CPU multiplies it natively
    (AMX, AVX512-BF16: faster than float32), else
    float32 (AVX2's bf16/f16 GEMMs are slower than converting). TORCHGGML_CPU_GEMM=f32|bf16
    overrides."""
    choice = _gemm_choice()
    feats = cpu_features()
    native = "AMX_INT8" in feats or "AVX512_BF16" in feats
    return torch.bfloat16 if choice == "bf16" or (choice in ("", "int8") and native) else torch.float32


def int8_gemm() -> bool:
    """Whether prompts multiply Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K weights (ggml's blocks in place) with the int8
    GEMM (jit/gemm_kernels.py, ggml's per-block scales; faster than the bf16 path):
    where numba's target has AVX512-VNNI, AVX-VNNI or AVX2 (jit/gemm_ir.gemm_isa), unless
    TORCHGGML_CPU_GEMM=f32|bf16 asks for the float GEMM (=int8 asks for it and fails without
    the instructions)."""
    choice = _gemm_choice()
    if choice in ("f32", "bf16"):
        return False
    from .jit.gemm_ir import gemm_available
    from .jit.loader import numba_available
    available = numba_available() and gemm_available()
    if choice == "int8" and not available:
        raise ValueError(f"{GEMM_ENV}=int8 needs numba and an x86 CPU with AVX2 (or AVX512-VNNI, AVX-VNNI)")
    return available


def int8_gemm_takes(kind: int) -> bool:
    """Whether the int8 GEMM multiplies blocks of this in-place kind (their bytes: 34 Q8_0...):
    where it runs (int8_gemm) and gains on this CPU (jit/gemm_ir.gains), or is asked for."""
    if not int8_gemm():
        return False
    from .jit.gemm_ir import gains, gemm_isa
    return _gemm_choice() == "int8" or gains(kind, gemm_isa())


def default_path() -> str:
    from .jit.loader import numba_available
    return "fused" if numba_available() else "int4"


def cpu_path() -> str:
    """The product path: TORCHGGML_CPU_PATH if set (checked), else the default for this CPU."""
    path = config.text(PATH_ENV).strip().lower()
    if not path:
        return default_path()
    if path not in PATHS:
        raise ValueError(f"{PATH_ENV}={path!r}: expected one of {', '.join(PATHS)}")
    if path == "fused":
        from .jit.loader import numba_available
        if not numba_available():
            raise ValueError(f"{PATH_ENV}=fused needs numba (pip install numba)")
    return path
