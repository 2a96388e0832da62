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
  stages   (--stages) the load again in its own process, CPU seconds of its parts: numba's
           start (its import included; in trees whose load started numba), the GGUF header,
           the model's compute set-up (graph build and the scheduler's reserve); and the
           process's RSS after the load
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

# --stages: the load's parts, each function's CPU seconds (the tree's own names; a part the tree
# does not have is left out), and the process's resident memory after the load
# ("numba start": trees whose load started numba, before 98546df; a later tree's load imports no numba)
STAGES = {"numba start": ("torchggml.models.loading", None, "_start_cpu_kernels"),
          "header": ("torchggml.gguf.loader", None, "open_gguf"),
          "model set-up": ("torchggml.models.model", "Model", "_setup_compute")}
LOAD_STAGES = """import importlib, json, sys, time
import torch
from torchggml.models import load_model
STAGES, spent = json.loads(sys.argv[2]), {}
def timed(label, fn):
    def wrapper(*args, **kwargs):
        start = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] = spent.get(label, 0.0) + time.process_time() - start
    return wrapper
for label, (module, owner, name) in STAGES.items():
    try:
        where = importlib.import_module(module)
        where = getattr(where, owner) if owner else where
        setattr(where, name, timed(label, getattr(where, name)))
    except (ImportError, AttributeError):
        pass
cpu = time.process_time()
model = load_model(sys.argv[1], progress=False)
spent["cpu"] = time.process_time() - cpu
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
spent["RSS"] = int(status["VmRSS"].split()[0]) / 1024
print(json.dumps(spent))
"""


def one_round(model: str, tree: str, threads: int | None = None, stages: bool = False) -> dict:
    """Each measure once in a fresh process with the tree first on Python's path (and as its
    working directory, which `python -m` and `-c` put before PYTHONPATH)."""
    tree = str(Path(tree).resolve())
    py, env = sys.executable, {"PYTHONPATH": tree}
    if threads:  # torch's, OpenMP's and numba's pools
        env.update(OMP_NUM_THREADS=str(threads), NUMBA_NUM_THREADS=str(threads))
    version = timed([py, "-m", "torchggml", "--version"], env, tree)
    load = json.loads(timed([py, "-c", LOAD, model], env, tree)["out"].splitlines()[-1])
    run = timed([py, "-m", "torchggml", "run", model, "-n", "1", "-p", "Hello"], env, tree)
    result = {"version wall": version["wall"], "version cpu": version["cpu"], "version RSS": version["rss"],
              "load wall": load["wall"], "load cpu": load["cpu"],
              "run wall": run["wall"], "run cpu": run["cpu"], "run RSS": run["rss"]}
    if stages:  # a process of its own: the wrappers' calls stay out of the load measured above
        parts = json.loads(timed([py, "-c", LOAD_STAGES, model, json.dumps(STAGES)], env, tree)["out"].splitlines()[-1])
        result.update({f"load: {k} cpu" if k != "RSS" else "load RSS": v for k, v in parts.items() if k != "cpu"})
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a GGUF file")
    p.add_argument("--trees", default=".", help="comma-separated source trees (default: this one)")
    p.add_argument("--rounds", type=int, default=5, help="rounds, each tree once a round (default 5)")
    p.add_argument("-t", "--threads", type=int, default=None,
                   help="threads of every process (default: all; 1 makes CPU times the work's alone, "
                        "without idle workers' spinning)")
    p.add_argument("--stages", action="store_true",
                   help="also the load's parts (numba's start, the header, the model's compute set-up: CPU "
                        "seconds each, in a process of its own) and the resident memory after the load")
    args = p.parse_args(argv)
    trees = args.trees.split(",")
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    results: dict[str, list[dict]] = {tree: [] for tree in trees}
    for r in range(args.rounds):
        for tree in trees if r % 2 == 0 else trees[::-1]:  # the order alternates too
            results[tree].append(one_round(os.path.abspath(args.model), tree, args.threads, args.stages))
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    keys = list(dict.fromkeys(k for tree in trees for k in results[tree][0]))
    print("| measure (median of %d) | %s |" % (args.rounds, " | ".join(trees)))
    print("|---|" + "---|" * len(trees))
    for key in keys:
        unit = "MB" if "RSS" in key else "s"
        cells = [f"{statistics.median(x[key] for x in results[tree]):.{0 if unit == 'MB' else 3}f} {unit}"
                 if key in results[tree][0] else "-" for tree in trees]
        print(f"| {key} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
