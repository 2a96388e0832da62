#!/usr/bin/env python
"""Per-token host overhead of decode on the CPU device (issue 9): a model's decode step, timed as
model.eval([token]), as the CPU plan's replay inside it (its bound node calls), and per op class.

    python scripts/bench_decode_host.py [MODEL.gguf] [-n 64] [-t THREADS] [--n-ctx N]

Default model: the demo generator's small llama (dim 256, 4 layers, F32). Times are this
thread's CPU time (time.thread_time), medians of n steps: on a shared machine the wall clock
counts the time other processes hold the core (with -t 1 all the work runs on this thread;
with more threads, products also run on others, which this clock does not see).

Side by side in the same run, every node is also timed with the kernel its CPU table entry
layers over (the CPU's numba layer off, cpu/kernels.py: the torch reference kernels, the CPU's
own products): "torch kernels" columns. The decode
step is timed both ways too, alternating the plan's calls between the two sets token by token.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchggml.models import load_model  # noqa: E402
from torchggml.devices.cpu import CPUBackend  # noqa: E402
from torchggml.devices.cpu.kernels import CPU_KERNELS, LAYERS, bind_layers  # noqa: E402
from torchggml.devices.plan import compile_graph  # noqa: E402

clock = time.thread_time


def reference_call(fn, node):
    """The node's call from its op's CPU layers without the numba one (cpu/kernels.py: the torch
    reference kernels, the CPU's own products); the call itself for ops without layers."""
    layers = LAYERS.get(node.op)
    if layers is None:
        return fn
    return bind_layers(node.op, [layer for layer in layers if layer.kind != "numba"], node)


def op_class(node) -> str:
    """The op, with the weight's type for products and the size for copies."""
    if node.op.name.startswith("MUL_MAT"):
        return f"{node.op.name} {node.src[0].type.name}"
    if node.op.name in ("CONT", "CPY", "DUP"):
        return f"{node.op.name} {node.type.name} x{node.ne[0] * node.ne[1] * node.ne[2] * node.ne[3]}"
    return node.op.name


def per_class(plan, calls, ref_calls, step, n: int):
    """{class: (nodes, median µs per step of the CPU calls, same for the reference calls)}: n
    steps (evals) in which every node runs both ways in turn, while the graph's inputs are
    fresh (the allocator reuses their memory later in the graph)."""
    count = defaultdict(int)
    for _, node in calls:
        count[op_class(node)] += 1
    ours, theirs = defaultdict(list), defaultdict(list)
    for i in range(n):
        step_ours, step_theirs = defaultdict(float), defaultdict(float)

        def both(fn, ref, key, ours_first):
            # the first of the two calls meets a colder cache: each goes first every other step
            first, second = (fn, ref) if ours_first else (ref, fn)

            def call(node):
                t0 = clock()
                first(node)
                t1 = clock()
                second(node)
                t2 = clock()
                a, b = (t1 - t0, t2 - t1) if ours_first else (t2 - t1, t1 - t0)
                step_ours[key] += a
                step_theirs[key] += b
            return call
        plan.calls = [(both(fn, ref, op_class(node), i % 2 == 0), node)
                      for (fn, node), (ref, _) in zip(calls, ref_calls)]
        step(5 + i % 50)
        for k in count:
            ours[k].append(step_ours[k])
            theirs[k].append(step_theirs[k])
    plan.calls = calls
    return {k: (count[k], statistics.median(ours[k]) * 1e6, statistics.median(theirs[k]) * 1e6) for k in count}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?")
    p.add_argument("-n", type=int, default=64, help="decode steps measured (median)")
    p.add_argument("-t", "--threads", type=int, default=1)
    p.add_argument("--n-ctx", type=int, default=None, help="context size (default: the model loader's)")
    p.add_argument("--tokens", type=int, default=1,
                   help="tokens per step (default 1: decode; more: a prompt's micro-batch, from the start each step)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.model is None:
        from torchggml.gguf.writer.demo import generated_model
        args.model = generated_model()
    extra = {"n_ctx": args.n_ctx} if args.n_ctx else {}
    model = load_model(args.model, devices=["CPU"], n_threads=args.threads, progress=False, **extra)
    backend = next(b for b in model.backends if isinstance(b, CPUBackend))
    plans, inside = [], []
    plan_compute = backend.graph_plan_compute

    def timed_plan_compute(plan):  # the plan's replay, timed inside each eval
        plans.append(plan)
        t = clock()
        status = plan_compute(plan)
        inside.append(clock() - t)
        return status
    backend.graph_plan_compute = timed_plan_compute
    batch = list(range(5, 5 + args.tokens))

    def step(first: int) -> None:
        if args.tokens == 1:
            model.eval([first])
        else:  # a prompt's micro-batch at the same place each step: the graph (and plan) repeat
            model.reset()
            model.eval([(t + first) % 50 + 5 for t in batch])
    model.reset()
    model.eval([1, 2, 3, 4])
    step(5)
    plan = plans[-1]
    calls = list(plan.calls)
    # the reference set and the node-by-node table need every node's own call: a fused plan
    # (cpu/fusion.py) runs some nodes' work in another node's call
    unfused = compile_graph(plan.graph, CPU_KERNELS, backend)
    ref_calls = [(reference_call(fn, node), node) for fn, node in unfused]

    token = iter(range(10**9))
    steps = {"cpu": ([], []), "torch": ([], [])}
    for i in range(2 * args.n + 2):  # alternate the two call sets token by token
        name = "cpu" if i % 2 == 0 else "torch"
        plan.calls = calls if name == "cpu" else ref_calls
        t = clock()
        step(5 + next(token) % 50)
        if i >= 2:
            steps[name][0].append(clock() - t)
            steps[name][1].append(inside[-1])
    plan.calls = calls
    n_nodes = len(unfused)
    what = "decode token" if args.tokens == 1 else f"step of {args.tokens} tokens"
    print(f"{Path(args.model).name}: {n_nodes} nodes per {what}, threads {args.threads}, "
          f"thread CPU time, medians of {args.n} steps")
    print(f"{'':22s} {'CPU table':>12s} {'torch kernels':>14s}")
    (eval_c, plan_c), (eval_t, plan_t) = ([statistics.median(v) * 1e6 for v in steps[k]] for k in ("cpu", "torch"))
    print(f"  {'eval':20s} {eval_c:9.1f} us {eval_t:11.1f} us   per step")
    print(f"  {'plan replay':20s} {plan_c:9.1f} us {plan_t:11.1f} us   per step")
    print(f"  {'per node':20s} {plan_c / n_nodes:9.1f} us {plan_t / n_nodes:11.1f} us")
    print(f"  {'outside the plan':20s} {eval_c - plan_c:9.1f} us {eval_t - plan_t:11.1f} us   "
          "(inputs, logits, eval bookkeeping)")
    if args.tokens > 1:
        print(f"  (with more than one token, eval also resets the cache: 'outside the plan' counts it)")
    print(f"  per op class (nodes timed one by one, both ways in turn):")
    table = per_class(plan, unfused, ref_calls, step, args.n)
    for k, (count, ours, theirs) in sorted(table.items(), key=lambda kv: -kv[1][2]):
        print(f"    {k:16s} {count:4d} nodes {ours / count:8.1f} us/node {theirs / count:9.1f} us/node")
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
