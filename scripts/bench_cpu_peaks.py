#!/usr/bin/env python
"""What bounds the CPU's prompts and decode on this machine: the arithmetic peaks and the read
bandwidth, beside the rates the GEMMs reach, and what they allow a model of a given shape.

    python scripts/bench_cpu_peaks.py [-t THREADS] [--shape 1b|small] [-m 128]

Peaks (numba + LLVM IR, 12 independent 512-bit chains a thread, registers only, every thread):
  fp32 FMA     vfmadd 16 lanes: 2 flops a lane (the F16 prompt GEMM's arithmetic, as llama.cpp's)
  int8 dot     vpdpbusd (AVX512-VNNI): 64 byte products a vector, 2 ops each (the int8 GEMM's)
GEMMs, M x K x N as the model's largest product (FFN: M rows by 2048 x 5632 on the 1b shape):
  torchggml int8 (Q4_0 blocks in place), torchggml F16 (numba tiles), oneDNN bf16 and f32 (torch.mm)
Read bandwidth: a sum over 1 GiB of huge pages (decode streams every weight once a token).
Then, per shape: the prompt tokens/s each peak allows (2 x parameters ops a token, the
attention's left out: an upper bound) and the decode tokens/s the bandwidth allows per weight type.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench_cpu_quant import best_of  # noqa: E402  (best of several runs after a warm-up)

CHAINS = 12       # independent accumulators a thread (hides the instructions' latency)
STEPS = 1 << 22   # loop iterations a measurement


def _peak_kernels():
    from llvmlite import ir
    from numba import njit, prange, types
    from numba.core import cgutils
    from numba.extending import intrinsic

    f32, i32 = ir.FloatType(), ir.IntType(32)

    def chains(op_type, step):
        @intrinsic
        def loop(typingctx, seed, n):
            def codegen(context, builder, sig, args):
                seed_ptr = context.make_array(sig.args[0])(context, builder, args[0]).data
                vec = ir.VectorType(op_type, 16)
                first = builder.load(builder.bitcast(seed_ptr, vec.as_pointer()), align=4)
                other = builder.load(builder.bitcast(builder.gep(seed_ptr, [ir.Constant(ir.IntType(64), 16)]),
                                                     vec.as_pointer()), align=4)
                accs = [cgutils.alloca_once_value(builder, first) for _ in range(CHAINS)]
                with cgutils.for_range(builder, args[1]):
                    for acc in accs:
                        builder.store(step(builder, builder.load(acc), first, other), acc)
                total = builder.load(accs[0])
                for acc in accs[1:]:
                    total = builder.add(total, builder.load(acc)) if op_type == i32 else builder.fadd(total, builder.load(acc))
                lane = builder.extract_element(total, ir.Constant(i32, 0))
                return builder.sitofp(lane, ir.DoubleType()) if op_type == i32 else builder.fpext(lane, ir.DoubleType())
            return types.float64(seed, n), codegen
        return loop

    def fma(builder, acc, a, b):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(a.type, [a.type] * 3), "llvm.fma.v16f32")
        return builder.call(fn, [a, b, acc])

    def dpbusd(builder, acc, a, b):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(a.type, [a.type] * 3),
                                            "llvm.x86.avx512.vpdpbusd.512")
        return builder.call(fn, [acc, a, b])

    kernels = {}
    for name, op_type, step in (("fp32 FMA", f32, fma), ("int8 dot", i32, dpbusd)):
        loop = chains(op_type, step)

        @njit(parallel=True, nogil=True)
        def run(seeds, n, loop=loop):
            out = np.zeros(seeds.shape[0])
            for t in prange(seeds.shape[0]):
                out[t] = loop(seeds[t], n)
            return out
        kernels[name] = run
    return kernels


# ops a 16-lane instruction does: FMA 16 x 2 flops, vpdpbusd 64 byte products x 2
OPS_PER_INSTRUCTION = {"fp32 FMA": 32, "int8 dot": 128}


def peaks(threads: int) -> dict[str, float]:
    """GOP/s of each peak kernel on `threads` threads (one loop each)."""
    import numba
    from torchggml.devices.cpu.jit.gemm_ir import gemm_available
    numba.set_num_threads(threads)
    result = {}
    for name, run in _peak_kernels().items():
        if name == "int8 dot" and not gemm_available():
            continue
        seeds = np.ones((threads, 32), np.float32 if name == "fp32 FMA" else np.int32)
        run(seeds, 16)
        start = time.perf_counter()
        run(seeds, STEPS)
        seconds = time.perf_counter() - start
        result[name] = threads * STEPS * CHAINS * OPS_PER_INSTRUCTION[name] / seconds / 1e9
    return result


def gemm_rates(m: int, k: int, n: int) -> dict[str, float]:
    """GOP/s of the prompt GEMMs at m x k x n (2 m k n ops)."""
    from torchggml.quants import quantize
    from torchggml.devices.cpu.features import int8_gemm
    from torchggml.devices.cpu.jit.loader import op_kernels
    from torchggml.devices.cpu.layouts import fused
    from torchggml.types import Type
    ops = 2 * m * k * n / 1e9
    x = torch.randn(m, k)
    out = torch.empty(m, n)
    weight = torch.randn(n, k)
    rates = {}
    if int8_gemm():
        blocks = quantize(Type.Q4_0, weight).view(torch.uint8).reshape(n, -1)
        packed = fused._Packed.of_blocks(Type.Q4_0, blocks)
        rates["torchggml int8 GEMM (Q4_0 blocks)"] = ops / best_of(lambda: fused._int8_gemm(packed, x, out), 5)
    half = weight.half()
    half_bits = half.view(torch.int16).numpy().view(np.uint16)
    rates["torchggml F16 GEMM (numba tiles)"] = ops / best_of(
        lambda: op_kernels().half_gemm(half_bits, x.numpy(), out.numpy()), 5)
    xb, wb = x.bfloat16(), weight.bfloat16()
    rates["oneDNN bf16 GEMM (torch.mm)"] = ops / best_of(lambda: torch.mm(xb, wb.T), 5)
    rates["oneDNN f32 GEMM (torch.mm)"] = ops / best_of(lambda: torch.mm(x, weight.T, out=out), 5)
    return rates


def read_bandwidth() -> float:
    """GB/s of a sum over 1 GiB in huge pages (the best case of decode's weight reads)."""
    from torchggml.storage import huge_page_storage
    n = 1 << 30
    storage = huge_page_storage(n)
    data = (torch.empty(0, dtype=torch.float32).set_(storage) if storage is not None
            else torch.empty(n // 4, dtype=torch.float32)).view(-1)
    data.fill_(1.0)
    return n / best_of(lambda: data.sum(), 3) / 1e9


# shape -> (parameters multiplied a token, bytes per parameter by weight type)
SHAPES = {"1b": (968e6 + 65.5e6, 2048, 5632), "small": (151e6 + 32.8e6, 1024, 2816)}
BYTES_PER_WEIGHT = {"F16": 2.0, "Q8_0": 34 / 32, "Q6_K": 210 / 256, "Q4_K": 144 / 256, "Q4_0": 18 / 32}


def main(argv=None) -> int:
    from torchggml.devices.cpu.features import cpu_features
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-t", "--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    p.add_argument("-m", "--rows", type=int, default=128, help="the prompt's rows (default 128)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    feats = cpu_features()
    print(f"CPU: {feats['CPU_CAPABILITY']} ({' '.join(k for k, v in feats.items() if v == '1')}); "
          f"{args.threads} threads")
    params, dim, ffn = SHAPES[args.shape]
    peak = peaks(args.threads)
    for name, rate in peak.items():
        print(f"peak {name:34s} {rate:8.0f} GOP/s   prompt ceiling {rate * 1e9 / (2 * params):7.0f} t/s")
    for name, rate in gemm_rates(args.rows, dim, ffn).items():
        print(f"{name:39s} {rate:8.0f} GOP/s   ({args.rows}x{dim}x{ffn})   prompt ceiling "
              f"{rate * 1e9 / (2 * params):7.0f} t/s")
    bandwidth = read_bandwidth()
    print(f"read bandwidth (sum over 1 GiB, huge pages) {bandwidth:5.1f} GB/s   decode ceiling: " +
          ", ".join(f"{t} {bandwidth * 1e9 / (params * b):.0f} t/s" for t, b in BYTES_PER_WEIGHT.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
