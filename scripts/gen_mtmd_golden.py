"""libmtmd's golden data for tests/test_mtmd.py: the tiny mmproj files of
torchggml/gguf/writer/tiny_mmproj.py (each projector type, F32 and Q8_0) and the tiny text
model, run through llama-cpp-python's libmtmd on a synthetic image (tests/data/mtmd/): the
image chunks' embeddings (mtmd_tokenize with a bitmap, mtmd_encode_chunk,
mtmd_get_output_embd), the text chunks' token ids, and the text model's logits after the whole
prompt (mtmd_helper_eval_chunks), and the preprocessed pixels libmtmd encoded (read back from the
encoder graph's input `inp_raw` through the scheduler's eval callback, at the patch
convolution's IM2COL node). Flash attention off on both sides (F32 attention).

    PYTHONPATH=$PWD python scripts/gen_mtmd_golden.py            # writes tests/data/mtmd
    PYTHONPATH=$PWD python scripts/gen_mtmd_golden.py --only internvl   # one case, the others kept
    PYTHONPATH=$PWD python scripts/gen_mtmd_golden.py --compare IMAGE.jpg SOUND.mp3   # ours vs libmtmd

--compare also runs torchggml on the same image and prints each type's relative L2 error, and
how far Pillow's decode of a JPEG is from llama.cpp's (stb_image)."""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from torchggml.gguf.writer.tiny_mmproj import (MMPROJ_CASES, TEXT_ARCH, write_tiny_mmproj,  # noqa: E402
                                               write_tiny_text_model)

DATA = ROOT / "tests" / "data" / "mtmd"
PROMPT = "Look: <__media__> What is it?"
WEIGHT_TYPES = ("F32", "Q8_0")


def synthetic_image(width: int = 100, height: int = 75, seed: int = 7) -> np.ndarray:
    """A deterministic RGB uint8 image (gradients and noise), not square: it is letterboxed."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([255 * x / width, 255 * y / height, 128 + 100 * np.sin(x / 7.0) * np.cos(y / 5.0)], -1)
    return np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)


def synthetic_audio(seconds: float = 2.0, seed: int = 7) -> np.ndarray:
    """Deterministic 16 kHz mono samples: two tones and noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(16000 * seconds)) / 16000.0
    x = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * 1234 * t) + 0.05 * rng.normal(size=t.size)
    return x.astype(np.float32)


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class GGMLTensor(ctypes.Structure):
    """ggml.h's struct ggml_tensor (GGML_MAX_DIMS 4, GGML_MAX_OP_PARAMS 64, GGML_MAX_SRC 10,
    GGML_MAX_NAME 64), to read the encoder's input in the eval callback."""
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
                ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]


