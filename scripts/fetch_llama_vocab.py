"""Fill a cache directory with llama.cpp's tokenizer test vocabularies.

llama.cpp keeps vocabulary-only GGUF files with test vectors in its repository
(models/ggml-vocab-NAME.gguf with .inp/.out). The .inp/.out text files are small and
committed in tests/data/vocab; the .gguf files (0.6-8 MB) are not: this script copies them
from a llama.cpp git directory (a clone, or a bare mirror) into the cache that
tests/test_tokenizer.py reads ($TORCHGGML_VOCAB_CACHE, default ~/.cache/torchggml/vocab).

    python scripts/fetch_llama_vocab.py /path/to/llama.cpp[/.git] [--inputs]

Run it with an older clone first and a newer one last: a vocabulary absent from the newer
one (llama.cpp removed some) stays as the older one left it.

For each NAME.gguf.inp in tests/data/vocab, the newest version of models/NAME.gguf present
in the repository's history is used (vocabularies removed upstream are taken from before
their removal). --inputs also refreshes tests/data/vocab/*.inp/.out with their newest versions.
"""
from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "vocab"
CACHE = Path(os.environ.get("TORCHGGML_VOCAB_CACHE", Path.home() / ".cache" / "torchggml" / "vocab"))


def git(git_dir: Path, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", str(git_dir), *args], check=True,
                          capture_output=True).stdout


def blob_of(git_dir: Path, path: str) -> tuple[str, str] | None:
    """(commit, blob) of `path` at HEAD, else of its newest version in the history, whose
    blob is present."""
    commits = ["HEAD"] + git(git_dir, "log", "--all", "--format=%H", "--diff-filter=AM", "--", path).decode().split()
    for commit in commits:
        found = subprocess.run(["git", "--git-dir", str(git_dir), "rev-parse", "-q", "--verify", f"{commit}:{path}"],
                               capture_output=True)
        if found.returncode:
            continue
        blob = found.stdout.decode().strip()
        if subprocess.run(["git", "--git-dir", str(git_dir), "cat-file", "-e", blob]).returncode == 0:
            return commit, blob
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("llama_cpp", type=Path, help="llama.cpp git directory (or a work tree with .git)")
    parser.add_argument("--inputs", action="store_true", help="also refresh tests/data/vocab/*.inp/.out")
    parser.add_argument("--names", nargs="*", help="vocab names (default: those in tests/data/vocab)")
    args = parser.parse_args()
    git_dir = args.llama_cpp / ".git" if (args.llama_cpp / ".git").exists() else args.llama_cpp
    names = args.names or sorted(p.name.removesuffix(".gguf.inp") for p in DATA.glob("*.gguf.inp"))
    CACHE.mkdir(parents=True, exist_ok=True)
    for name in names:
        found = blob_of(git_dir, f"models/{name}.gguf")
        if found is None:
            print(f"{name}: no .gguf in {git_dir}")
            continue
        commit, blob = found
        data = git(git_dir, "cat-file", "blob", blob)
        if not data.startswith(b"GGUF"):  # an LFS pointer or a placeholder
            print(f"{name}: models/{name}.gguf at {commit[:10]} is not a GGUF file ({len(data)} bytes)")
            continue
        (CACHE / f"{name}.gguf").write_bytes(data)
        print(f"{name}: {commit[:10]} -> {CACHE / (name + '.gguf')}")
    if args.inputs:  # the newest test vectors, also for vocabularies whose .gguf is absent
        for name in names:
            for ext in ("inp", "out"):
                found = blob_of(git_dir, f"models/{name}.gguf.{ext}")
                if found:
                    (DATA / f"{name}.gguf.{ext}").write_bytes(git(git_dir, "cat-file", "blob", found[1]))


if __name__ == "__main__":
    main()
