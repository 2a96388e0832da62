"""Per-node Python overhead of graph compute on the CPU device, and gallocr planning time.

A chain of small element-wise nodes (add/mul on [ne] F32 tensors) is planned with gallocr and
computed through backend_graph_compute and through a graph plan; the same chain written in
plain torch (out= into preallocated tensors) is the floor. Prints a table (median of repeats).

    python scripts/bench_overhead.py [--nodes 1000] [--ne 64] [--repeats 15]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torchggml as ggml


def build_chain(n_nodes: int, ne: int):
    """x -> add(., w) -> mul(., w) -> ... (n_nodes nodes); returns (graph, x, w, ctx)."""
    ctx = ggml.init(no_alloc=True)
    x = ggml.new_tensor_1d(ctx, ggml.Type.F32, ne)
    w = ggml.new_tensor_1d(ctx, ggml.Type.F32, ne)
    ggml.set_input(x)
    ggml.set_input(w)
    t = x
    for i in range(n_nodes):
        t = ggml.add(ctx, t, w) if i % 2 == 0 else ggml.mul(ctx, t, w)
    ggml.set_output(t)
    graph = ggml.new_graph_custom(ctx, size=n_nodes + 16)
    ggml.build_forward_expand(graph, t)
    return graph, x, w, ctx


def median_seconds(fn, repeats: int, setup=None) -> float:
    times = []
    for _ in range(repeats):
        arg = setup() if setup else None
        t0 = time.perf_counter()
        fn(arg) if setup else fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def torch_floor(n_nodes: int, ne: int, repeats: int) -> float:
    x, w = torch.rand(ne), torch.rand(ne)
    bufs = [torch.empty(ne) for _ in range(2)]

    def run():
        t = x
        for i in range(n_nodes):
            out = bufs[i % 2]
            (torch.add if i % 2 == 0 else torch.mul)(t, w, out=out)
            t = out
    run()
    return median_seconds(run, repeats)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--ne", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    n, ne, reps = args.nodes, args.ne, args.repeats

    backend = ggml.backend_cpu_init()
    buft = ggml.backend_cpu_buffer_type()

    # planning: each repeat gets a fresh graph (an allocated graph's tensors count as pre-allocated)
    galloc = ggml.gallocr_new(buft)
    t_reserve = median_seconds(lambda g: ggml.gallocr_reserve(galloc, g[0]), reps, lambda: build_chain(n, ne))

    def reserved_graph():
        g = build_chain(n, ne)
        ggml.gallocr_reserve(galloc, g[0])
        return g
    t_alloc = median_seconds(lambda g: ggml.gallocr_alloc_graph(galloc, g[0]), reps, reserved_graph)
    t_alloc_replan = median_seconds(lambda g: ggml.gallocr_alloc_graph(ggml.gallocr_new(buft), g[0]), reps,
                                    lambda: build_chain(n, ne))

    # compute
    graph, x, w, _ctx = build_chain(n, ne)
    assert ggml.gallocr_alloc_graph(galloc, graph)
    ggml.backend_tensor_set(x, torch.rand(ne))
    ggml.backend_tensor_set(w, torch.rand(ne))
    ggml.backend_graph_compute(backend, graph)  # warm-up: views get cached
    t_compute = median_seconds(lambda: ggml.backend_graph_compute(backend, graph), reps)
    plan = ggml.backend_graph_plan_create(backend, graph)
    ggml.backend_graph_plan_compute(backend, plan)
    t_plan = median_seconds(lambda: ggml.backend_graph_plan_compute(backend, plan), reps)
    t_plan_create = median_seconds(lambda: ggml.backend_graph_plan_free(backend, ggml.backend_graph_plan_create(backend, graph)), reps)
    ggml.backend_graph_plan_free(backend, plan)
    t_floor = torch_floor(n, ne, reps)

    per_node = lambda s: f"{s / n * 1e9:10.0f}"  # noqa: E731
    print(f"graph: {n} nodes (add/mul chain on [{ne}] F32), CPU backend, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, median of {reps}")
    print(f"compute buffer: {ggml.gallocr_get_buffer_size(galloc, 0)} bytes\n")
    print(f"{'what':<44}{'total ms':>10}{'ns/node':>10}{'overhead ns/node':>18}")
    rows = [
        ("plain torch (out=, the floor)", t_floor, None),
        ("backend_graph_compute", t_compute, t_compute - t_floor),
        ("backend_graph_plan_compute", t_plan, t_plan - t_floor),
        ("backend_graph_plan_create", t_plan_create, None),
        ("gallocr_reserve", t_reserve, None),
        ("gallocr_alloc_graph (reserved graph)", t_alloc, None),
        ("gallocr_alloc_graph (new gallocr: plan+alloc)", t_alloc_replan, None),
    ]
    for name, secs, over in rows:
        print(f"{name:<44}{secs * 1e3:10.2f}{per_node(secs)}{per_node(over) if over is not None else '':>18}")


if __name__ == "__main__":
    main()