class LibMtmd:
    """libmtmd through llama-cpp-python's ctypes bindings: one text model, one mmproj. `pixels`
    collects the [3, H, W] inputs of the images it encodes."""

    def __init__(self, text_path: str, mmproj_path: str, n_ctx: int = 1024, n_threads: int = 2):
        import llama_cpp
        import llama_cpp.mtmd_cpp as M
        self.L, self.M = llama_cpp, M
        llama_cpp.llama_backend_init()
        mp = llama_cpp.llama_model_default_params()
        self.model = llama_cpp.llama_model_load_from_file(text_path.encode(), mp)
        cp = M.mtmd_context_params_default()
        cp.use_gpu, cp.print_timings, cp.n_threads, cp.warmup = False, False, n_threads, False
        cp.flash_attn_type = 0  # LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.pixels: list[np.ndarray] = []
        self._callback = llama_cpp.ggml_backend_sched_eval_callback(self._eval_callback)
        cp.cb_eval = self._callback
        self.ctx = M.mtmd_init_from_file(mmproj_path.encode(), self.model, cp)
        if not self.ctx:
            raise RuntimeError(f"libmtmd could not load {mmproj_path}")
        self.n_embd = llama_cpp.llama_model_n_embd_inp(self.model)  # Qwen3-VL's rows: with deepstack slices
        self.n_ctx = n_ctx

    def _eval_callback(self, tensor, ask, user_data) -> bool:
        from torchggml.enums import Op
        t = ctypes.cast(tensor, ctypes.POINTER(GGMLTensor)).contents
        if t.op != int(Op.IM2COL) or not t.src[1]:
            return not ask  # not asked for; a computed node: go on
        if ask:
            return True
        src = ctypes.cast(t.src[1], ctypes.POINTER(GGMLTensor)).contents
        if src.name.split(b"\0")[0] == b"inp_raw" and src.type == 0:  # F32
            w, h, c = src.ne[0], src.ne[1], src.ne[2]
            x = np.ctypeslib.as_array(ctypes.cast(src.data, ctypes.POINTER(ctypes.c_float)), shape=(c, h, w)).copy()
            if not (self.pixels and self.pixels[-1].shape == x.shape and np.array_equal(self.pixels[-1], x)):
                self.pixels.append(x)  # qwen2vl's two convolutions read the same input
        return True

    def tokenize(self, media: np.ndarray, prompt: str = PROMPT):
        """`media`: RGB uint8 [H, W, 3], or float32 mono 16 kHz samples [n]."""
        M = self.M
        if media.ndim == 1:
            data = (ctypes.c_float * media.size).from_buffer_copy(np.ascontiguousarray(media, np.float32).tobytes())
            bitmap = M.mtmd_bitmap_init_from_audio(media.size, data)
        else:
            h, w = media.shape[:2]
            data = (ctypes.c_ubyte * media.size).from_buffer_copy(np.ascontiguousarray(media).tobytes())
            bitmap = M.mtmd_bitmap_init(w, h, data)
        chunks = M.mtmd_input_chunks_init()
        text = M.mtmd_input_text()
        raw = prompt.encode()
        text.text, text.text_len, text.add_special, text.parse_special = raw, len(raw), True, True
        bitmaps = (M.mtmd_bitmap_p_ctypes * 1)(bitmap)
        if M.mtmd_tokenize(self.ctx, chunks, ctypes.byref(text), bitmaps, 1) != 0:
            raise RuntimeError("mtmd_tokenize failed")
        M.mtmd_bitmap_free(bitmap)
        return chunks

    def chunks(self, rgb: np.ndarray, prompt: str = PROMPT):
        """[("text", ids) | ("image", embeddings [n, n_embd])] in prompt order, and the chunks."""
        M, out = self.M, []
        chunks = self.tokenize(rgb, prompt)
        for i in range(M.mtmd_input_chunks_size(chunks)):
            chunk = M.mtmd_input_chunks_get(chunks, i)
            n = M.mtmd_input_chunk_get_n_tokens(chunk)
            kind = "audio" if M.mtmd_input_chunk_get_type(chunk) == M.MTMD_INPUT_CHUNK_TYPE_AUDIO else "image"
            if M.mtmd_input_chunk_get_type(chunk) == M.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n_out = ctypes.c_size_t()
                ids = M.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n_out))
                out.append(("text", np.array([ids[j] for j in range(n_out.value)], dtype=np.int32)))
            else:
                if M.mtmd_encode_chunk(self.ctx, chunk) != 0:
                    raise RuntimeError("mtmd_encode_chunk failed")
                embd = M.mtmd_get_output_embd(self.ctx)
                out.append((kind, np.ctypeslib.as_array(embd, shape=(n * self.n_embd,)).reshape(n, self.n_embd).copy()))
        return out, chunks

    def logits_after(self, rgb: np.ndarray, prompt: str = PROMPT) -> np.ndarray:
        L, M = self.L, self.M
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch = self.n_ctx, 256, 256, 2, 2
        cp.flash_attn_type = 0
        lctx = L.llama_init_from_model(self.model, cp)
        chunks = self.tokenize(rgb, prompt)
        n_past = L.llama_pos(0)
        if M.mtmd_helper_eval_chunks(self.ctx, lctx, chunks, 0, 0, 256, True, ctypes.byref(n_past)) != 0:
            raise RuntimeError("mtmd_helper_eval_chunks failed")
        n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        logits = np.ctypeslib.as_array(L.llama_get_logits_ith(lctx, -1), shape=(n_vocab,)).copy()
        M.mtmd_input_chunks_free(chunks)
        L.llama_free(lctx)
        return logits

    def decode_file(self, path: str) -> np.ndarray:
        """llama.cpp's own decode of a media file: an image (stb_image) as RGB uint8 [H, W, 3],
        audio (miniaudio, 16 kHz mono) as float32 samples."""
        M = self.M
        bitmap = M.mtmd_helper_bitmap_init_from_file(self.ctx, str(path).encode(), False)
        raw = np.ctypeslib.as_array(M.mtmd_bitmap_get_data(bitmap), shape=(M.mtmd_bitmap_get_n_bytes(bitmap),)).copy()
        if M.mtmd_bitmap_is_audio(bitmap):
            data = raw.view(np.float32)
        else:
            data = raw.reshape(M.mtmd_bitmap_get_ny(bitmap), M.mtmd_bitmap_get_nx(bitmap), 3)
        M.mtmd_bitmap_free(bitmap)
        return data

    def close(self):
        self.M.mtmd_free(self.ctx)
        self.L.llama_model_free(self.model)


