#!/usr/bin/env python
"""Peak memory (max RSS) and time of the CLI's everyday commands, under `/usr/bin/time -v`
(Debian's `time` package), beside llama.cpp's perplexity:

    python scripts/bench_memory.py [--run-model SMOL.gguf] [--ppl-model GEMMA.gguf] [-c 2048]
                                   [--llama-perplexity PATH]

rows: `torchggml --version`; `torchggml run MODEL -n 1` (a cached model to its first token);
`torchggml perplexity MODEL -c N` on tests/data/real_models/text.txt repeated to 4 windows; and, when a
llama-perplexity binary is given or on PATH (build that target alone from llama.cpp's tree:
`cmake --build BUILD --target llama-perplexity`), the same perplexity by llama.cpp, same
windows, same threads; without one, llama-perplexity's method through libllama
(scripts/libllama_perplexity.py, llama-cpp-python). The engines run with their bytecode cached, as bench_model.py's
(engine_env). Each command runs once: read the figures of a busy machine as such.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

from bench_model import engine_env

REAL = os.path.expanduser(os.environ.get("TORCHGGML_REAL_MODELS", "~/.cache/torchggml/real"))
TEXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "real_models", "text.txt")
FIELDS = {"rss": "Maximum resident set size (kbytes)", "wall": "Elapsed (wall clock) time (h:mm:ss or m:ss)",
          "user": "User time (seconds)", "sys": "System time (seconds)"}


def timed(cmd: list[str], env: dict | None = None, cwd: str | None = None) -> dict:
    """/usr/bin/time -v's figures for cmd: max RSS (MB), wall and CPU (user + system) seconds,
    and its stdout ("out"). env: variables set over engine_env()'s."""
    out = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, cwd=cwd,
                         env={**engine_env(), **(env or {})})
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit code {out.returncode}): {out.stderr[-1500:]}")
    found = {}
    for key, label in FIELDS.items():
        m = re.search(re.escape(label) + r":\s*(\S+)", out.stderr)
        found[key] = m.group(1) if m else "?"
    wall = found["wall"].split(":")
    return {"rss": int(found["rss"]) / 1024, "wall": sum(float(x) * 60 ** i for i, x in enumerate(reversed(wall))),
            "cpu": float(found["user"]) + float(found["sys"]), "out": out.stdout}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-model", default=os.path.join(REAL, "SmolLM2-135M-Instruct.Q4_1.gguf"))
    p.add_argument("--ppl-model", default=os.path.join(REAL, "gemma-3-270m-q4_k_m.gguf"))
    p.add_argument("-c", "--ctx-size", type=int, default=2048)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--llama-perplexity", default=shutil.which("llama-perplexity"), metavar="PATH",
                   help="llama.cpp's perplexity binary (default: the one on PATH)")
    args = p.parse_args(argv)
    if not os.path.exists("/usr/bin/time"):
        print("needs /usr/bin/time (apt-get install time)", file=sys.stderr)
        return 2
    # the text repeated to 4 windows of -c tokens (it holds ~1400 tokens), the same file for both
    text = os.path.join(tempfile.mkdtemp(prefix="bench-memory-"), "text.txt")
    with open(TEXT) as f, open(text, "w") as out:
        out.write(f.read() * (4 * args.ctx_size // 1400 + 1))
    me = [sys.executable, "-m", "torchggml"]
    rows = [("torchggml --version", me + ["--version"]),
            ("torchggml run -n 1", me + ["run", args.run_model, "-p", "Hello", "-n", "1", "--temp", "0",
                                         "-t", str(args.threads)]),
            (f"torchggml perplexity -c {args.ctx_size}", me + ["perplexity", args.ppl_model, "-f", text,
                                                               "-c", str(args.ctx_size), "-t", str(args.threads)])]
    if args.llama_perplexity:
        rows.append((f"llama-perplexity -c {args.ctx_size}", [args.llama_perplexity, "-m", args.ppl_model, "-f", text,
                                                              "-c", str(args.ctx_size), "-t", str(args.threads)]))
    else:  # the same method through llama-cpp-python's library (the Python process adds ~0.05 GB)
        print("no llama-perplexity binary (--llama-perplexity PATH): llama.cpp's row runs its method through "
              "libllama (scripts/libllama_perplexity.py)", file=sys.stderr)
        rows.append((f"libllama perplexity -c {args.ctx_size}", [
            sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "libllama_perplexity.py"),
            args.ppl_model, text, str(args.ctx_size), str(args.threads)]))
    print("| command | max RSS MB | wall s | CPU s |\n| --- | --- | --- | --- |")
    for name, cmd in rows:
        r = timed(cmd)
        print(f"| {name} | {r['rss']:.0f} | {r['wall']:.2f} | {r['cpu']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
