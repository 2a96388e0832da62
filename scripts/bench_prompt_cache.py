"""Time to first token of each turn of a chat, with and without the server engine's prompt cache.

    python scripts/bench_prompt_cache.py [--shape small|1b] [--type Q4_0] [--turns 5] [--turn-tokens 216]

Each turn adds --turn-tokens tokens to the conversation, the last reply (--reply-tokens) included, as
a chat client resends its whole history; the engine is the server's (torchggml.server.engine). The
two conversations, with the cache and without, run in one process on two engines over two loads of
the model, their turns alternated. With the cache, turn k evaluates only what turn k-1 did not; without
it, the whole conversation. Both evaluate in chunks of --turn-tokens (n_batch) from cells laid out
alike, so they do the same arithmetic on every token (a prompt split elsewhere, or attending over
differently padded cells, rounds differently, and on random weights a flat argmax can flip): the
script asserts that both give the same replies (temperature 0). Prints each turn's prompt length,
tokens found in the slot and time to first token.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_model import bench_models, cpu_header  # noqa: E402

from torchggml.models import load_model  # noqa: E402
from torchggml.models.generation import Generation  # noqa: E402
from torchggml.models.sampling import SamplingParams  # noqa: E402
from torchggml.server.engine import Engine, Job  # noqa: E402


def conversations(models, turns: int, turn_tokens: int, reply_tokens: int):
    """The same conversation on models[True] with the prompt cache and on models[False] without,
    turn by turn alternated (which goes first alternates too): {cache: [(prompt tokens, cached,
    TTFT, reply)]}."""
    engines = {cache: Engine(m, parallel=1) for cache, m in models.items()}
    rows = {True: [], False: []}
    ids = {True: [], False: []}
    try:
        for k in range(turns):
            for cache in ((True, False) if k % 2 == 0 else (False, True)):
                new = turn_tokens - (reply_tokens if k else 0)  # the reply is part of the turn
                ids[cache] = ids[cache] + [(7 * (len(ids[cache]) + i)) % (models[cache].n_vocab - 1) + 1
                                           for i in range(new)]
                done, first = threading.Event(), []

                def emit(event):
                    if event[0] == "token" and not first:
                        first.append(time.perf_counter())
                    if event[0] in ("done", "error"):
                        done.set()

                gen = Generation(models[cache].tokenizer, ids[cache], SamplingParams(temperature=0), reply_tokens,
                                 ignore_eos=True)
                job = Job(ids[cache], emit, gen, cache_prompt=cache)
                start = time.perf_counter()
                engines[cache].submit([job])
                done.wait()
                reply = [c.token for c in job.gen.choices]
                rows[cache].append((len(ids[cache]), job.n_cached, first[0] - start, reply))
                ids[cache] = ids[cache] + reply
    finally:
        for e in engines.values():
            e.stop()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="small", choices=("small", "1b"))
    ap.add_argument("--type", default="Q4_0")
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--turn-tokens", type=int, default=216)
    ap.add_argument("--reply-tokens", type=int, default=16)
    args = ap.parse_args()
    if not 0 < args.reply_tokens < args.turn_tokens:
        ap.error("--reply-tokens must be positive and smaller than --turn-tokens")
    path = bench_models([args.type], args.shape)[0]
    n_ctx = args.turns * args.turn_tokens + 64
    models = {cache: load_model(path, n_ctx=n_ctx, n_batch=args.turn_tokens, progress=False) for cache in (True, False)}
    print(cpu_header())
    print(f"{args.shape} {args.type}: {args.turns} turns of {args.turn_tokens} tokens (the reply's "
          f"{args.reply_tokens} included), n_batch {args.turn_tokens}")
    conversations(models, 2, args.turn_tokens, args.reply_tokens)  # warm-up: kernels and graphs
    runs = conversations(models, args.turns, args.turn_tokens, args.reply_tokens)
    print("| turn | prompt tokens | found in the slot | TTFT with cache | TTFT without | ratio |")
    print("| --- | --- | --- | --- | --- | --- |")
    for k, (a, b) in enumerate(zip(runs[True], runs[False]), 1):
        print(f"| {k} | {a[0]} | {a[1]} | {a[2]:.2f} s | {b[2]:.2f} s | {b[2] / a[2]:.1f}x |")
    differ = [k for k, (a, b) in enumerate(zip(runs[True], runs[False]), 1) if a[3] != b[3]]
    assert not differ, f"the replies of turns {differ} differ with the cache"
    print("replies identical with and without the cache (checked)")
    for m in models.values():
        m.close()


if __name__ == "__main__":
    main()