def wav_44k(path) -> Path:
    """Two tones and noise, 0.5 s at 44.1 kHz, as a 16-bit PCM WAV (standard library: the same bytes anywhere)."""
    import wave
    t = np.arange(44100 // 2) / 44100.0
    rng = np.random.default_rng(7)
    x = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * 1234 * t) + 0.05 * rng.normal(size=t.size)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(44100)
        w.writeframes((np.clip(x, -1, 1) * 32767).astype(np.int16).tobytes())
    return Path(path)


def generate_decode(directory: Path) -> None:
    """libmtmd's decode (miniaudio: dr_wav / dr_mp3, resampled to 16 kHz) of a 44.1 kHz WAV and of
    the same sound as an mp3 (written by libsndfile, kept in tests/data/mtmd/tone-44k.mp3)."""
    import soundfile
    wav = wav_44k(directory / "tone-44k.wav")
    x, rate = soundfile.read(wav, dtype="float32")
    soundfile.write(DATA / "tone-44k.mp3", x, rate, format="MP3")
    lib = LibMtmd(write_tiny_text_model(directory / "text-gemma3.gguf"),
                  str(write_tiny_mmproj(directory / "mmproj-qwen2a.gguf", "qwen2a")))
    np.savez_compressed(DATA / "decode.npz", wav=lib.decode_file(wav), mp3=lib.decode_file(DATA / "tone-44k.mp3"))
    lib.close()


