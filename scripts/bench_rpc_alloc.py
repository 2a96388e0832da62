"""What zeroing a fresh RPC buffer costs (rpc/server.py's zero_fresh): ALLOC_BUFFER's allocation
alone vs allocation plus zeroing, alternated in one process, per size. CPU buffers of 4 MiB and
more are anonymous mappings (zero pages from the kernel, nothing to clear); smaller ones come
from the heap and are cleared.

    PYTHONPATH=. python scripts/bench_rpc_alloc.py [--repeat 5]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torchggml as ggml
from torchggml.devices.rpc.server import zero_fresh

SIZES = [64 << 10, 1 << 20, 3 << 20, 64 << 20, 1 << 30]


def _timed(buft, size: int, zero: bool) -> float:
    t0 = time.perf_counter()
    buf = buft.alloc_buffer(size)
    if zero:
        zero_fresh(buf)
    elapsed = time.perf_counter() - t0
    buf.free()
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    buft = ggml.backend_cpu_buffer_type()
    print("| size | alloc (ms, median) | alloc + zero (ms, median) | zero_filled |")
    print("| ---: | ---: | ---: | :---: |")
    for size in SIZES:
        plain, zeroed = [], []
        for _ in range(args.repeat):  # alternated: the two sides see the same machine
            plain.append(_timed(buft, size, False))
            zeroed.append(_timed(buft, size, True))
        probe = buft.alloc_buffer(size)
        print(f"| {size >> 10} KiB | {1e3 * statistics.median(plain):.3f} | {1e3 * statistics.median(zeroed):.3f} "
              f"| {getattr(probe, 'zero_filled', False)} |")
        probe.free()


if __name__ == "__main__":
    main()
