"""Pipeline parallel across processes: a model's layers split over two torchggml rpc-server
processes on loopback and the local CPU (the output head), against the same model local.

    PYTHONPATH=. python scripts/bench_rpc_pipeline.py [MODEL.gguf ...] [--tokens 32] [--prompt 16]

For each model: prompt tokens/s, decode tokens/s, and the bytes each decode token sends and
receives over the RPC connections (activations between the scheduler's splits, the graphs,
the synchronisation), plus the logits' relative difference to the local run. Writes a
markdown table. The servers run on this machine: on a shared or small machine the split runs
compete with each other for the same cores, so the figures show the protocol's cost, not a
speed-up.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(os.environ.get("TORCHGGML_GOLDEN", ROOT.parent / "shared" / "golden"))


def start_server() -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "torchggml", "rpc-server", "--port", "0", "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    for line in proc.stdout:
        if "endpoint" in line:
            return proc, line.split(":", 1)[1].strip()
    raise RuntimeError("rpc-server did not start")


def run(model, tokens, n_prompt):
    model.reset()
    t0 = time.perf_counter()
    rows = [model.eval(tokens[:n_prompt]).numpy()]
    t1 = time.perf_counter()
    for t in tokens[n_prompt:]:
        rows.append(model.eval([t]).numpy())
    t2 = time.perf_counter()
    return np.concatenate(rows), n_prompt / (t1 - t0), (len(tokens) - n_prompt) / (t2 - t1)


def traffic(endpoints) -> int:
    from torchggml.devices.rpc.client import connection
    return sum(connection(e).bytes_sent + connection(e).bytes_received for e in endpoints)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=[str(GOLDEN / "models" / "llama-F16.gguf"),
                                                  str(GOLDEN / "models" / "llama-Q4_0.gguf")])
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3, help="runs per setup; the best is reported")
    args = ap.parse_args()
    from torchggml.models import load_model
    from torchggml.devices.rpc import close_connection
    servers = [start_server(), start_server()]
    endpoints = [ep for _, ep in servers]
    rows = []
    try:
        for path in args.models:
            rng = np.random.default_rng(0)
            # one thread everywhere (the servers run with --threads 1), CPU weights in ggml's
            # layout as the servers keep them
            local = load_model(path, progress=False, repack=False, n_threads=1)
            tokens = [int(t) for t in rng.integers(1, local.n_vocab, args.tokens)]
            split = load_model(path, rpc=endpoints, tensor_split=[1, 1, 0], progress=False, repack=False, n_threads=1)
            run(local, tokens, args.prompt), run(split, tokens, args.prompt)  # warm-up: kernels compiled, caches filled
            ref, lp, ld = max((run(local, tokens, args.prompt) for _ in range(args.repeat)), key=lambda r: r[2])
            best = None
            for _ in range(args.repeat):
                before = traffic(endpoints)
                out = run(split, tokens, args.prompt)
                moved = traffic(endpoints) - before
                if best is None or out[2] > best[0][2]:
                    best = (out, moved)
            (logits, sp, sd), moved = best
            # bytes per decode token: one run's traffic minus the prompt's share, measured apart
            split.reset()
            before = traffic(endpoints)
            split.eval(tokens[:args.prompt])
            prompt_bytes = traffic(endpoints) - before
            per_token = (moved - prompt_bytes) / (args.tokens - args.prompt)
            err = float(np.linalg.norm(logits - ref) / np.linalg.norm(ref))
            layers = ", ".join(d.get_name() for d in split.placement.layers)
            rows.append((Path(path).name, layers, f"{lp:.0f}", f"{sp:.0f}", f"{ld:.1f}", f"{sd:.1f}",
                         f"{per_token / 1024:.1f}", f"{prompt_bytes / 1024:.0f}", f"{err:.1e}"))
    finally:
        for proc, ep in servers:
            close_connection(ep)
            proc.terminate()
            proc.wait(10)
    header = ("model", "layers (output on CPU)", "prompt tok/s local", "prompt tok/s split", "decode tok/s local",
              "decode tok/s split", "KiB per decode token", f"KiB for the {args.prompt}-token prompt", "rel. diff")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
