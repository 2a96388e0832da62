"""Ahead-of-time compilation of every kernel and autotune config for NVIDIA targets, without a GPU.

Triton compiles for an explicit target (`GPUTarget("cuda", 80 or 90, 32)`) with the ptxas its
wheel ships, so a machine with no GPU can check what a GPU would run: that every config
compiles, and its registers, spills (local memory) and shared memory per program.

    specs(types)            the (kernel, variant, config) combinations the wrappers can launch
    compile_spec(spec, cc)  -> Report: registers, spill bytes, shared memory, compile seconds
    ARCH_LIMITS             per compute capability: shared memory per block (opt-in), registers

Import this module without TRITON_INTERPRET=1: the interpreter has no compiler, and our
kernels keep only one small config under it (see `_common.BUILT_FOR_INTERPRETER`).
Integers are compiled as i32 without divisibility hints (what a launch with odd sizes gets).
"""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import tempfile
import time

import triton

from torchggml.types import Type

from . import _common as c
from . import dequant, matmul

# shared memory per block (opt-in maximum) and registers per thread, by compute capability
ARCH_LIMITS = {80: {"shared": 163 * 1024, "registers": 255}, 90: {"shared": 227 * 1024, "registers": 255}}


@dataclasses.dataclass(frozen=True)
class Spec:
    """One compilation: a kernel, a variant of its non-tuned arguments, one autotune config."""
    kernel: str                 # name in KERNELS
    variant: str                # e.g. "Q4_0 M=1 x=fp32"
    signature: tuple            # ((arg name, "*u8" | "i32" | "constexpr"), ...)
    constants: tuple            # ((arg name, value), ...) every constexpr, heuristics included
    num_warps: int
    num_stages: int

    @property
    def config(self) -> str:
        tuned = {k: v for k, v in self.constants if k.startswith("BLOCK_") or k == "GROUP_M"}
        return ",".join(f"{k}={v}" for k, v in tuned.items()) + f",w{self.num_warps},s{self.num_stages}"


@dataclasses.dataclass
class Report:
    spec: Spec
    arch: int
    registers: int
    spill_bytes: int            # local memory per thread (register spills and stack)
    shared: int                 # bytes of shared memory per program
    seconds: float

    def problems(self) -> list[str]:
        limits = ARCH_LIMITS[self.arch]
        out = []
        if self.spill_bytes:
            out.append(f"spills {self.spill_bytes} bytes to local memory")
        if self.shared > limits["shared"]:
            out.append(f"needs {self.shared} bytes of shared memory (sm_{self.arch} limit {limits['shared']})")
        if self.registers > limits["registers"]:
            out.append(f"uses {self.registers} registers (limit {limits['registers']})")
        return out


def jit_function(kernel):
    """The JITFunction under autotune/heuristics wrappers."""
    fn = kernel
    while not isinstance(fn, triton.runtime.JITFunction):
        fn = fn.fn
    return fn


KERNELS = {
    "dequantize_rows": dequant._dequantize_rows_kernel,
    "matvec": matmul._matvec_kernel,
    "gemm": matmul._gemm_kernel,
    "mul_mat_id": matmul._mul_mat_id_kernel,
}


def _configs(kernel):
    return list(kernel.configs)


def _heuristics(kernel) -> dict:
    """The heuristics' functions under the autotuner (name -> fn(args))."""
    fn = kernel.fn if isinstance(kernel, triton.runtime.Autotuner) else kernel
    return dict(fn.values) if isinstance(fn, triton.runtime.Heuristics) else {}


def _pointer(dtype: str) -> str:
    return "*" + dtype


def _spec(name: str, variant: str, pointers: dict, constexprs: dict, config) -> Spec:
    kernel = KERNELS[name]
    jit = jit_function(kernel)
    constants = dict(constexprs, **config.kwargs)
    for key, fn in _heuristics(kernel).items():
        constants[key] = fn(constants)
    signature = []
    for i, arg in enumerate(jit.arg_names):
        if jit.params[i].is_constexpr:
            if arg not in constants:
                raise KeyError(f"{name}: no value for constexpr {arg}")
            signature.append((arg, "constexpr"))
        else:
            signature.append((arg, _pointer(pointers[arg]) if arg in pointers else "i32"))
    return Spec(name, variant, tuple(signature), tuple((a, constants[a]) for a, s in signature if s == "constexpr"),
                config.num_warps, config.num_stages)


def _pruned(kernel, configs, **named):
    prune = kernel.early_config_prune if isinstance(kernel, triton.runtime.Autotuner) else None
    return prune(configs, named) if prune else configs


