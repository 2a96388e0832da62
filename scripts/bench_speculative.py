"""Decode speed with speculative decoding against plain decoding, same target, greedy.

    python scripts/bench_speculative.py [MODEL.gguf] [--draft DRAFT.gguf] [--n-draft 8] [-n 128] [--rounds 3]
                                        [--steps] [--half-convert-rows N]

MODEL defaults to the 168M benchmark model (scripts/bench_model.py --shape small, Q4_0). The prompt
repeats a passage, as summaries, edits and code completions repeat their context, so prompt
lookup ("ngram") finds drafts; --draft adds a draft model of the same vocabulary. Rounds alternate
the modes in one process; prints tokens/s (median) and acceptance, and fails unless every mode's
text is plain decoding's.

--steps also times, alternated, the pieces of a speculative round: the target's decode step (1
row), its verify step (1 + n_draft rows) and the draft model's step; with --half-convert-rows N
the verify step is timed again with F16 weights converted to f32 from N rows (the library converts
from products.HALF_CONVERT_ROWS rows; below, torch's half GEMM).

A target many times its draft's cost, from a real model: scripts/make_deep_target.py.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_model import bench_models, cpu_header  # noqa: E402

from torchggml.devices.cpu import products  # noqa: E402
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
    ap.add_argument("--steps", action="store_true", help="also time the decode, verify and draft steps")
    ap.add_argument("--half-convert-rows", type=int, default=None,
                    help="with --steps: also time the verify step with F16 weights converted from this many rows")
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
    if args.steps:
        step_costs(model, modes.get("draft model"), prompt, args.n_draft, args.half_convert_rows)
    differ = [name for name in modes if texts[name] != texts["plain"]]
    if differ:
        raise SystemExit(f"the text of {', '.join(differ)} differs from plain decoding's")


def step_costs(model, draft, prompt, n_draft: int, convert_rows: int | None, reps: int = 15) -> None:
    """Median ms of the target's decode step (1 row), its verify step (1 + n_draft rows) and the
    draft's step, alternated, each after the prompt (the rows written are dropped again)."""
    kinds = {"target decode (1 row)": (model, 1, None), f"target verify ({1 + n_draft} rows)": (model, 1 + n_draft, None)}
    if convert_rows is not None:
        kinds[f"target verify, F16 converted from {convert_rows} rows"] = (model, 1 + n_draft, convert_rows)
    if draft is not None:
        kinds["draft step (1 row)"] = (draft, 1, None)
    for m in {id(m): m for m, _, _ in kinds.values()}.values():
        m.reset()
        m.eval(prompt)
    times = {k: [] for k in kinds}
    default = products.HALF_CONVERT_ROWS
    try:
        for _ in range(reps):
            for name, (m, rows, convert) in kinds.items():
                products.HALF_CONVERT_ROWS = default if convert is None else convert
                start = time.perf_counter()
                m.eval(prompt[-rows:], logits="all")
                times[name].append(time.perf_counter() - start)
                m.keep_prefix(0, len(prompt))
    finally:
        products.HALF_CONVERT_ROWS = default
    decode = statistics.median(times["target decode (1 row)"])
    print("| step | ms (median) | vs target decode |")
    print("| --- | --- | --- |")
    for name, t in times.items():
        print(f"| {name} | {statistics.median(t) * 1e3:.1f} | {statistics.median(t) / decode:.2f}x |")


if __name__ == "__main__":
    main()
