#!/usr/bin/env python
"""The prompt's int8 GEMM per type against the float GEMM it replaces (the weight dequantized
once per call, then torch's f32 or bf16 GEMM), alternated in one process: GOP/s (2 M N K
operations a call) and the ratio, medians of the runs, and GOP per CPU second of the process (on
a busy machine the steadier figure: with -t 1, per core second; OpenMP's spinning counts as CPU
time with more threads).

    python scripts/bench_int8_gemm.py [--n 2816] [--k 1024] [-m 128] [-t THREADS] [--types Q8_0,...]

The int8 GEMM runs on the byte dot of numba's target (jit/gemm_ir.gemm_isa). To measure an
AVX2-only CPU's paths on a newer one, name an AVX2 target for numba and keep torch's GEMMs to
AVX2 too:
    NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES= ATEN_CPU_CAPABILITY=avx2 \\
        MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 python scripts/bench_int8_gemm.py --float f32
(the CPU's caches, clocks and execution ports stay the newer one's: an estimate, not a measurement
of an AVX2 CPU).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torchggml as ggml  # noqa: E402  (first, as every entry point)
import torch  # noqa: E402
from torchggml.devices.cpu.features import fastest_gemm_dtype  # noqa: E402
from torchggml.devices.cpu.jit.gemm_ir import gemm_isa  # noqa: E402
from torchggml.devices.cpu.jit.loader import set_numba_threads  # noqa: E402
from torchggml.devices.cpu.layouts import fused as layout  # noqa: E402
from bench_model import CPU_SECONDS, timed  # noqa: E402  (interleaved runs: a busy neighbour slows both alike)

T = ggml.Type


# offsets of each in-place type's float16 fields (d, and the K-quants' dmin) in its block
HALF_FIELDS = {T.Q8_0: (0,), T.Q4_0: (0,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}


def random_blocks(qtype, n: int, k: int) -> torch.Tensor:
    """ggml blocks [n, row bytes]: random bytes with small finite float16 scales."""
    from torchggml.types import type_traits
    tr = type_traits(qtype)
    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (n * k // tr.blck_size, tr.type_size), dtype=torch.uint8, generator=g)
    for at in HALF_FIELDS[qtype]:
        scales = (torch.rand(blocks.shape[0], generator=g) * 0.02 + 1e-3).half()
        blocks[:, at:at + 2] = scales.view(torch.uint8).view(-1, 2)
    return blocks.reshape(n, -1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=2816)
    p.add_argument("--k", type=int, default=1024)
    p.add_argument("-m", "--rows", type=int, default=128)
    p.add_argument("-t", "--threads", type=int, default=torch.get_num_threads())
    p.add_argument("-r", "--reps", type=int, default=7)
    p.add_argument("--types", default="Q8_0,Q4_0,Q4_K,Q5_K,Q6_K")
    p.add_argument("--float", choices=("f32", "bf16"), default=None,
                   help="the float GEMM's dtype (default: this CPU's, as the path without the int8 GEMM)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    set_numba_threads(args.threads)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}.get(args.float) or fastest_gemm_dtype()
    print(f"numba target {os.environ.get('NUMBA_CPU_NAME') or 'host'}: int8 GEMM on {gemm_isa()}; torch "
          f"{torch.backends.cpu.get_cpu_capability()}, float GEMM in {dtype}; {args.threads} threads; "
          f"M={args.rows} N={args.n} K={args.k}; load average {os.getloadavg()[0]:.1f}")
    if gemm_isa() is None:
        print("numba's target has no byte dot: the int8 GEMM does not run here")
        return 1
    ops = 2 * args.rows * args.n * args.k
    x = torch.randn(args.rows, args.k, generator=torch.Generator().manual_seed(1))
    print(f"{'type':<6} {'int8 GOP/s':>11} {'float GOP/s':>12} {'ratio':>6}   per CPU second: {'int8':>7} {'float':>7} "
          f"{'ratio':>6}")
    for name in args.types.split(","):
        qtype = T[name]
        packed = layout._Packed.of_blocks(qtype, random_blocks(qtype, args.n, args.k))
        out_i, out_f = torch.empty(args.rows, args.n), torch.empty(args.rows, args.n, dtype=dtype)
        rows = x.to(dtype)
        CPU_SECONDS.clear()
        int8_times, float_times = timed(args.reps, lambda: layout._int8_gemm(packed, x, out_i),
                                        lambda: layout._gemm(packed, rows, out_f))
        i8, fl = ops / statistics.median(int8_times) / 1e9, ops / statistics.median(float_times) / 1e9
        i8c, flc = (ops * args.reps / c / 1e9 for c in CPU_SECONDS)
        print(f"{name:<6} {i8:>11.1f} {fl:>12.1f} {i8 / fl:>5.2f}x   {'':>15} {i8c:>7.1f} {flc:>7.1f} {i8c / flc:>5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
