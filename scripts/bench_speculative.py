"""Decode speed with speculative decoding against plain decoding, same target, greedy.

    python scripts/bench_speculative.py [MODEL.gguf] [--draft DRAFT.gguf] [--n-draft 8] [-n 128] [--rounds 3]

MODEL defaults to the 168M benchmark model (scripts/bench_model.py --shape small, Q4_0). The prompt
repeats a passage, as summaries, edits and code completions repeat their context, so prompt
lookup ("ngram") finds drafts; --draft adds a draft model of the same vocabulary. Rounds alternate
the modes in one process; prints tokens/s (median), acceptance and whether the text is plain
decoding's.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_model import bench_models, cpu_header  # noqa: E402

from torchggml.models import load_model  # noqa: E402

PASSAGE = ("The scheduler cuts the graph into splits, one per device, and copies each split's inputs "
           "from the device that computed them. ")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--draft", default=None, help="a draft model of the same vocabulary")
    ap.add_argument("--n-draft", type=int, default=8)
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    path = args.model or bench_models(["Q4_0"], "small")[0]
    model = load_model(path, n_ctx=2048, progress=False)
    prompt = model.tokenize(PASSAGE * 6)
    modes = {"plain": None, "ngram": "ngram"}
    if args.draft:
        modes["draft model"] = load_model(args.draft, n_ctx=2048, progress=False)
    print(cpu_header())
    print(f"{os.path.basename(path)}: prompt {len(prompt)} tokens, {args.n_predict} generated, greedy")
    list(model.generate(prompt, max_tokens=8, temperature=0, draft="ngram"))  # warm-up
    speeds, texts, accept = {m: [] for m in modes}, {}, {}
    for _ in range(args.rounds):
        for name, draft in modes.items():
            start = time.perf_counter()
            texts[name] = "".join(model.generate(prompt, max_tokens=args.n_predict, temperature=0,
                                                 draft=draft, n_draft=args.n_draft))
            t = model.timings
            speeds[name].append(t.gen_tokens / t.gen_s)
            accept[name] = (t.accepted, t.drafted)
    base = statistics.median(speeds["plain"])
    print("| mode | tokens/s | vs plain | drafts taken | same text |")
    print("| --- | --- | --- | --- | --- |")
    for name in modes:
        tps = statistics.median(speeds[name])
        taken = f"{accept[name][0]}/{accept[name][1]}" if accept[name][1] else "-"
        print(f"| {name} | {tps:.1f} | {tps / base:.2f}x | {taken} | {texts[name] == texts['plain']} |")


if __name__ == "__main__":
    main()
