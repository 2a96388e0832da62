"""Encoder speed on the CPU, torchggml vs libmtmd, alternated in one process, both encoding the
same preprocessed input (libmtmd's tokenize, which preprocesses, is not timed; only its
mtmd_encode_chunk is); the first run of each is a warm-up.

Vision (default): a Gemma 3 projector with SigLIP-400M's shape (width 1152, 16 heads, FFN 4304,
patch 14) at 896 x 896 (4096 patches, 256 output tokens), with --layers of its 27 blocks (the
time per block is what the full encoder repeats).

Audio (--audio): a Qwen2-Audio projector on whisper-base's encoder shape (width 512, 8 heads,
FFN 2048, 80 mel bins, --layers of its 6 blocks; default all 6) on a 30 s clip (one 3000-frame
mel chunk, 1500 encoder positions, 750 output tokens after the 2-frame pool).

    PYTHONPATH=$PWD python scripts/bench_mtmd.py --layers 2 --runs 3 --threads 2
    PYTHONPATH=$PWD python scripts/bench_mtmd.py --audio --runs 3 --threads 2
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

from gen_mtmd_golden import LibMtmd, synthetic_audio, synthetic_image  # noqa: E402
from torchggml.gguf.writer.tiny_mmproj import MMPROJ_BY_NAME, write_tiny_mmproj, write_tiny_text_model  # noqa: E402


def libmtmd_encode(lib: LibMtmd, media: np.ndarray):
    """libmtmd's first media chunk of `media`: (seconds in mtmd_encode_chunk, embeddings)."""
    M = lib.M
    chunks = lib.tokenize(media)
    for i in range(M.mtmd_input_chunks_size(chunks)):
        chunk = M.mtmd_input_chunks_get(chunks, i)
        if M.mtmd_input_chunk_get_type(chunk) != M.MTMD_INPUT_CHUNK_TYPE_TEXT:
            break
    n = M.mtmd_input_chunk_get_n_tokens(chunk)
    t = time.perf_counter()
    if M.mtmd_encode_chunk(lib.ctx, chunk) != 0:
        raise RuntimeError("mtmd_encode_chunk failed")
    seconds = time.perf_counter() - t
    out = np.ctypeslib.as_array(M.mtmd_get_output_embd(lib.ctx), shape=(n * lib.n_embd,)).reshape(n, lib.n_embd).copy()
    M.mtmd_input_chunks_free(chunks)
    return seconds, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--audio", action="store_true", help="the whisper-base-shaped audio encoder on 30 s")
    ap.add_argument("--layers", type=int, default=None, help="blocks (default: 2 of SigLIP's 27; all 6 of whisper's)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--weights", default="F16", help="the matrices' type (F32, F16, Q8_0)")
    args = ap.parse_args()
    import torch
    from torchggml.mtmd import Encoder, load_mmproj, log_mel, preprocess
    torch.set_num_threads(args.threads)
    if args.audio:
        layers = args.layers or 6
        case = replace(MMPROJ_BY_NAME["qwen2a"], name="whisper-base", n_mel=80, n_embd=512, n_head=8, n_ff=2048,
                       n_layer=layers)
        media = synthetic_audio(30.0)
        what = f"whisper-base-shaped qwen2a encoder, {layers} of 6 blocks, 30 s"
    else:
        layers = args.layers or 2
        case = replace(MMPROJ_BY_NAME["gemma3"], name="siglip400m", image_size=896, patch_size=14, n_embd=1152,
                       n_head=16, n_ff=4304, n_layer=layers, merge=4)
        media = synthetic_image(1024, 768)
        what = f"SigLIP-400M-shaped gemma3 encoder, {layers} of 27 blocks, 896x896"
    with tempfile.TemporaryDirectory() as d:
        text = write_tiny_text_model(Path(d) / "text.gguf")
        path = str(write_tiny_mmproj(Path(d) / "mmproj.gguf", case, args.weights))
        lib = LibMtmd(text, path, n_threads=args.threads)
        mm = load_mmproj(path)
        enc = Encoder(mm, n_threads=args.threads)
        if args.audio:
            mel = log_mel(media, mm.audio)[0]
            run_ours = lambda: enc.encode_mel(mel)  # noqa: E731
        else:
            tile = preprocess(media, mm.projector, mm.vision).tiles[0]
            run_ours = lambda: enc.encode_tile(tile)  # noqa: E731
        times = {"torchggml": [], "libmtmd": []}
        for run in range(args.runs + 1):
            t = time.perf_counter()
            ours = run_ours()
            ours_s = time.perf_counter() - t
            theirs_s, theirs = libmtmd_encode(lib, media)
            if run:
                times["torchggml"].append(ours_s)
                times["libmtmd"].append(theirs_s)
        err = float(np.linalg.norm(ours.numpy() - theirs) / np.linalg.norm(theirs))
        med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
        print(f"{what}, {args.weights}, {args.threads} threads, {args.runs} runs alternated, "
              f"{ours.shape[0]} tokens (libmtmd {theirs.shape[0]})")
        for k, v in med.items():
            print(f"  {k:10s} median {v:.0f} ms  runs {[round(x * 1e3) for x in times[k]]}")
        print(f"  ratio torchggml / libmtmd: {med['torchggml'] / med['libmtmd']:.2f}   relative L2 {err:.1e}")
        enc.close()
        mm.close()
        lib.close()


if __name__ == "__main__":
    main()
