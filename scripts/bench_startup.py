#!/usr/bin/env python
"""Start-up of torchggml's command line and of a model's load, for one or more source trees
side by side (e.g. a checkout of main and this one), alternated round by round in one run so
that a machine whose load drifts slows every tree alike.

    python scripts/bench_startup.py MODEL.gguf [--trees /path/to/main,.] [--rounds 5]

Each measure runs in a fresh process with PYTHONPATH set to the tree, under /usr/bin/time -v
(bench_memory.py's timed, bytecode cached as an installed package's):
  version  `python -m torchggml --version`: wall, CPU (user + system) and peak RSS of the process
  load     load_model(MODEL) after torch is imported: wall and CPU seconds of the call
  run      `python -m torchggml run MODEL -n 1 -p Hello`: the whole process (imports, load,
           warm-up, the prompt and one token, exit), wall, CPU and peak RSS
With -t 1 every process runs one thread: its CPU time is then its work alone (idle workers
of a busy machine's thread pools spin and count). The medians per tree, and the load average at the start and the end (a busy machine
stretches wall times; CPU times depend less on it). Each tree's numba cache should be warm
(run the model once with it first): a cold one measures compiling.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from bench_memory import timed

LOAD = ("import json, sys, time\nimport torch\nfrom torchggml.models import load_model\n"
        "wall, cpu = time.perf_counter(), time.process_time()\n"
        "model = load_model(sys.argv[1], progress=False)\n"
        "print(json.dumps({'wall': time.perf_counter() - wall, 'cpu': time.process_time() - cpu}))\n")


def one_round(model: str, tree: str, threads: int | None = None) -> dict:
    """Each measure once in a fresh process with the tree first on Python's path (and as its
    working directory, which `python -m` and `-c` put before PYTHONPATH)."""
    tree = str(Path(tree).resolve())
    py, env = sys.executable, {"PYTHONPATH": tree}
    if threads:  # torch's, OpenMP's and numba's pools
        env.update(OMP_NUM_THREADS=str(threads), NUMBA_NUM_THREADS=str(threads))
    version = timed([py, "-m", "torchggml", "--version"], env, tree)
    load = json.loads(timed([py, "-c", LOAD, model], env, tree)["out"].splitlines()[-1])
    run = timed([py, "-m", "torchggml", "run", model, "-n", "1", "-p", "Hello"], env, tree)
    return {"version wall": version["wall"], "version cpu": version["cpu"], "version RSS": version["rss"],
            "load wall": load["wall"], "load cpu": load["cpu"],
            "run wall": run["wall"], "run cpu": run["cpu"], "run RSS": run["rss"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a GGUF file")
    p.add_argument("--trees", default=".", help="comma-separated source trees (default: this one)")
    p.add_argument("--rounds", type=int, default=5, help="rounds, each tree once a round (default 5)")
    p.add_argument("-t", "--threads", type=int, default=None,
                   help="threads of every process (default: all; 1 makes CPU times the work's alone, "
                        "without idle workers' spinning)")
    args = p.parse_args(argv)
    trees = args.trees.split(",")
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    results: dict[str, list[dict]] = {tree: [] for tree in trees}
    for r in range(args.rounds):
        for tree in trees if r % 2 == 0 else trees[::-1]:  # the order alternates too
            results[tree].append(one_round(os.path.abspath(args.model), tree, args.threads))
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    keys = list(results[trees[0]][0])
    print("| measure (median of %d) | %s |" % (args.rounds, " | ".join(trees)))
    print("|---|" + "---|" * len(trees))
    for key in keys:
        unit = "MB" if "RSS" in key else "s"
        cells = [f"{statistics.median(x[key] for x in results[tree]):.{0 if unit == 'MB' else 3}f} {unit}"
                 for tree in trees]
        print(f"| {key} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
