#!/usr/bin/env python
"""Benchmark torchggml.devices.triton.mul_mat on a CUDA device.

For every type, weight shape (N, K) and batch M it times (CUDA events, median of --reps, L2
flushed before every rep):
  ours        torchggml.devices.triton.mul_mat (matvec for M <= 16, GEMM above)
  dq+mm       torchggml.devices.triton.dequantize to bf16, then torch.matmul
  torch       torchggml.quants.dequantize (vectorised torch) to float32 -> bf16, then torch.matmul
  bf16 mm     torch.matmul on bf16 weights of the same shape (the speed of light for big M)
and reports bandwidth (weights + x + out bytes over time) as a fraction of the device's
measured copy bandwidth, TFLOP/s as a fraction of the bf16 matmul's, and speed-ups over the two
dequantize-then-matmul paths. Writes a markdown table to stdout, a CSV, and a PNG of bandwidth
against M (when matplotlib is installed).

    python scripts/bench_kernels.py --types q4_0,q4_K --shapes 4096x4096 --ms 1,16,512
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_SHAPES = "4096x4096,4096x14336,14336x4096"
DEFAULT_MS = "1,2,4,8,16,32,128,512,4096"
FLUSH_BYTES = 512 << 20  # larger than any L2 (H100: 50 MB)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--types", default=None, help="comma-separated ggml type names (default: all supported)")
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma-separated NxK weight shapes")
    p.add_argument("--ms", default=DEFAULT_MS, help="comma-separated batch sizes M")
    p.add_argument("--reps", type=int, default=25, help="timed repetitions per measurement")
    p.add_argument("--csv", default="bench_kernels.csv", help="CSV output path")
    p.add_argument("--png", default="bench_kernels.png", help="plot output path")
    p.add_argument("--no-baselines", action="store_true", help="time only our mul_mat")
    return p.parse_args(argv)


def parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for item in text.split(","):
        try:
            n, k = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise SystemExit(f"bad shape {item!r}: expected NxK, e.g. 4096x14336") from None
        shapes.append((n, k))
    return shapes


def parse_types(text: str | None, supported) -> list:
    from torchggml.types import as_type
    if text is None:
        return list(supported)
    types = []
    for name in text.split(","):
        try:
            t = as_type(name.strip())
        except ValueError as e:
            raise SystemExit(str(e)) from None
        if t not in supported:
            raise SystemExit(f"type {t.name} is not supported by torchggml.devices.triton")
        types.append(t)
    return types


class Timer:
    """Median of CUDA-event timings with a cold L2 (a large buffer is rewritten before each rep)."""

    def __init__(self, reps: int):
        self.reps = reps
        self.flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")

    def __call__(self, fn) -> float:
        fn()  # warm up (and autotune)
        torch.cuda.synchronize()
        times = []
        for _ in range(self.reps):
            self.flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        return statistics.median(times)


def copy_bandwidth(timer: Timer) -> float:
    """Bytes/s of a 1 GiB device-to-device copy (read + write)."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    seconds = timer(lambda: dst.copy_(src))
    del src, dst
    return 2 * (1 << 30) / seconds


def random_weights(qtype, n: int, k: int) -> torch.Tensor:
    """Random ggml rows: the kernels' speed does not depend on the values."""
    from torchggml.types import type_traits
    traits = type_traits(qtype)
    if not traits.is_quantized:
        return (torch.rand(n, k, device="cuda") * 2 - 1).to(traits.dtype).view(torch.uint8)
    row_bytes = k // traits.blck_size * traits.type_size
    return torch.randint(0, 256, (n, row_bytes), dtype=torch.uint8, device="cuda")


def bench_case(tk, timer, qtype, n, k, m, w, bf16_weight, baselines, torch_dequantize):
    x = torch.rand(m, k, device="cuda") * 2 - 1
    x_bf16 = x.to(torch.bfloat16)
    out = torch.empty(m, n, device="cuda")
    row = {"type": qtype.name, "N": n, "K": k, "M": m,
           "kernel": "matvec" if m <= tk.matmul.MATVEC_MAX_M else "gemm"}
    row["ours_s"] = t = timer(lambda: tk.mul_mat(qtype, w, x, out))
    moved = w.numel() + x.numel() * x.element_size() + out.numel() * 4
    row["GB/s"] = moved / t / 1e9
    row["TFLOP/s"] = 2 * m * n * k / t / 1e12
    if baselines:
        row["bf16_mm_s"] = timer(lambda: torch.matmul(x_bf16, bf16_weight.T))
        row["dq_mm_s"] = timer(lambda: torch.matmul(x_bf16, tk.dequantize(qtype, w, torch.bfloat16).T))
        if torch_dequantize is not None:
            row["torch_s"] = timer(lambda: torch.matmul(x_bf16, torch_dequantize(qtype, w).to(torch.bfloat16).T))
    return row


