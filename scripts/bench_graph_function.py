#!/usr/bin/env python
"""Overhead of graph_function against a direct plan compute, in microseconds per call.

For a small graph (y = soft_max(rms_norm(W x)) * 2: four ops, the case where per-call overhead
matters most) and for the demo model's one-token decode graph, on the CPU backend:

  plan        backend_graph_plan_compute on a compiled plan (inputs already in place)
  plan+io     backend_tensor_set of the inputs + plan compute + a copy of the outputs
              (what any caller moving torch tensors in and out does)
  function    graph_function(...)(x): the torch.library custom op doing the same
  compiled    the same call inside torch.compile(fullgraph=True, backend="eager")

The overhead of graph_function is `function - plan+io` (the custom-op dispatch and argument
checks). Median of --reps timed calls after warm-up, the variants interleaved.

    python scripts/bench_graph_function.py --reps 2000
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torchggml as ggml  # noqa: E402


def median_us(variants: dict, reps: int) -> dict:
    """Median µs per call of each variant, timed round-robin (one call of each per round), so
    that a busy machine slows every variant alike."""
    for fn in variants.values():
        for _ in range(max(10, reps // 10)):
            fn()
    times = {name: [] for name in variants}
    for _ in range(reps):
        for name, fn in variants.items():
            t0 = time.perf_counter_ns()
            fn()
            times[name].append(time.perf_counter_ns() - t0)
    return {name: statistics.median(t) / 1e3 for name, t in times.items()}


def small_case():
    ctx = ggml.init(no_alloc=True)
    x = ggml.new_tensor_2d(ctx, ggml.Type.F32, 64, 4)
    ggml.set_input(x)
    w = ggml.new_tensor_2d(ctx, ggml.Type.F32, 64, 64)
    ggml.set_input(w)
    y = ggml.scale(ctx, ggml.soft_max(ctx, ggml.rms_norm(ctx, ggml.mul_mat(ctx, w, x), 1e-5)), 2.0)
    ggml.set_output(y)
    g = ggml.new_graph(ctx)
    ggml.build_forward_expand(g, y)
    backend = ggml.backend_cpu_init()
    fn = ggml.graph_function(g, [x, w], [y], backend)
    args = (torch.randn(4, 64), torch.randn(64, 64))
    return "4-op graph (64x64)", fn, backend, args


def decode_case():
    from torchggml.gguf.writer.demo import demo_model_path
    model = ggml.load_model(demo_model_path(), n_ctx=256, progress=False)
    module = model.as_module()
    module(torch.tensor([1]))  # builds the graph function for one token
    fn = next(iter(module._functions.values()))
    args = (torch.tensor([1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
            torch.tensor([0]), torch.zeros(1, 256, dtype=torch.float16))
    return "demo model, 1-token decode", fn, model.backend, args


def measure(name, fn, backend, args, reps: int) -> dict:
    targets = [*fn.inputs, *fn.params]

    def plan():
        ggml.backend_graph_plan_compute(backend, fn.plan)

    def plan_io():
        for t, a in zip(targets, args):
            ggml.backend_tensor_set(t, a)
        ggml.backend_graph_plan_compute(backend, fn.plan)
        return [ggml.to_torch(o).clone() for o in fn.outputs]

    compiled = torch.compile(lambda *a: fn(*a), fullgraph=True, backend="eager")
    with torch.no_grad():
        row = median_us({"plan": plan, "plan+io": plan_io, "function": lambda: fn(*args),
                         "compiled": lambda: compiled(*args)}, reps)
    row["graph"] = name
    row["overhead"] = row["function"] - row["plan+io"]
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=1000)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    cpu = ggml.backend_dev_get(0).get_description() if ggml.backend_dev_count() else "CPU"
    print(f"CPU backend on {cpu}, torch {torch.__version__}, 1 thread; median µs per call over {args.reps} calls\n")
    print("| graph | plan | plan+io | graph_function | compiled | overhead (function - plan+io) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for case in (small_case, decode_case):
        r = measure(*case(), args.reps)
        print(f"| {r['graph']} | {r['plan']:.1f} | {r['plan+io']:.1f} | {r['function']:.1f} | "
              f"{r['compiled']:.1f} | {r['overhead']:.1f} |")


if __name__ == "__main__":
    main()