def generate(directory: Path, only: list[str] | None = None) -> None:
    """Every case's golden data, or only the named cases' (the others' kept)."""
    DATA.mkdir(parents=True, exist_ok=True)
    text = write_tiny_text_model(directory / "text-gemma3.gguf")
    manifest = {"prompt": PROMPT, "text_model_sha256": sha256(text), "image": "synthetic_image()", "cases": {}}
    texts = {"gemma3": text}
    for arch in set(TEXT_ARCH.values()):
        texts[arch] = write_tiny_text_model(directory / f"text-{arch}.gguf", arch=arch)
        manifest[f"text_model_{arch}_sha256"] = sha256(texts[arch])
    if only:
        manifest["cases"] = json.loads((DATA / "manifest.json").read_text())["cases"]
    if not only or "decode" in only:
        generate_decode(directory)
    for case in MMPROJ_CASES:
        if only and case.name not in only:
            continue
        rgb = synthetic_audio() if case.n_mel else synthetic_image()
        for wt in WEIGHT_TYPES:
            key = f"{case.name}-{wt}"
            path = write_tiny_mmproj(directory / f"mmproj-{key}.gguf", case, wt)
            # llama.cpp's pixtral graph makes its [IMG_BREAK] rows as scale(uninitialised, 0) + img_break:
            # NaN wherever the reused compute memory held NaN or inf. Such runs are retried.
            for attempt in range(8):
                lib = LibMtmd(texts[TEXT_ARCH.get(case.name, "gemma3")], str(path))
                chunks, _ = lib.chunks(rgb)
                arrays = {f"chunk{i}_{kind}": a for i, (kind, a) in enumerate(chunks)}
                if wt == "F32":  # the pixels (audio: the mel chunks) do not depend on the weights
                    arrays.update({f"pixels{i}": x for i, x in enumerate(lib.pixels)})
                entry = {"case": case.name, "weights": wt, "sha256": sha256(path),
                         "text": TEXT_ARCH.get(case.name, "gemma3"),
                         "chunks": [kind for kind, _ in chunks], "nan_runs_retried": attempt}
                arrays["logits"] = lib.logits_after(rgb)
                entry["logits"] = True
                lib.close()
                if all(np.isfinite(a).all() for a in arrays.values()):
                    break
            else:
                raise RuntimeError(f"{key}: libmtmd's output had NaN in 8 runs")
            np.savez_compressed(DATA / f"{key}.npz", **arrays)
            manifest["cases"][key] = entry
            print(key, [(k, a.shape) for k, a in chunks])
    (DATA / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


def compare(directory: Path, media: list[str], only: list[str] | None = None) -> None:
    """Ours vs libmtmd on real files: images given Pillow's RGB to both (and Pillow's decode vs
    stb_image's), audio given libmtmd's own decode (miniaudio; no decoder is needed here)."""
    import torch
    from torchggml.mtmd import Encoder, load_image, load_mmproj, log_mel, preprocess
    texts = {arch: write_tiny_text_model(directory / f"text-{arch}.gguf", arch=arch)
             for arch in {"gemma3", *TEXT_ARCH.values()}}
    image = next((m for m in media if not m.endswith((".mp3", ".wav", ".flac"))), None)
    sound = next((m for m in media if m.endswith((".mp3", ".wav", ".flac"))), None)
    rgb = load_image(image) if image else None
    for case in MMPROJ_CASES:
        if (case.n_mel and sound is None) or (not case.n_mel and image is None) or (only and case.name not in only):
            continue
        for wt in WEIGHT_TYPES:
            path = str(write_tiny_mmproj(directory / f"mmproj-{case.name}-{wt}.gguf", case, wt))
            lib = LibMtmd(texts[TEXT_ARCH.get(case.name, "gemma3")], path)
            if case.n_mel:
                samples = lib.decode_file(sound)
                theirs = [a for kind, a in lib.chunks(samples)[0] if kind == "audio"]
                if wt == "F32":  # our decode (soundfile, miniaudio's resampling) against libmtmd's
                    from torchggml.mtmd import load_audio
                    mine = load_audio(sound)
                    n = min(mine.size, samples.size)
                    probe = load_mmproj(path)
                    mel_diff = max(float((a - b).abs().max())
                                   for a, b in zip(log_mel(mine, probe.audio), log_mel(samples, probe.audio)))
                    probe.close()
                    print(f"{case.name:9s} decode {sound}: {mine.size} samples (libmtmd {samples.size}), max abs "
                          f"difference {float(np.abs(mine[:n] - samples[:n]).max()):.3g}; mel {mel_diff:.3g}")
            else:
                theirs = [a for kind, a in lib.chunks(rgb)[0] if kind == "image"]
                if case.name == "gemma3" and wt == "F32":
                    stb = lib.decode_file(image)
                    diff = np.abs(stb.astype(int) - rgb.astype(int))
                    print(f"decode {image}: {rgb.shape[1]}x{rgb.shape[0]}, Pillow vs stb_image max abs diff "
                          f"{diff.max()} levels, mean {diff.mean():.3f}")
            their_inputs = lib.pixels
            lib.close()
            mm = load_mmproj(path)
            enc = Encoder(mm)
            if case.n_mel:
                mels = log_mel(samples, mm.audio)
                ours, inputs, grid = [enc.encode_mel(m) for m in mels], [m.numpy()[None] for m in mels], None
                what = f"audio {sound}: {samples.size / 16000:.2f} s, mel chunks"
            else:
                pre = preprocess(rgb, mm.projector, mm.vision)
                ours, inputs, grid = enc.encode(pre), [t.pixels.numpy() for t in pre.tiles], pre.grid
                what = "preprocessed tiles"
                if case.projector == "idefics3":  # libmtmd: slices first, the overview last
                    ours, inputs = ours[1:] + ours[:1], inputs[1:] + inputs[:1]
            if wt == "F32":
                sizes = [tuple(x.shape[1:][::-1]) for x in inputs]
                same = len(inputs) == len(their_inputs) and all(x.shape == y.shape for x, y in zip(inputs, their_inputs))
                diff = max(float(np.abs(x - y).max()) for x, y in zip(inputs, their_inputs)) if same else float("nan")
                print(f"{case.name:9s} {what} (W, H) {sizes}, libmtmd {[tuple(x.shape[1:][::-1]) for x in their_inputs]}, "
                      f"max abs difference {diff:.3g}")
            errs = [float(torch.linalg.norm(o - torch.from_numpy(t)) / np.linalg.norm(t)) for o, t in zip(ours, theirs)]
            print(f"{case.name:9s} {wt:5s} chunks {len(ours)} (libmtmd {len(theirs)}), tokens "
                  f"{[o.shape[0] for o in ours]} vs {[t.shape[0] for t in theirs]}, grid {grid}, "
                  f"max relative L2 {max(errs):.2e}")
            mm.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compare", metavar="FILE", nargs="+",
                    help="compare ours with libmtmd on these files instead (an image and/or an mp3/wav)")
    ap.add_argument("--only", metavar="CASE", nargs="+", help="only these cases (golden data: the others kept)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        if args.compare:
            compare(Path(d), args.compare, args.only)
        else:
            generate(Path(d), args.only)


if __name__ == "__main__":
    main()