def add_ratios(row: dict, copy_bw: float) -> dict:
    row["bw_frac"] = row["GB/s"] * 1e9 / copy_bw
    if "bf16_mm_s" in row:
        row["flops_frac"] = row["bf16_mm_s"] / row["ours_s"]
        row["vs_dq_mm"] = row["dq_mm_s"] / row["ours_s"]
    if "torch_s" in row:
        row["vs_torch"] = row["torch_s"] / row["ours_s"]
    return row


COLUMNS = [("type", "{}"), ("N", "{}"), ("K", "{}"), ("M", "{}"), ("kernel", "{}"), ("ours_s", "{:.1e}"),
           ("GB/s", "{:.0f}"), ("bw_frac", "{:.2f}"), ("TFLOP/s", "{:.2f}"), ("flops_frac", "{:.2f}"),
           ("vs_dq_mm", "{:.2f}x"), ("vs_torch", "{:.2f}x")]


def markdown(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(name for name, _ in COLUMNS) + " |",
             "|" + "---|" * len(COLUMNS)]
    for row in rows:
        cells = [fmt.format(row[name]) if name in row else "n/a" for name, fmt in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_csv(rows: list[dict], path: str) -> None:
    fields = sorted({key for row in rows for key in row}, key=lambda f: [c for c, _ in COLUMNS].index(f)
                    if f in [c for c, _ in COLUMNS] else 100)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def plot(rows: list[dict], path: str, device_name: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)", file=sys.stderr)
        return
    shapes = sorted({(r["N"], r["K"]) for r in rows})
    fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 4.5), squeeze=False)
    for ax, (n, k) in zip(axes[0], shapes):
        for qtype in dict.fromkeys(r["type"] for r in rows):
            pts = sorted((r["M"], r["bw_frac"]) for r in rows if r["type"] == qtype and (r["N"], r["K"]) == (n, k))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=qtype)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M (rows of x)")
        ax.set_ylabel("bandwidth / device copy bandwidth")
        ax.set_title(f"N={n}, K={k}")
        ax.grid(True, alpha=0.3)
    axes[0][-1].legend(fontsize=7, ncol=2)
    fig.suptitle(f"torchggml.devices.triton.mul_mat on {device_name}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}", file=sys.stderr)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_kernels.py: no CUDA device found; these benchmarks time Triton kernels on a GPU "
              "and there is nothing to measure here.", file=sys.stderr)
        return 2
    import torchggml.devices.triton as tk
    types = parse_types(args.types, tk.SUPPORTED_TYPES)
    shapes = parse_shapes(args.shapes)
    ms = [int(m) for m in args.ms.split(",")]

    torch_dequantize = None
    if not args.no_baselines:
        try:
            from torchggml.quants import dequantize as torch_dequantize
        except ImportError as e:
            print(f"torchggml.quants unavailable ({e}): no pure-torch column", file=sys.stderr)

    timer = Timer(args.reps)
    copy_bw = copy_bandwidth(timer)
    device_name = torch.cuda.get_device_name()
    print(f"{device_name}: device-to-device copy {copy_bw / 1e9:.0f} GB/s\n")

    rows = []
    for qtype in types:
        for n, k in shapes:
            w = random_weights(qtype, n, k)
            bf16_weight = torch.rand(n, k, device="cuda", dtype=torch.bfloat16)
            for m in ms:
                row = bench_case(tk, timer, qtype, n, k, m, w, bf16_weight, not args.no_baselines,
                                 torch_dequantize)
                rows.append(add_ratios(row, copy_bw))
                print(markdown(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
                write_csv(rows, args.csv)  # after each case: a run stopped early keeps what it measured
            del w, bf16_weight
            torch.cuda.empty_cache()

    print(markdown(rows))
    print(f"wrote {args.csv}", file=sys.stderr)
    plot(rows, args.png, device_name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
