"""Time to first token of each turn of a chat, with and without the server engine's prompt cache.

    python scripts/bench_prompt_cache.py [--shape small|1b] [--type Q4_0] [--turns 5] [--turn-tokens 200]

Each turn appends --turn-tokens tokens to the conversation (the last reply included), as a chat
client resends its whole history; the engine is the server's (torchggml.server.engine). The two
conversations run in one process, their turns alternated. With the cache, turn k evaluates only
what turn k-1 did not; without it, the whole conversation. Prints each turn's prompt length, tokens
found in the slot and time to first token, and asserts that both give the same replies
(temperature 0).
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


def conversations(model, turns: int, turn_tokens: int, reply_tokens: int):
    """The same conversation twice, turn by turn alternated (which goes first alternates too):
    with the prompt cache and without. One engine, two slots: the cached conversation keeps its
    slot (a request without the cache takes the other, empty or least recently used)."""
    engine = Engine(model, parallel=2)
    rows = {True: [], False: []}
    ids = {True: [], False: []}
    try:
        for k in range(turns):
            for cache in ((True, False) if k % 2 == 0 else (False, True)):
                ids[cache] = ids[cache] + [(7 * (len(ids[cache]) + i)) % (model.n_vocab - 1) + 1
                                           for i in range(turn_tokens)]
                done, first = threading.Event(), []

                def emit(event):
                    if event[0] == "token" and not first:
                        first.append(time.perf_counter())
                    if event[0] in ("done", "error"):
                        done.set()

                job = Job(ids[cache], emit, Generation(model.tokenizer, ids[cache], SamplingParams(temperature=0),
                                                       reply_tokens, ignore_eos=True), cache_prompt=cache)
                start = time.perf_counter()
                engine.submit([job])
                done.wait()
                reply = [c.token for c in job.gen.choices]
                rows[cache].append((len(ids[cache]), job.n_cached, first[0] - start, reply))
                ids[cache] = ids[cache] + reply
    finally:
        engine.stop()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="small", choices=("small", "1b"))
    ap.add_argument("--type", default="Q4_0")
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--turn-tokens", type=int, default=200)
    ap.add_argument("--reply-tokens", type=int, default=16)
    args = ap.parse_args()
    path = bench_models([args.type], args.shape)[0]
    # both conversations' cells at once: the cached one's idle slot keeps its cells beside the other
    n_ctx = 2 * args.turns * (args.turn_tokens + args.reply_tokens) + 64
    model = load_model(path, n_ctx=n_ctx, progress=False)
    print(cpu_header())
    print(f"{args.shape} {args.type}: {args.turns} turns of {args.turn_tokens} tokens, replies of {args.reply_tokens}")
    conversations(model, 2, 32, 2)  # warm-up: kernels and graphs
    runs = conversations(model, args.turns, args.turn_tokens, args.reply_tokens)
    print("| turn | prompt tokens | found in the slot | TTFT with cache | TTFT without | ratio |")
    print("| --- | --- | --- | --- | --- | --- |")
    for k, (a, b) in enumerate(zip(runs[True], runs[False]), 1):
        print(f"| {k} | {a[0]} | {a[1]} | {a[2]:.2f} s | {b[2]:.2f} s | {b[2] / a[2]:.1f}x |")
    assert all(a[3] == b[3] for a, b in zip(runs[True], runs[False])), "the replies differ with the cache"
    print("replies identical with and without the cache (checked)")
    model.close()


if __name__ == "__main__":
    main()
