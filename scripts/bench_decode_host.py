#!/usr/bin/env python
"""Per-token host overhead of decode on the CPU device (issue 9): a small model's decode step,
where the kernels' own work is tiny: the plan's replay (the bound node calls) timed inside each
eval, and the rest of eval (inputs, logits, bookkeeping).

    python scripts/bench_decode_host.py [MODEL.gguf] [-n 64] [-t THREADS]

Default model: the demo generator's small llama (dim 256, 4 layers, F32). Prints µs per token of
model.eval([token]), µs per token of the graph plan's replay alone, its node count and µs per
node (median of n steps), and the same with the node calls run back to back with no work
between them being the plan loop itself.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torchggml.models import load_model  # noqa: E402


# CPU time of this thread, not wall time: on a shared machine the wall clock counts the time other
# processes hold the core (with -t 1 the work runs on this thread)
clock = time.thread_time


def median_us(fn, n: int) -> float:
    fn()
    times = []
    for _ in range(n):
        t = clock()
        fn()
        times.append(clock() - t)
    return statistics.median(times) * 1e6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?")
    p.add_argument("-n", type=int, default=64, help="decode steps measured (median)")
    p.add_argument("-t", "--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.model is None:
        from torchggml.models.demo import generated_model
        args.model = generated_model()
    model = load_model(args.model, devices=["CPU"], n_threads=args.threads, progress=False)
    model.reset()
    model.eval([1, 2, 3, 4])
    token = iter(range(10**9))
    backend, inside = model.backend, []
    plan_compute = backend.graph_plan_compute

    def timed_plan_compute(plan):  # the plan's replay, timed inside each eval
        t = clock()
        status = plan_compute(plan)
        inside.append(clock() - t)
        return status
    backend.graph_plan_compute = timed_plan_compute
    per_token = median_us(lambda: model.eval([5 + next(token) % 50]), args.n)
    n_nodes = len(model._plan.calls)
    replay = statistics.median(inside) * 1e6
    print(f"{Path(args.model).name}: {n_nodes} nodes per decode token, threads {args.threads}")
    print(f"  eval([token])      {per_token:9.1f} us/token")
    print(f"  plan replay        {replay:9.1f} us/token  {replay / n_nodes:6.1f} us/node")
    print(f"  outside the plan   {per_token - replay:9.1f} us/token (inputs, logits, eval bookkeeping)")
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
