"""Compile every Triton kernel and autotune config for sm_80 and sm_90 without a GPU, and report
registers, spills and shared memory per config; exit 1 on a spill, or on shared memory or
registers over the architecture's limit.

    PYTHONPATH=. python scripts/aot_report.py                       # Q4_0 and Q4_K, sm_80 + sm_90
    PYTHONPATH=. python scripts/aot_report.py --types all -j 2      # every type the kernels decode
    PYTHONPATH=. python scripts/aot_report.py --types Q6_K --arch 90 --markdown

TRITON_INTERPRET must be unset (the script refuses otherwise).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import time

DEFAULT_TYPES = "Q4_0,Q4_K"


def parse_types(text: str):
    from torchggml.types import Type
    from torchggml.devices.triton import SUPPORTED_TYPES
    if text == "all":
        return list(SUPPORTED_TYPES)
    try:
        return [Type[name.strip().upper()] for name in text.split(",") if name.strip()]
    except KeyError as e:
        raise SystemExit(f"aot_report: unknown type {e}") from None


def _compile(job):
    from torchggml.devices.triton import aot
    spec, arch = job
    try:
        return aot.compile_spec(spec, arch), None
    except Exception as e:  # noqa: BLE001 - a config that does not compile is a finding
        return None, f"{spec.kernel} {spec.variant} {spec.config} sm_{arch}: {type(e).__name__}: {str(e)[:300]}"


def run(types, archs, jobs: int = 1, kernels=None, x_dtypes=("fp32", "bf16")):
    """(reports keyed by (spec, arch), compile errors); `kernels`: only these (names in aot.KERNELS)."""
    from torchggml.devices.triton import aot
    work = [(spec, arch) for spec in aot.specs(types, x_dtypes) for arch in archs
            if not kernels or spec.kernel in kernels]
    if jobs > 1:
        with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
            results = list(pool.map(_compile, work))
    else:
        results = [_compile(w) for w in work]
    reports = {(r.spec, r.arch): r for r, _ in results if r is not None}
    errors = [e for _, e in results if e is not None]
    return reports, errors


def table(reports, archs, markdown: bool = False) -> str:
    """One table per kernel: a row per variant and config, registers/spills/shared per arch."""
    specs = list(dict.fromkeys(spec for spec, _ in reports))
    lines = []
    for kernel in dict.fromkeys(s.kernel for s in specs):
        header = ["variant", "config"] + [f"sm_{a} {what}" for a in archs for what in ("regs", "spill B", "smem B")]
        rows = []
        for spec in (s for s in specs if s.kernel == kernel):
            row = [spec.variant, spec.config]
            for a in archs:
                r = reports.get((spec, a))
                row += [str(r.registers), str(r.spill_bytes), str(r.shared)] if r else ["-", "-", "-"]
            rows.append(row)
        lines.append(f"\n{kernel}: {len(rows)} configs")
        if markdown:
            lines.append("| " + " | ".join(header) + " |")
            lines.append("|" + "---|" * len(header))
            lines += ["| " + " | ".join(r) + " |" for r in rows]
        else:
            widths = [max(len(x) for x in col) for col in zip(header, *rows)]
            fmt = lambda cells: "  ".join(x.ljust(w) for x, w in zip(cells, widths)).rstrip()  # noqa: E731
            lines += [fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]
    return "\n".join(lines)


def summary(reports, archs) -> str:
    """Per kernel and arch: configs compiled, max registers, max spill bytes, max shared memory."""
    lines = ["kernel            arch   configs  max regs  max spill B  max smem B  compile s"]
    for kernel in dict.fromkeys(spec.kernel for spec, _ in reports):
        for a in archs:
            rs = [r for (s, arch), r in reports.items() if s.kernel == kernel and arch == a]
            if rs:
                lines.append(f"{kernel:<17} sm_{a}  {len(rs):>7}  {max(r.registers for r in rs):>8}  "
                             f"{max(r.spill_bytes for r in rs):>11}  {max(r.shared for r in rs):>10}  "
                             f"{sum(r.seconds for r in rs):>9.1f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--types", default=DEFAULT_TYPES, help=f"comma-separated ggml types, or 'all' (default {DEFAULT_TYPES})")
    p.add_argument("--arch", default="80,90", help="compute capabilities (default 80,90)")
    p.add_argument("--kernels", help="comma-separated kernel names (default: all of dequantize_rows, matvec, gemm, mul_mat_id)")
    p.add_argument("--x-dtypes", default="fp32,bf16",
                   help="activation dtypes of the matmul variants: fp32 (fp16 tensor cores), bf16 (default both)")
    p.add_argument("-j", "--jobs", type=int, default=1, help="compile in this many processes")
    p.add_argument("--markdown", action="store_true", help="markdown tables")
    p.add_argument("--summary-only", action="store_true", help="only the per-kernel maxima")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("aot_report: unset TRITON_INTERPRET (the interpreter has no compiler)", file=sys.stderr)
        return 2
    from torchggml.devices.triton import aot
    problem = aot.toolchain_problem()
    if problem:
        print(f"aot_report: cannot compile ahead of time here: {problem}", file=sys.stderr)
        return 3
    archs = [int(a) for a in args.arch.split(",")]
    types = parse_types(args.types)
    t0 = time.perf_counter()
    reports, errors = run(types, archs, args.jobs, args.kernels.split(",") if args.kernels else None,
                          tuple(args.x_dtypes.split(",")))
    if not args.summary_only:
        print(table(reports, archs, args.markdown))
    print()
    print(summary(reports, archs))
    problems = [f"{r.spec.kernel} {r.spec.variant} {r.spec.config} sm_{r.arch}: {p}"
                for r in reports.values() for p in r.problems()]
    print(f"\n{len(reports)} compilations ({', '.join(t.name for t in types)}; "
          f"{', '.join(f'sm_{a}' for a in archs)}) in {time.perf_counter() - t0:.0f} s: "
          f"{len(errors)} failed to compile, {len(problems)} over a limit")
    for line in errors + problems:
        print("  " + line)
    return 1 if errors or problems else 0


if __name__ == "__main__":
    sys.exit(main())
