#!/usr/bin/env python
"""Throughput and latency of `torchggml serve` under N concurrent streaming clients.

    PYTHONPATH=. python scripts/bench_serve.py [MODEL.gguf ...] [-N 8] [-n 32] [-c 1024] [--llama-cpp]

For each model (default: the built-in demo) it starts the server three times on a loopback port
and drives it with the official `openai` client, every client streaming one completion of -n
tokens (temperature 0.8, its own seed and prompt, `ignore_eos` so each runs to the end):
  1 stream   --parallel 1, one client: the single-stream speed;
  N streams  --parallel 1, N clients at once: requests wait their turn (no batching);
  N streams  --parallel N, N clients at once: continuous batching.
With --llama-cpp it also runs llama-cpp-python's server (`python -m llama_cpp.server`, which
decodes one request at a time) with N clients on the same file.

Reported per run: generated tokens/s over the wall time (all clients), time to first token
(p50/p99, from the request) and inter-token latency (p50/p99, between a client's chunks), and the
speed-up over the single stream. Tokens are counted from each stream's `usage`.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

PROMPTS = ["Once upon a time there was", "The scheduler cuts the graph", "A graph is a list of operations",
           "The memory planner gives every tensor", "Numbers 0 1 2 3 4", "The people who used it wanted",
           "Matrix products are the largest cost", "When the cache was full, it stopped"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], port: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    log = tempfile.TemporaryFile(mode="w+")  # a pipe left unread would fill and block a chatty server
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"{' '.join(cmd)} exited: {log.read()[-2000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2)
            return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{' '.join(cmd)} did not start")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def drive(port: int, clients: int, n_tokens: int) -> dict:
    """N concurrent streaming completions; tokens/s and latency percentiles."""
    import openai
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=3600)
    model = client.models.list().data[0].id
    ttft, itl, tokens, errors = [], [], [], []
    lock = threading.Lock()

    def one(i: int) -> None:
        try:
            t0 = time.perf_counter()
            stream = client.completions.create(model=model, prompt=PROMPTS[i % len(PROMPTS)], max_tokens=n_tokens,
                                               temperature=0.8, seed=i, stream=True,
                                               stream_options={"include_usage": True},
                                               extra_body={"ignore_eos": True})
            times, used = [], None
            for chunk in stream:
                if chunk.choices and chunk.choices[0].text:
                    times.append(time.perf_counter())
                if chunk.usage is not None:
                    used = chunk.usage.completion_tokens
            with lock:
                if times:
                    ttft.append(times[0] - t0)
                    itl.extend(b - a for a, b in zip(times, times[1:]))
                tokens.append(used if used is not None else len(times))
        except Exception as e:  # noqa: BLE001 - reported in the table
            with lock:
                errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    start_t = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start_t

    def pct(values, q):
        return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else (values or [0])[0]

    return {"tokens": sum(tokens), "wall": wall, "tps": sum(tokens) / wall, "errors": errors,
            "ttft50": pct(ttft, 50), "ttft99": pct(ttft, 99), "itl50": pct(itl, 50), "itl99": pct(itl, 99)}


def run_torchggml(path: str, parallel: int, clients: int, n_tokens: int, ctx: int, threads: int | None) -> dict:
    port = free_port()
    cmd = [sys.executable, "-m", "torchggml", "serve", path, "--port", str(port), "--parallel", str(parallel),
           "-c", str(ctx), "--queue-size", str(clients)]
    if threads:
        cmd += ["-t", str(threads)]
    proc = start(cmd, port)
    try:
        drive(port, 1, 2)  # warm-up: graphs, caches
        return drive(port, clients, n_tokens)
    finally:
        stop(proc)


def run_llama_cpp(path: str, clients: int, n_tokens: int, ctx: int, threads: int | None) -> dict:
    port = free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", path, "--port", str(port), "--n_ctx", str(ctx)]
    if threads:
        cmd += ["--n_threads", str(threads)]
    proc = start(cmd, port)
    try:
        drive(port, 1, 2)
        return drive(port, clients, n_tokens)
    finally:
        stop(proc)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", help="GGUF files (default: the built-in demo model)")
    ap.add_argument("-N", "--clients", type=int, default=8)
    ap.add_argument("-n", "--tokens", type=int, default=32, help="tokens each client generates")
    ap.add_argument("-c", "--ctx", type=int, default=1024, help="the server's n_ctx (shared by the slots)")
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--llama-cpp", action="store_true", help="also run llama-cpp-python's server")
    args = ap.parse_args(argv)
    from torchggml.gguf.writer.demo import demo_model_path
    paths = args.models or [demo_model_path()]
    header = ("model", "server", "clients", "tokens", "tok/s", "x 1 stream", "TTFT p50/p99 ms", "ITL p50/p99 ms")
    rows = []
    for path in paths:
        name = os.path.basename(path)
        runs = [("torchggml --parallel 1", 1, 1), (f"torchggml --parallel 1", 1, args.clients),
                (f"torchggml --parallel {args.clients}", args.clients, args.clients)]
        base = None
        for label, parallel, clients in runs:
            r = run_torchggml(path, parallel, clients, args.tokens, args.ctx, args.threads)
            base = base or r["tps"]
            rows.append((name, label, clients, r, r["tps"] / base))
            print(_row(rows[-1]), file=sys.stderr, flush=True)
        if args.llama_cpp:
            r = run_llama_cpp(path, args.clients, args.tokens, args.ctx, args.threads)
            rows.append((name, "llama-cpp-python server", args.clients, r, r["tps"] / base))
            print(_row(rows[-1]), file=sys.stderr, flush=True)
    from torchggml.tools.bench import markdown_table
    print(markdown_table(header, [_row(r) for r in rows]))
    return 0


def _row(row) -> tuple:
    name, label, clients, r, speedup = row
    errors = f" ({len(r['errors'])} errors: {r['errors'][0][:60]})" if r["errors"] else ""
    return (name, label + errors, clients, r["tokens"], f"{r['tps']:.1f}", f"{speedup:.2f}",
            f"{1000 * r['ttft50']:.0f} / {1000 * r['ttft99']:.0f}", f"{1000 * r['itl50']:.1f} / {1000 * r['itl99']:.1f}")


if __name__ == "__main__":
    sys.exit(main())
