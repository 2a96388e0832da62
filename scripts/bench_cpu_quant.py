#!/usr/bin/env python
"""The CPU's quantized products per type (issue 9): GB/s of repacked weight bytes for one
activation row (decode) and ms for a 128-row micro-batch (prompt), beside this machine's
measured copy bandwidth, on the path TORCHGGML_CPU_PATH selects (default: fused). Then
MUL_MAT_ID (--experts experts of n x k, --used of them per token, 1 and 128 tokens): experts in
the CPU_REPACK buffer of that path against the same experts as ggml blocks in CPU memory (each
used expert dequantized at every call), medians of alternating runs, and their ratio.

    python scripts/bench_cpu_quant.py [--n 2816] [--k 1024] [-t THREADS] [--types Q8_0,Q4_0,...]
                                      [--moe-types Q8_0,...] [--experts 8] [--used 2]
                                      [--rows 1,2,4,8,16 [--rows-only] [--prompt-rows]]

--rows: a batched decode step's products, M activation rows (one a sequence: the node marked
with ops.mul_mat_set_separate_rows, as a model marks a batched decode step's) for each M given,
the M's runs interleaved, the best of each: us per product and its cost against M = 1 (M for a path that reads
the weight again for each row, about 1 for one that reads it once for all rows). With
--prompt-rows the nodes are not marked: M tokens of one prompt, as a short prompt's products.

Each product runs through a ggml graph on the CPU backend (the kernel, its binding and one
node's dispatch), best of several runs; copy bandwidth is a 256 MiB torch copy (read + write).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torchggml as ggml  # noqa: E402  (first: it sets OpenMP's wait policy before torch loads)
import torch  # noqa: E402
from torchggml.devices.cpu.features import cpu_features, cpu_path  # noqa: E402
from torchggml.devices.cpu import repack_buffer_type  # noqa: E402
from bench_model import timed  # noqa: E402  (interleaved runs: a busy neighbour slows all alike)

T = ggml.Type
DEFAULT_TYPES = "Q8_0,Q4_0,Q4_K,Q6_K,Q5_K,Q4_1,Q5_0,Q5_1,Q2_K,Q3_K,IQ4_NL,IQ4_XS,MXFP4"


def best_of(fn, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def copy_bandwidth() -> float:
    src = torch.ones(1 << 28, dtype=torch.uint8)
    dst = torch.empty_like(src)
    return 2 * src.numel() / best_of(lambda: dst.copy_(src), 5) / 1e9


def weight_blocks(qtype, n: int, k: int) -> torch.Tensor:
    from torchggml.quants import quantize
    try:
        return quantize(qtype, torch.randn(n, k) * 0.1)
    except ValueError:  # types without a quantizer here: random bytes with sane scales
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from test_cpu_quant import random_blocks
        return random_blocks(qtype, n, k, seed=0)


class Product:
    """One MUL_MAT node [m rows] x weight [n, k] (experts > 0: MUL_MAT_ID of `experts` such
    weights, `used` of them per token, m tokens) in a planned graph; the weight in buft."""

    def __init__(self, qtype, n: int, k: int, m: int, buft, backend, experts: int = 0, used: int = 0,
                 separate_rows: bool = False):
        ctx_w = ggml.init(no_alloc=True)
        a = ggml.new_tensor_3d(ctx_w, qtype, k, n, max(1, experts))
        ctx = ggml.init(no_alloc=True)
        if experts:
            b = ggml.new_tensor_3d(ctx, T.F32, k, 1, m)
            ids = ggml.new_tensor_2d(ctx, T.I32, used, m)
            node = ggml.mul_mat_id(ctx, a, b, ids)
        else:
            b = ggml.new_tensor_2d(ctx, T.F32, k, m)
            node = ggml.mul_mat(ctx, a, b)
        if separate_rows:
            ggml.mul_mat_set_separate_rows(node)
        self.wbuf = ggml.backend_alloc_ctx_tensors_from_buft(ctx_w, buft or ggml.backend_cpu_buffer_type())
        graph = ggml.new_graph(ctx)
        ggml.build_forward_expand(graph, node)
        self.cbuf = ggml.backend_alloc_ctx_tensors_from_buft(ctx, ggml.backend_cpu_buffer_type())
        ggml.backend_tensor_set(a, weight_blocks(qtype, n * max(1, experts), k).numpy())
        ggml.backend_tensor_set(b, torch.randn(m, k))
        if experts:  # distinct random experts per token, the same in every run
            chosen = torch.rand(m, experts, generator=torch.Generator().manual_seed(0)).argsort(-1)[:, :used]
            ggml.backend_tensor_set(ids, chosen.to(torch.int32))
        self.backend, self.ctxs = backend, (ctx_w, ctx)
        self.plan = ggml.backend_graph_plan_create(backend, graph)

    def __call__(self):
        ggml.backend_graph_plan_compute(self.backend, self.plan)

    def free(self) -> int:
        """Free the plan; the weight's bytes as stored."""
        ggml.backend_graph_plan_free(self.backend, self.plan)
        return self.wbuf.size


