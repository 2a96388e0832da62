#!/usr/bin/env python
"""Decode and prompt speed under each thread policy, with and without a busy process on one core
(docs/cpu.md), beside llama.cpp under the same conditions.

    python scripts/bench_threads.py MODEL.gguf [...] [-p 32] [-n 32] [-r 3] [--rounds 2] [--busy-core 1]

Per model, round after round, each condition in turn ("alone": nothing started by this script;
"busy": `python -c "while True: pass"` pinned to --busy-core with taskset) and each setup in
turn within it, every run a fresh process (scripts/bench_model.py --engine):
  torchggml             the defaults (TORCHGGML_CPU_THREADS=adaptive, TORCHGGML_OMP_WAIT=auto)
  torchggml fixed       TORCHGGML_CPU_THREADS=fixed, TORCHGGML_OMP_WAIT=default (the policy before)
  torchggml fixed+PASSIVE  the same with OMP_WAIT_POLICY=PASSIVE (the advice before)
  llama.cpp, llama.cpp PASSIVE  (when llama-cpp-python is installed)
Figures: medians over the rounds of each run's median (pp: tokens/s of a P-token prompt; tg: of N
single-token calls). "alone" is only as quiet as the machine is: the load average is printed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).with_name("bench_model.py")
SETUPS = [("torchggml", "torchggml", {}),
          ("torchggml fixed", "torchggml", {"TORCHGGML_CPU_THREADS": "fixed", "TORCHGGML_OMP_WAIT": "default"}),
          ("torchggml fixed+PASSIVE", "torchggml", {"TORCHGGML_CPU_THREADS": "fixed", "OMP_WAIT_POLICY": "PASSIVE"}),
          ("llama.cpp", "llama.cpp", {}),
          ("llama.cpp PASSIVE", "llama.cpp", {"OMP_WAIT_POLICY": "PASSIVE"})]


def run(engine: str, env: dict, model: str, args) -> dict | None:
    cmd = [sys.executable, str(BENCH), "--engine", engine, model, "-p", str(args.n_prompt), "-n", str(args.n_gen),
           "-r", str(args.reps)] + (["-t", str(args.threads)] if args.threads else [])
    base = {k: v for k, v in os.environ.items()
            if k not in ("OMP_WAIT_POLICY", "TORCHGGML_CPU_THREADS", "TORCHGGML_OMP_WAIT")}
    try:
        out = subprocess.run(cmd, env={**base, **env}, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return None  # collapsed: reported as such
    return json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+")
    p.add_argument("-p", "--n-prompt", type=int, default=32)
    p.add_argument("-n", "--n-gen", type=int, default=32)
    p.add_argument("-r", "--reps", type=int, default=3)
    p.add_argument("-t", "--threads", type=int, default=None)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--busy-core", type=int, default=1)
    p.add_argument("--timeout", type=float, default=300, help="seconds a run may take (then: timed out)")
    p.add_argument("--setups", default=None, help="comma-separated setup names (default: all)")
    args = p.parse_args(argv)
    try:
        import llama_cpp  # noqa: F401
        with_llama = True
    except ImportError:
        with_llama = False
    setups = [s for s in SETUPS if (with_llama or s[1] != "llama.cpp")
              and (args.setups is None or s[0] in args.setups.split(","))]
    for model in args.models:
        results = {(c, s[0]): [] for c in ("alone", "busy") for s in setups}
        loads = []
        for _ in range(args.rounds):
            for condition in ("alone", "busy"):
                busy = (subprocess.Popen(["taskset", "-c", str(args.busy_core), sys.executable, "-c", "while True: pass"])
                        if condition == "busy" else None)
                try:
                    for name, engine, env in setups:
                        loads.append(os.getloadavg()[0])
                        results[(condition, name)].append(run(engine, env, model, args))
                finally:
                    if busy is not None:
                        busy.kill()
                        busy.wait()
        print(f"{os.path.basename(model)}: pp{args.n_prompt}, tg{args.n_gen}, {args.rounds} rounds, load average "
              f"{min(loads):.1f}-{max(loads):.1f} during the runs (before this script's busy process)")
        print(f"{'setup':26s} {'pp alone':>9s} {'pp busy':>9s} {'tg alone':>9s} {'tg busy':>9s} {'busy/alone':>10s}")
        for name, _, _ in setups:
            cells = []
            for test in ("pp", "tg"):
                for condition in ("alone", "busy"):
                    runs = [r[test] for r in results[(condition, name)] if r is not None]
                    cells.append(statistics.median(runs) if runs else None)
            fmt = " ".join(f"{c:9.2f}" if c is not None else f"{'timeout':>9s}" for c in cells)
            ratio = f"{cells[3] / cells[2]:10.2f}" if cells[2] and cells[3] else f"{'-':>10s}"
            print(f"{name:26s} {fmt} {ratio}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
