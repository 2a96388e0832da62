#!/usr/bin/env python
"""Throughput and latency of `torchggml serve` under N concurrent streaming clients.

    PYTHONPATH=. python scripts/bench_serve.py [MODEL.gguf ...] [-N 8] [-n 32] [-c 1024] [--llama-cpp]

For each model (default: the built-in demo) it starts the server on a loopback port for each run
and drives it with the official `openai` client, every client streaming one completion of -n
tokens (temperature 0.8, its own seed and prompt, `ignore_eos` so each runs to the end):
  1 stream   --parallel 1, one client: the single-stream speed;
  N streams  --parallel 1, N clients at once (the last N of -N): requests wait their turn (no batching);
  N streams  --parallel N, N clients at once, for each N > 1 of -N (e.g. -N 4,8,16): continuous batching.
With --llama-cpp it also runs llama-cpp-python's server (`python -m llama_cpp.server`, which
decodes one request at a time) with N clients on the same file.

Reported per run: generated tokens/s over the wall time (all clients), time to first token
(p50/p99, from the request) and inter-token latency (p50/p99, between a client's chunks), and the
speed-up over the single stream. Tokens are counted from each stream's `usage`.

Batched decode of the engines themselves, on the same file, each in its own process:

    PYTHONPATH=. python scripts/bench_serve.py --engines MODEL.gguf [-N 1,4,8,16] [-n 32] [-r 3] [-t 2]
                                               [--baseline OTHER_CHECKOUT]

N sequences of short prompts, greedy, one token each per step (as llama-batched-bench): torchggml's
decode loop (models/batch_generator.py, the server's and Model.generate_batch's) against llama.cpp
through llama-cpp-python's low-level API (llama_batch of N sequences, one token each per step,
argmax of each row's logits). After the prompts, the n - 1 decode steps are timed: aggregate
tokens/s (all sequences) and its scaling over one sequence. The two workers load the model once
each and are driven in turn (each N, each engine, -r rounds alternated): the medians.
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


# ---------------------------------------------------------------- engines' batched decode

def _greedy_prompts(n: int) -> list[str]:
    return [PROMPTS[i % len(PROMPTS)] + f" {i}" for i in range(n)]


class TorchggmlDecode:
    """N sequences through torchggml's decode loop (BatchGenerator), greedy, to n tokens each."""

    def __init__(self, path: str, n_seqs: int, n_tokens: int, threads: int | None):
        from torchggml.models import load_model
        self.model = load_model(path, n_ctx=n_seqs * (n_tokens + 64), n_threads=threads, progress=False)
        self.n_tokens = n_tokens

    def __call__(self, n_seqs: int) -> tuple[int, float]:
        """(tokens generated by the timed decode steps, their seconds)."""
        from torchggml.models.batch_generator import BatchGenerator
        from torchggml.models.generation import Generation
        from torchggml.models.sampling import SamplingParams
        model = self.model
        model.reset()
        batch = BatchGenerator(model)
        for i, text in enumerate(_greedy_prompts(n_seqs)):
            gen = Generation(model.tokenizer, model.tokenize(text), SamplingParams(temperature=0), self.n_tokens,
                             ignore_eos=True)
            batch.add(gen, i, model.n_ctx // n_seqs)
        while any(seq.prefilling for seq in batch.active):
            batch.step()
        done = sum(seq.gen.n_generated for seq in batch.active)
        start = time.perf_counter()
        while batch.active:
            batch.step()
        seconds = time.perf_counter() - start
        return n_seqs * self.n_tokens - done, seconds


class LlamaCppDecode:
    """N sequences through llama.cpp's llama_decode (llama-cpp-python's low-level API), greedy:
    one llama_batch of all prompts, then one of N tokens (one per sequence) a step."""

    def __init__(self, path: str, n_seqs: int, n_tokens: int, threads: int | None):
        import llama_cpp as lc
        self.lc, self.n_tokens = lc, n_tokens
        lc.llama_backend_init()
        mparams = lc.llama_model_default_params()
        self.model = lc.llama_model_load_from_file(path.encode(), mparams)
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = n_seqs * (n_tokens + 64)
        cparams.n_batch = cparams.n_ubatch = 64 * n_seqs
        cparams.n_seq_max = n_seqs
        cparams.n_threads = cparams.n_threads_batch = threads or os.cpu_count()
        self.ctx = lc.llama_init_from_model(self.model, cparams)
        self.vocab = lc.llama_model_get_vocab(self.model)
        self.n_vocab = lc.llama_vocab_n_tokens(self.vocab)
        self.batch = lc.llama_batch_init(64 * n_seqs, 0, n_seqs)

    def _tokens(self, text: str) -> list[int]:
        buf = (self.lc.llama_token * 256)()
        n = self.lc.llama_tokenize(self.vocab, text.encode(), len(text.encode()), buf, 256, True, True)
        return list(buf[:n])

    def _decode(self, entries) -> None:
        """entries: (token, pos, seq, wants logits) rows of one llama_batch."""
        b = self.batch
        b.n_tokens = len(entries)
        for i, (token, pos, seq, logits) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, logits
            b.seq_id[i][0] = seq
        if self.lc.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")

    def _argmax(self, row: int) -> int:
        import numpy as np
        logits = np.ctypeslib.as_array(self.lc.llama_get_logits_ith(self.ctx, row), shape=(self.n_vocab,))
        return int(logits.argmax())

    def __call__(self, n_seqs: int) -> tuple[int, float]:
        self.lc.llama_memory_clear(self.lc.llama_get_memory(self.ctx), True)
        prompts = [self._tokens(t) for t in _greedy_prompts(n_seqs)]
        entries = [(t, p, s, p == len(ids) - 1) for s, ids in enumerate(prompts) for p, t in enumerate(ids)]
        self._decode(entries)
        rows = [i for i, e in enumerate(entries) if e[3]]
        last = [self._argmax(r) for r in rows]
        pos = [len(ids) for ids in prompts]
        start = time.perf_counter()
        for _ in range(self.n_tokens - 1):
            self._decode([(last[s], pos[s], s, True) for s in range(n_seqs)])
            last = [self._argmax(s) for s in range(n_seqs)]
            pos = [p + 1 for p in pos]
        return n_seqs * (self.n_tokens - 1), time.perf_counter() - start


ENGINES = {"torchggml": TorchggmlDecode, "llama.cpp": LlamaCppDecode}


def worker(engine: str, path: str, max_seqs: int, n_tokens: int, threads: int | None, root: str | None) -> int:
    """An engine's process: loads the model, then for each N read from stdin prints 'tokens seconds'.
    root: the checkout whose torchggml runs (a baseline), else this one's."""
    import json
    if root:
        sys.path.insert(0, os.path.abspath(root))
    run = ENGINES[engine](path, max_seqs, n_tokens, threads)
    run(1)  # warm-up: graphs, kernels, first touch of the weights
    print("ready", flush=True)
    for line in sys.stdin:
        tokens, seconds = run(int(line))
        print(json.dumps([tokens, seconds]), flush=True)
    return 0


def engines_table(path: str, ns: list[int], n_tokens: int, rounds: int, threads: int | None,
                  baseline: str | None = None) -> list[tuple]:
    """Each engine's median aggregate decode tokens/s for each N, the engines driven in turn
    (baseline: also torchggml from that checkout)."""
    import json
    procs = {}
    workers = [(engine, engine, None) for engine in ENGINES]
    if baseline:
        workers.insert(1, (f"torchggml ({baseline})", "torchggml", baseline))
    for label, engine, root in workers:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", engine, path, "-N", str(max(ns)),
               "-n", str(n_tokens)] + (["-t", str(threads)] if threads else []) + (["--root", root] if root else [])
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        procs[label] = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, text=True)
        if procs[label].stdout.readline().strip() != "ready":
            raise RuntimeError(f"the {label} worker did not start")
    speeds = {(e, n): [] for e in procs for n in ns}
    try:
        for _ in range(rounds):
            for n in ns:
                for engine, proc in procs.items():
                    proc.stdin.write(f"{n}\n")
                    proc.stdin.flush()
                    tokens, seconds = json.loads(proc.stdout.readline())
                    speeds[engine, n].append(tokens / seconds)
    finally:
        for proc in procs.values():
            proc.stdin.close()
            proc.wait(timeout=60)
    rows = []
    for engine in procs:
        one = statistics.median(speeds[engine, ns[0]])
        for n in ns:
            tps = statistics.median(speeds[engine, n])
            rows.append((os.path.basename(path), engine, n, f"{tps:.1f}", f"{tps / one:.2f}"))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", help="GGUF files (default: the built-in demo model)")
    ap.add_argument("-N", "--clients", default="8", help="clients (sequences): one number, or a list for --engines")
    ap.add_argument("-n", "--tokens", type=int, default=32, help="tokens each client generates")
    ap.add_argument("-c", "--ctx", type=int, default=1024, help="the server's n_ctx (shared by the slots)")
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--llama-cpp", action="store_true", help="also run llama-cpp-python's server")
    ap.add_argument("--engines", action="store_true", help="batched decode of torchggml and llama.cpp (no server)")
    ap.add_argument("-r", "--rounds", type=int, default=3, help="--engines: rounds of the engines in turn")
    ap.add_argument("--baseline", help="--engines: also torchggml from this checkout (e.g. main's), alternated")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    ns = [int(n) for n in args.clients.split(",")]
    if args.worker:
        return worker(args.worker, args.models[0], max(ns), args.tokens, args.threads, args.root)
    if args.engines:
        from torchggml.tools.bench import markdown_table
        rows = [row for path in args.models
                for row in engines_table(path, ns, args.tokens, args.rounds, args.threads, args.baseline)]
        print(markdown_table(("model", "engine", "sequences", "decode tok/s", "x 1 sequence"), rows))
        return 0
    args.clients = ns[-1]
    from torchggml.gguf.writer.demo import demo_model_path
    paths = args.models or [demo_model_path()]
    header = ("model", "server", "clients", "tokens", "tok/s", "x 1 stream", "TTFT p50/p99 ms", "ITL p50/p99 ms")
    rows = []
    for path in paths:
        name = os.path.basename(path)
        runs = [("torchggml --parallel 1", 1, 1), ("torchggml --parallel 1", 1, args.clients)]
        runs += [(f"torchggml --parallel {n}", n, n) for n in ns if n > 1]  # each N of -N 4,8,16
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
