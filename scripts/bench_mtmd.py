"""Encoder speed on the CPU, torchggml vs libmtmd, alternated in one process: a Gemma 3 projector
with SigLIP-400M's shape (width 1152, 16 heads, FFN 4304, patch 14) at 896 x 896 (4096 patches,
256 output tokens), with --layers of its 27 blocks (the time per block is what the full encoder
repeats). Both encode the same preprocessed image; the first run of each is a warm-up.

    PYTHONPATH=$PWD python scripts/bench_mtmd.py --layers 2 --runs 3 --threads 2
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from gen_mtmd_golden import LibMtmd, synthetic_image  # noqa: E402
from torchggml.gguf.writer.tiny_mmproj import MMPROJ_BY_NAME, write_tiny_mmproj, write_tiny_text_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--weights", default="F16", help="the matrices' type (F32, F16, Q8_0)")
    args = ap.parse_args()
    import torch
    from torchggml.mtmd import Encoder, load_mmproj, preprocess
    torch.set_num_threads(args.threads)
    case = replace(MMPROJ_BY_NAME["gemma3"], name="siglip400m", image_size=896, patch_size=14, n_embd=1152,
                   n_head=16, n_ff=4304, n_layer=args.layers, merge=4)
    with tempfile.TemporaryDirectory() as d:
        text = write_tiny_text_model(Path(d) / "text.gguf")
        path = str(write_tiny_mmproj(Path(d) / "mmproj.gguf", case, args.weights))
        rgb = synthetic_image(1024, 768)
        lib = LibMtmd(text, path)
        mm = load_mmproj(path)
        enc = Encoder(mm, n_threads=args.threads)
        tile = preprocess(rgb, mm.projector, mm.vision).tiles[0]
        times = {"torchggml": [], "libmtmd": []}
        for run in range(args.runs + 1):
            t = time.perf_counter()
            ours = enc.encode_tile(tile)
            ours_s = time.perf_counter() - t
            t = time.perf_counter()
            theirs = [a for kind, a in lib.chunks(rgb)[0] if kind == "image"][0]
            theirs_s = time.perf_counter() - t
            if run:
                times["torchggml"].append(ours_s)
                times["libmtmd"].append(theirs_s)
        err = float(np.linalg.norm(ours.numpy() - theirs) / np.linalg.norm(theirs))
        med = {k: float(np.median(v)) for k, v in times.items()}
        print(f"SigLIP-400M-shaped gemma3 encoder, {args.layers} of 27 blocks, 896x896, {args.weights}, "
              f"{args.threads} threads, {args.runs} runs alternated (libmtmd's time includes its tokenize)")
        for k, v in med.items():
            print(f"  {k:10s} median {v:.2f} s  runs {[round(x, 2) for x in times[k]]}")
        print(f"  ratio torchggml / libmtmd: {med['torchggml'] / med['libmtmd']:.2f}   relative L2 {err:.1e}")
        lib.close()


if __name__ == "__main__":
    main()
