#!/usr/bin/env python
"""A decode step's block product with its weights cold: Q4_0's / IQ4_NL's weight rows read several
side by side (weight_rows_dot) or one at a time (row_dot), by weight shape.

    python scripts/bench_weight_rows.py [--shapes 1536x576,576x1536,...] [--type IQ4_NL] [-t 2]

Each shape gets a pool of random weights of ~100 MB (more than the caches hold, as a model's
layers are when a step reaches them), multiplied by one activation row, every weight once a
pass; each way's best pass of five, alternated in one process. The split that
quant_kernels.GROUPED_ROW_BYTES makes (rows side by side up to that many bytes, one at a time
past it) comes from this table.
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GROUPS = (8, 4, 1)  # weight rows a call: weight_rows_dot's counts, and row_dot


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="1536x576,1536x768,1536x1024,576x1536,1024x2048,768x3072,49152x576",
                   help="N x K of the weights (rows x columns)")
    p.add_argument("--type", default="IQ4_NL", choices=("Q4_0", "IQ4_NL"))
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--pool-mb", type=float, default=100.0)
    args = p.parse_args(argv)

    import numba
    from numba import njit, prange
    from torchggml.devices.cpu.features import cpu_features
    from torchggml.devices.cpu.jit.llvm_ir import IQ4_NL_KIND
    from torchggml.devices.cpu.jit.quant_kernels import GROUPED_ROW_BYTES, row_dot, weight_rows_dot
    kind = IQ4_NL_KIND if args.type == "IQ4_NL" else 18
    numba.set_num_threads(args.threads)

    @njit(parallel=True, fastmath=True, nogil=True)
    def product(w, xp, sums, xd, out, rows):
        for j in prange(w.shape[0] // 16):  # 16 output rows a parallel step, as the decode step's
            first = j * 16
            if rows == 8:
                for r in range(first, first + 16, 8):
                    dots = weight_rows_dot(w, r, xp, sums, xd, kind, 8)
                    for i in range(8):
                        out[r + i] = dots[i]
            elif rows == 4:
                for r in range(first, first + 16, 4):
                    dots = weight_rows_dot(w, r, xp, sums, xd, kind, 4)
                    for i in range(4):
                        out[r + i] = dots[i]
            else:
                for r in range(first, first + 16):
                    out[r] = row_dot(w[r], xp, sums, xd, kind)

    feats = cpu_features()
    print(f"CPU: {feats['CPU_CAPABILITY']}, {args.threads} threads, {args.type}, "
          f"GROUPED_ROW_BYTES {GROUPED_ROW_BYTES}; us a product (GB/s of weights)")
    print("| N x K | row bytes | " + " | ".join(f"{g} rows" if g > 1 else "one row" for g in GROUPS) + " |")
    print("| --- | --- |" + " --- |" * len(GROUPS))
    rng = np.random.default_rng(0)
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        if n % 16 or k % 32:
            raise SystemExit(f"bench_weight_rows: shape {shape}: N must be a multiple of 16 and K of 32")
        row_bytes = k // 32 * 18
        pool = []
        for _ in range(max(2, int(args.pool_mb * 1e6 // (n * row_bytes)))):
            w = rng.integers(0, 256, (n, row_bytes), dtype=np.uint8)
            w.reshape(n, k // 32, 18)[:, :, :2] = np.full((n, k // 32, 1), 0.01, np.float16).view(np.uint8)
            pool.append(w)
        xp = rng.integers(-127, 128, k).astype(np.int8)
        sums, xd = np.zeros(8 * ((k // 32 + 1) // 2), np.int32), np.full(k // 32, 0.01, np.float32)
        out = np.empty(n, np.float32)
        best = dict.fromkeys(GROUPS, float("inf"))
        for rows in GROUPS:
            product(pool[0], xp, sums, xd, out, rows)
        for _ in range(5):
            for rows in GROUPS:
                t0 = time.perf_counter()
                for w in pool:
                    product(w, xp, sums, xd, out, rows)
                best[rows] = min(best[rows], (time.perf_counter() - t0) / len(pool))
        cells = [f"{best[g] * 1e6:.1f} ({n * row_bytes / best[g] / 1e9:.1f})" for g in GROUPS]
        print(f"| {shape} | {row_bytes} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