def run_product(qtype, n: int, k: int, m: int, buft, backend, reps: int) -> tuple[float, int]:
    """(seconds, weight bytes as stored) of one MUL_MAT node [m rows] x weight [n, k]."""
    product = Product(qtype, n, k, m, buft, backend)
    seconds = best_of(product, reps)
    return seconds, product.free()


def moe_table(args, buft, backend) -> None:
    print(f"\nMUL_MAT_ID: {args.experts} experts of {args.n}x{args.k}, {args.used} used per token, "
          f"medians of {args.reps} alternating runs; old = ggml blocks, used experts dequantized per call")
    print(f"{'type':8s} {'tokens':>6s} {'path ms':>9s} {'old ms':>9s} {'old/path':>8s}")
    for name in args.moe_types.split(","):
        qtype = T[name]
        if buft is None or not buft.supports_weight(qtype, [args.k, args.n, args.experts]):
            print(f"{name:8s} not stored by the {cpu_path()} path's CPU_REPACK: skipped")
            continue
        for tokens in (1, 128):
            pair = [Product(qtype, args.n, args.k, tokens, use, backend, args.experts, args.used)
                    for use in (buft, None)]
            times = timed(args.reps if tokens == 1 else max(3, args.reps // 2), *pair)
            fused, old = (statistics.median(t) for t in times)
            for product in pair:
                product.free()
            print(f"{name:8s} {tokens:6d} {fused * 1e3:9.2f} {old * 1e3:9.2f} {old / fused:7.1f}x", flush=True)


def rows_table(args, buft, backend) -> None:
    ms = [int(m) for m in args.rows.split(",")]
    print(f"\nM rows through one product ({args.n}x{args.k}), best of {args.reps} interleaved runs: "
          f"us, and the ratio to M = {ms[0]}")
    print(f"{'type':8s} " + " ".join(f"{f'M={m} us':>9s}" for m in ms) + "  " + " ".join(f"{f'x{m}':>6s}" for m in ms[1:]))
    for name in filter(None, (args.types + ",F16,BF16").split(",")):
        qtype = T[name]
        use = buft if buft is not None and buft.supports_weight(qtype, [args.k, args.n]) else None
        products = [Product(qtype, args.n, args.k, m, use, backend, separate_rows=not args.prompt_rows) for m in ms]
        times = [min(t) for t in timed(args.reps, *products)]  # the least disturbed run of each
        for product in products:
            product.free()
        print(f"{name:8s} " + " ".join(f"{t * 1e6:9.0f}" for t in times) + "  "
              + " ".join(f"{t / times[0]:6.2f}" for t in times[1:]), flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=2816)
    p.add_argument("--k", type=int, default=1024)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("-r", "--reps", type=int, default=10)
    p.add_argument("--types", default=DEFAULT_TYPES)
    p.add_argument("--moe-types", default="Q8_0,Q4_0,Q4_K,Q6_K,MXFP4", help="MUL_MAT_ID types ('' for none)")
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--used", type=int, default=2)
    p.add_argument("--rows", default="", help="a rows table for these M (e.g. 1,2,4,8,16)")
    p.add_argument("--rows-only", action="store_true", help="only the rows table")
    p.add_argument("--prompt-rows", action="store_true", help="the rows table's M rows as one prompt's tokens")
    args = p.parse_args(argv)
    backend = ggml.backend_cpu_init()
    ggml.backend_cpu_set_n_threads(backend, args.threads)
    feats = " ".join(k for k, v in cpu_features().items() if v == "1")
    path = cpu_path()
    buft = repack_buffer_type()
    print(f"CPU {cpu_features()['CPU_CAPABILITY']} ({feats}), path {path}, {args.threads} threads, "
          f"weight {args.n}x{args.k}")
    if args.rows:
        rows_table(args, buft, backend)
        if args.rows_only:
            return 0
    print(f"copy bandwidth: {copy_bandwidth():.1f} GB/s (read + write)")
    print(f"{'type':8s} {'stored MB':>9s} {'M=1 us':>8s} {'M=1 GB/s':>9s} {'M=128 ms':>9s}")
    for name in filter(None, args.types.split(",")):
        qtype = T[name]
        use = buft if buft is not None and buft.supports_weight(qtype, [args.k, args.n]) else None
        t1, stored = run_product(qtype, args.n, args.k, 1, use, backend, args.reps)
        t128, _ = run_product(qtype, args.n, args.k, 128, use, backend, max(3, args.reps // 3))
        print(f"{name:8s} {stored / 1e6:9.2f} {t1 * 1e6:8.0f} {stored / t1 / 1e9:9.1f} {t128 * 1e3:9.2f}", flush=True)
    if args.moe_types:
        moe_table(args, buft, backend)
    return 0


if __name__ == "__main__":
    sys.exit(main())