def specs(types=(Type.Q4_0,), x_dtypes=("fp32", "bf16")) -> list[Spec]:
    """Every kernel x variant x autotune config the wrappers launch for these weight types
    (the x dtypes fp32 and bf16 select the fp16 and bf16 tensor-core paths)."""
    out = []
    for qtype in types:
        qk, ts = c.block_shape(qtype)
        base = {"QTYPE": int(qtype), "QK": qk, "TS": ts}
        kern = KERNELS["dequantize_rows"]
        for has_ids, out_dtype in ((False, "fp16"), (True, "fp32")):
            ptrs = {"src": "u8", "ids": "i32" if has_ids else "u8", "out": out_dtype}
            for cfg in _configs(kern):
                out.append(_spec("dequantize_rows", f"{qtype.name} {'get_rows' if has_ids else 'dequantize'}",
                                 ptrs, dict(base, HAS_IDS=has_ids), cfg))
        for x_dtype, dot in (("fp32", matmul.DOT_F16), ("bf16", matmul.DOT_BF16)):
            if x_dtype not in x_dtypes:
                continue
            ptrs = {"w_ptr": "u8", "x_ptr": x_dtype, "out_ptr": "fp32"}
            kern = KERNELS["matvec"]
            for block_m in (1, matmul.MATVEC_MAX_M):
                if block_m == 1 and x_dtype != "fp32":
                    continue  # M == 1 converts x to fp32 first: one variant covers both
                for cfg in _pruned(kern, _configs(kern), BLOCK_M=block_m, QTYPE=int(qtype)):
                    out.append(_spec("matvec", f"{qtype.name} M={'1' if block_m == 1 else '2..16'} x={x_dtype}",
                                     ptrs, dict(base, DOT=dot, BLOCK_M=block_m), cfg))
            kern = KERNELS["gemm"]
            for cfg in _pruned(kern, _configs(kern), QTYPE=int(qtype)):
                out.append(_spec("gemm", f"{qtype.name} x={x_dtype}", ptrs, dict(base, DOT=dot), cfg))
        kern = KERNELS["mul_mat_id"]
        ptrs = {"w_ptr": "u8", "x_ptr": "fp32", "ids_ptr": "i32", "order_ptr": "i64", "out_ptr": "fp32"}
        for cfg in _pruned(kern, _configs(kern), QTYPE=int(qtype)):
            out.append(_spec("mul_mat_id", f"{qtype.name}", ptrs, dict(base, SORTED=True), cfg))
    return out


def _tool(name: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def _resources(cubin: bytes, kernel_name: str) -> tuple[int, int, int]:
    """(registers, local bytes, static shared bytes) from cuobjdump --dump-resource-usage."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", f.name],
                              capture_output=True, text=True, check=True).stdout
    line = next((ln for ln in text.splitlines() if "REG:" in ln), None)
    if line is None:
        raise RuntimeError(f"cuobjdump printed no resource usage for {kernel_name}: {text!r}")
    fields = dict(re.findall(r"(\w+(?:\[\d+\])?):(\d+)", line))
    return int(fields["REG"]), int(fields.get("LOCAL", 0)) + int(fields.get("STACK", 0)), int(fields.get("SHARED", 0))


def toolchain_problem() -> str | None:
    """Why AOT compilation cannot run here (None when it can)."""
    if c.BUILT_FOR_INTERPRETER:
        return "torchggml/devices/triton was imported under TRITON_INTERPRET=1 (no compiler, interpreter configs)"
    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
    except ImportError as e:
        return f"this triton ({triton.__version__}) has no GPUTarget/ASTSource: {e}"
    for tool in ("ptxas", "cuobjdump"):
        if not os.access(_tool(tool), os.X_OK):
            return f"triton's wheel ships no {tool} at {_tool(tool)}"
    return None


def _source(spec: Spec):
    """An ASTSource for the spec: triton >= 3.2 takes names and (index,) keys; older ones
    take indices."""
    from triton.compiler import ASTSource
    jit = jit_function(KERNELS[spec.kernel])
    constants = dict(spec.constants)
    index = {name: i for i, name in enumerate(jit.arg_names)}
    try:
        return ASTSource(jit, dict(spec.signature), constexprs={(index[k],): v for k, v in constants.items()})
    except TypeError:  # triton 3.0/3.1: signature by index, constants by index
        sig = {index[a]: s for a, s in spec.signature if s != "constexpr"}
        return ASTSource(jit, sig, constants={index[k]: v for k, v in constants.items()})


def compile_spec(spec: Spec, arch: int) -> Report:
    from triton.backends.compiler import GPUTarget
    t0 = time.perf_counter()
    compiled = triton.compile(_source(spec), target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": spec.num_warps, "num_stages": spec.num_stages})
    registers, local, static_shared = _resources(compiled.asm["cubin"], spec.kernel)
    shared = max(int(getattr(compiled.metadata, "shared", 0)), static_shared)
    return Report(spec, arch, registers, local, shared, time.perf_counter() - t0)
