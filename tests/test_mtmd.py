"""Multimodal projectors (torchggml.mtmd) against libmtmd: the tiny mmproj files of
torchggml/gguf/writer/tiny_mmproj.py, regenerated here byte-identical to the files libmtmd ran
(tests/data/mtmd, scripts/gen_mtmd_golden.py), encode the same synthetic image; the image
chunks' embeddings and the text model's logits after [text, image, text] are compared with
libmtmd's. Also: the loader's keys and errors, preprocessing, and Model's embeddings input."""
from __future__ import annotations

import hashlib
import inspect
import io
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("PIL", reason="the vision extra (Pillow) is not installed")
from PIL import Image as PILImage  # noqa: E402

from torchggml.gguf.reader import GGUFError  # noqa: E402
from torchggml.gguf.writer.tiny_mmproj import MMPROJ_BY_NAME, write_tiny_mmproj, write_tiny_text_model  # noqa: E402
from torchggml.models import load_model  # noqa: E402
from torchggml.models.kv_cache import attention_mask  # noqa: E402
from torchggml.models.prompt import EmbeddingChunk  # noqa: E402
from torchggml.models.sampling import SamplingParams  # noqa: E402
from torchggml.mtmd import (Audio, Image, Multimodal, UnsupportedProjectorError, Encoder, load_image,  # noqa: E402
                            load_mmproj, log_mel, preprocess)
from torchggml.mtmd.preprocess import dynamic_size, letterbox  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "mtmd"
MANIFEST = json.loads((DATA / "manifest.json").read_text()) if (DATA / "manifest.json").exists() else None
MAX_ERR_FLOAT, MAX_ERR_QUANT = 2e-3, 4e-2
MP3_MAX_SAMPLE_DIFF, MP3_MAX_MEL_DIFF = 1e-4, 1e-3  # two mp3 decoders' rounding (measured 1.7e-5, 6.6e-5)


def synthetic_image(width: int = 100, height: int = 75, seed: int = 7) -> np.ndarray:
    """The image of scripts/gen_mtmd_golden.py (kept equal: the golden data came from it)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([255 * x / width, 255 * y / height, 128 + 100 * np.sin(x / 7.0) * np.cos(y / 5.0)], -1)
    return np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)


def synthetic_audio(seconds: float = 2.0, seed: int = 7) -> np.ndarray:
    """The audio of scripts/gen_mtmd_golden.py."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(16000 * seconds)) / 16000.0
    x = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * 1234 * t) + 0.05 * rng.normal(size=t.size)
    return x.astype(np.float32)


def is_audio(key: str) -> bool:
    return MMPROJ_BY_NAME[MANIFEST["cases"][key]["case"]].n_mel > 0


def encoder_inputs(mm):
    """Our inputs for the golden media, in libmtmd's chunk order: image tiles or mel chunks."""
    if mm.audio is not None:
        return [m[None] for m in log_mel(synthetic_audio(), mm.audio)]
    tiles = [t.pixels for t in preprocess(synthetic_image(), mm.projector, mm.vision).tiles]
    return tiles[1:] + tiles[:1] if mm.projector == "idefics3" else tiles  # libmtmd: the overview last


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def rel_err(ours, ref) -> float:
    ours, ref = np.asarray(ours, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("mtmd")
    paths = {"text": Path(write_tiny_text_model(d / "text-gemma3.gguf")),
             **{f"text-{arch}": Path(write_tiny_text_model(d / f"text-{arch}.gguf", arch=arch))
                for arch in ("qwen2vl", "qwen3vl")}}
    for name in MMPROJ_BY_NAME:
        for wt in ("F32", "Q8_0"):
            paths[f"{name}-{wt}"] = Path(write_tiny_mmproj(d / f"mmproj-{name}-{wt}.gguf", name, wt))
    return paths


@pytest.fixture(scope="module")
def text_model(files):
    model = load_model(files["text"], progress=False)
    yield model
    model.close()


@pytest.fixture(scope="module")
def qwen2vl_text_model(files):
    model = load_model(files["text-qwen2vl"], progress=False)
    yield model
    model.close()


@pytest.fixture(scope="module")
def qwen3vl_text_model(files):
    model = load_model(files["text-qwen3vl"], progress=False)
    yield model
    model.close()


# ---------------------------------------------------------------- loading


@pytest.mark.parametrize("name, projector, n_merge, algo", [
    ("gemma3", "gemma3", 2, "bilinear"),
    ("idefics3", "idefics3", 2, "lanczos"),
    ("mlp", "mlp", 1, "bicubic"),
    ("qwen2vl", "qwen2vl_merger", 2, "bicubic"),
    ("qwen25vl", "qwen2.5vl_merger", 2, "bicubic"),
    ("pixtral", "pixtral", 2, "bicubic"),
    ("internvl", "internvl", 2, "bicubic"),
    ("lfm2", "lfm2", 2, "bilinear"),
    ("ldp", "ldp", 1, "bicubic"),
    ("ldpv2", "ldpv2", 1, "bicubic"),
])
def test_load_hparams(files, name, projector, n_merge, algo):
    mm = load_mmproj(files[f"{name}-F32"])
    case = MMPROJ_BY_NAME[name]
    hp = mm.vision
    assert (mm.projector, hp.n_merge, hp.resize_algo) == (projector, n_merge, algo)
    assert (hp.image_size, hp.patch_size, hp.n_embd, hp.n_head, hp.d_head, hp.n_layer) == \
        (case.image_size, case.patch_size, case.n_embd, case.n_head, case.n_embd // case.n_head, case.n_layer)
    assert hp.image_mean == pytest.approx(case.mean) and hp.image_std == pytest.approx(case.std)
    assert mm.n_embd_text == case.n_embd_text
    assert mm.tensor("v.blk.0.attn_q.weight").ne[:2] == [case.n_embd, case.n_embd]
    mm.close()


def _mmproj_with(path, **keys):
    import gguf
    w = gguf.GGUFWriter(str(path), "clip")
    for k, v in keys.items():
        w.add_string(k, v) if isinstance(v, str) else w.add_bool(k, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return path


@pytest.mark.parametrize("projector, words", [
    ("kimivl", "a type llama.cpp knows, not yet supported here"),
    ("glm4v", "a type llama.cpp knows, not yet supported here"),
    ("no-such-projector", "unknown to llama.cpp too"),
])
def test_unsupported_projector_one_line(tmp_path, projector, words):
    path = _mmproj_with(tmp_path / "p.gguf", **{"clip.projector_type": projector, "clip.has_vision_encoder": True})
    with pytest.raises(UnsupportedProjectorError) as e:
        load_mmproj(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and repr(projector) in msg and words in msg


def test_not_an_mmproj(files):
    with pytest.raises(GGUFError, match="not an mmproj file"):
        load_mmproj(files["text"])


# ---------------------------------------------------------------- preprocessing


@pytest.mark.parametrize("size, target, inner", [
    ((100, 75), 64, (64, 48)),      # scaled by 0.64: 48 rows, 8 pad rows above and below
    ((75, 100), 64, (48, 64)),
    ((640, 488), 64, (64, 49)),     # 488 * 0.1 = 48.8 -> 49 (PAD_CEIL rounds up)
    ((64, 64), 64, (64, 64)),
])
def test_letterbox(size, target, inner):
    rgb = np.full((size[1], size[0], 3), 200, dtype=np.uint8)
    out = letterbox(rgb, target, target, "bilinear", "ceil", (1, 2, 3))
    assert out.shape == (target, target, 3)
    inside = np.all(out == 200, axis=2)
    ys, xs = np.nonzero(inside)
    assert (xs.max() - xs.min() + 1, ys.max() - ys.min() + 1) == inner
    assert (xs.min(), ys.min()) == ((target - inner[0]) // 2, (target - inner[1]) // 2)
    assert np.all(out[~inside] == (1, 2, 3))


@pytest.mark.parametrize("w, h, align, lo, hi, expect", [
    (100, 75, 16, 8 * 256, 4096 * 256, (96, 80)),     # round(6.25) = 6, round(4.69) = 5
    (640, 488, 16, 8 * 256, 4096 * 256, (640, 496)),  # 488 / 16 = 30.5 rounds away from zero: 31
    (20, 20, 16, 8 * 256, 4096 * 256, (48, 48)),      # too few pixels: scaled up by sqrt(2048/400)
    (4000, 3000, 16, 0, 1024 * 256, (576, 432)),      # too many: scaled down, floored
])
def test_dynamic_size(w, h, align, lo, hi, expect):
    # the expectations in float64 by the formula (the float32 steps do not change these)
    def rnd(x):
        return max(align, int(math.floor(x / align + 0.5)) * align)
    wb, hb = rnd(w), rnd(h)
    if hi and wb * hb > hi:
        beta = math.sqrt(h * w / hi)
        wb, hb = max(align, math.floor(w / beta / align) * align), max(align, math.floor(h / beta / align) * align)
    elif lo and wb * hb < lo:
        beta = math.sqrt(lo / (h * w))
        wb, hb = math.ceil(w * beta / align) * align, math.ceil(h * beta / align) * align
    assert dynamic_size(w, h, align, lo, hi) == (wb, hb) == expect


@pytest.mark.parametrize("lo, hi, expect", [
    (1, 6, [(1, 1), (1, 2), (1, 3), (1, 4), (1, 5), (1, 6), (2, 1), (2, 2), (2, 3), (3, 1), (3, 2), (4, 1),
            (5, 1), (6, 1)]),
    (2, 4, [(2, 2)]),   # clip.cpp's loops: a from lo, and b from lo too
])
def test_internvl_candidates(lo, hi, expect):
    from torchggml.mtmd.loader import internvl_candidates
    assert internvl_candidates(10, lo, hi) == tuple((10 * a, 10 * b) for a, b in expect)


@pytest.mark.parametrize("size, expect", [
    ((100, 75), (128, 128)),    # every candidate that keeps all 7500 pixels, the least wasteful
    ((640, 488), (192, 128)),   # none keeps them all: the one keeping most (3 x 2)
    ((200, 40), (256, 64)),     # wide: 4 x 1
])
def test_best_resolution(size, expect):
    from torchggml.mtmd.loader import internvl_candidates
    from torchggml.mtmd.preprocess import best_resolution
    assert best_resolution(*size, internvl_candidates(64, 1, 6)) == expect


@pytest.mark.parametrize("name", ["internvl", "llava16"])
def test_slices_then_overview(files, name):
    """Slices row by row, then the overview (libmtmd's order); a small image is the overview alone."""
    mm = load_mmproj(files[f"{name}-F32"])
    pre = preprocess(synthetic_image(), mm.projector, mm.vision)
    assert [(t.kind, t.row, t.col) for t in pre.tiles] == \
        [("slice", 0, 0), ("slice", 0, 1), ("slice", 1, 0), ("slice", 1, 1), ("overview", 0, 0)]
    assert pre.grid == (2, 2)
    assert [t.kind for t in preprocess(synthetic_image(64, 40), mm.projector, mm.vision).tiles] == ["overview"]
    mm.close()


def test_llava16_pinpoints(files):
    mm = load_mmproj(files["llava16-F32"])
    assert mm.vision.res_candidates == ((64, 128), (128, 64), (128, 128), (192, 64))
    assert (mm.vision.resize_pad_ov, mm.vision.resize_pad_rf, mm.vision.pad_color_rf) == ("none", "ceil", (0, 0, 0))
    mm.close()
    mm = load_mmproj(files["mlp-F32"])
    assert mm.vision.res_candidates == ()
    mm.close()


@pytest.mark.parametrize("size, expect", [
    ((640, 488), (3, 2)),     # libmtmd's grid for test-1.jpeg
    ((1000, 500), (2, 1)),    # aspect 2 exactly: (4, 2) ties, but the image covers under half of it
    ((2000, 1000), (4, 2)),   # the same tie, the image over half of (4, 2)'s area
    ((500, 2000), (1, 4)),
])
def test_lfm2_grid(size, expect):
    from torchggml.mtmd.preprocess import lfm2_grid
    assert lfm2_grid(*size) == expect


@pytest.mark.parametrize("size, tile", [
    ((640, 488), True),
    ((100, 75), False),
    ((360, 360), False),      # 22.5 merged patches a side round half to even: 352^2 is within 2 x 256 tokens
    ((376, 376), True),
])
def test_lfm2_should_tile(files, size, tile):
    from torchggml.mtmd.preprocess import lfm2_should_tile
    mm = load_mmproj(files["lfm2-F32"])
    assert (mm.vision.min_pixels, mm.vision.max_pixels) == (64 * 256, 256 * 256)
    assert lfm2_should_tile(*size, mm.vision) is tile
    mm.close()


def test_image_sources_agree(tmp_path):
    rgb = synthetic_image()
    buf = io.BytesIO()
    PILImage.fromarray(rgb).save(buf, format="PNG")
    path = tmp_path / "x.png"
    path.write_bytes(buf.getvalue())
    for source in (path, str(path), buf.getvalue(), PILImage.fromarray(rgb), rgb, torch.from_numpy(rgb)):
        assert np.array_equal(load_image(source), rgb)


@pytest.mark.parametrize("data", [b"", b"not an image at all", b"\x89PNG\r\n\x1a\n" + b"\0" * 20])
def test_corrupt_image(tmp_path, data):
    path = tmp_path / "bad.jpg"
    path.write_bytes(data)
    with pytest.raises(ValueError, match="bad.jpg: not an image Pillow can decode"):
        load_image(path)


def test_normalisation_is_clip_cpp_float32(files):
    mm = load_mmproj(files["mlp-F32"])
    rgb = synthetic_image(64, 64)
    pixels = preprocess(rgb, "mlp", mm.vision).tiles[0].pixels
    x = np.asarray(rgb, dtype=np.float32).transpose(2, 0, 1) / np.float32(255.0)
    ref = (x - np.float32(mm.vision.image_mean)[:, None, None]) / np.float32(mm.vision.image_std)[:, None, None]
    assert np.array_equal(pixels.numpy(), ref.astype(np.float32))
    mm.close()


# ---------------------------------------------------------------- encoders vs libmtmd

needs_golden = pytest.mark.skipif(MANIFEST is None, reason="no golden data (run scripts/gen_mtmd_golden.py)")
GOLDEN = sorted(MANIFEST["cases"]) if MANIFEST else []


@needs_golden
@pytest.mark.parametrize("key", [k for k in GOLDEN if k.endswith("-F32")])
def test_preprocessing_vs_libmtmd(files, key):
    """The tiles (audio: the log-mel chunks) equal what libmtmd's encoder read (its graph input
    inp_raw): sizes, count and values (pixels exactly; mel frames to float32 rounding)."""
    ref = np.load(DATA / f"{key}.npz")
    theirs = [ref[f"pixels{i}"] for i in range(sum(k.startswith("pixels") for k in ref.files))]
    mm = load_mmproj(files[key])
    ours = [t.numpy() for t in encoder_inputs(mm)]
    assert [t.shape for t in ours] == [t.shape for t in theirs]
    bound = 1e-6 if mm.audio is not None else 0.0
    for o, t in zip(ours, theirs):
        assert float(np.abs(o - t).max()) <= bound
    mm.close()


@needs_golden
@pytest.mark.parametrize("key", GOLDEN)
def test_embeddings_vs_libmtmd(files, key):
    entry = MANIFEST["cases"][key]
    path = files[key]
    assert sha256(path) == entry["sha256"], f"{key}: the writer no longer writes the file libmtmd ran"
    ref = np.load(DATA / f"{key}.npz")
    theirs = [ref[f"chunk{i}_{kind}"] for i, kind in enumerate(entry["chunks"]) if kind != "text"]
    mm = load_mmproj(path)
    enc = Encoder(mm)
    ours = [enc.encode_mel(x[0]) if mm.audio is not None else enc.encode_tile(x) for x in encoder_inputs(mm)]
    assert [o.shape[0] for o in ours] == [t.shape[0] for t in theirs]
    bound = MAX_ERR_FLOAT if entry["weights"] == "F32" else MAX_ERR_QUANT
    for i, (o, t) in enumerate(zip(ours, theirs)):
        err = rel_err(o, t)
        assert err <= bound, f"{key} tile {i}: relative L2 error {err:.2e} (max {bound:.0e})"
    enc.close()
    mm.close()


@needs_golden
@pytest.mark.parametrize("key", [k for k in GOLDEN if "logits" in MANIFEST["cases"][k]])
def test_prompt_layout_and_logits_vs_libmtmd(files, request, key):
    """[text, image or audio, text] through Multimodal: the text chunks' token ids equal
    libmtmd's, and the logits after the prompt llama.cpp's (Gemma 3 reads its image non-causally;
    Qwen3-VL's text model places the image in 2-D M-RoPE positions and adds its deepstack slices)."""
    entry, ref = MANIFEST["cases"][key], np.load(DATA / f"{key}.npz")
    arch = entry.get("text", "gemma3")
    if arch == "gemma3":
        assert sha256(files["text"]) == MANIFEST["text_model_sha256"]
        text_model = request.getfixturevalue("text_model")
    else:
        assert sha256(files[f"text-{arch}"]) == MANIFEST[f"text_model_{arch}_sha256"]
        text_model = request.getfixturevalue(f"{arch}_text_model")
    mm = Multimodal(text_model, load_mmproj(files[key]))
    before, after = MANIFEST["prompt"].split("<__media__>")
    media = Audio(synthetic_audio()) if is_audio(key) else Image(synthetic_image())
    parts = mm.parts([before, media, after])
    # merge consecutive texts as libmtmd's chunks do, tokenized as Model.eval_parts tokenizes them
    ours, first = [], True
    for p in parts:
        if isinstance(p, (str, list)):
            ids = text_model.tokenize(p, first, parse_special=True) if isinstance(p, str) else p
            first = False
            if ours and ours[-1][0] == "text":
                ours[-1] = ("text", ours[-1][1] + ids)
            elif ids:
                ours.append(("text", ids))
        else:
            ours.append(("audio" if is_audio(key) else "image", len(p)))
    kinds = [k for k, _ in ours]
    assert kinds == entry["chunks"]
    for i, (kind, value) in enumerate(ours):
        if kind == "text":
            assert value == ref[f"chunk{i}_text"].tolist()
        else:
            assert value == ref[f"chunk{i}_{kind}"].shape[0]
    text_model.reset()
    logits = mm.eval([before, media, after])[0]
    text_model.reset()
    bound = MAX_ERR_FLOAT if entry["weights"] == "F32" else MAX_ERR_QUANT
    err = rel_err(logits.numpy(), ref["logits"])
    assert err <= bound, f"{key}: logits after the prompt, relative L2 error {err:.2e} (max {bound:.0e})"


# ---------------------------------------------------------------- the text side


def test_eval_embeddings_equals_token_lookup(text_model):
    """Gemma scales looked-up token embeddings by sqrt(n_embd), input embeddings not: given the
    scaled rows, eval_embeddings reproduces eval's logits."""
    ids = [1, 50, 60, 70, 80, 90, 100]
    text_model.reset()
    ref = torch.cat([text_model.eval(ids[:3]), text_model.eval(ids[3:])])
    text_model.reset()
    table = torch.from_numpy(np.frombuffer(text_model.file.tensor_data("token_embd.weight"), dtype=np.float32)
                             .reshape(-1, text_model.hp.n_embd).copy())
    rows = table[ids] * math.sqrt(text_model.hp.n_embd)
    ours = text_model.eval_embeddings(rows[:3])
    ours = torch.cat([ours, text_model.eval_embeddings(rows[3:])])
    text_model.reset()
    assert torch.equal(ours, ref)


@pytest.mark.parametrize("causal, expect", [
    (True, [[0, -np.inf, -np.inf, -np.inf], [0, 0, -np.inf, -np.inf], [0, 0, 0, -np.inf]]),
    (False, [[0, 0, 0, -np.inf], [0, 0, 0, -np.inf], [0, 0, 0, -np.inf]]),
])
def test_attention_mask_non_causal(causal, expect):
    same = np.array([[True, True, True, False]] * 3)
    mask = attention_mask(np.array([0, 1, 2]), np.array([0, 1, 2, 3]), 0, same, causal=causal)
    assert np.array_equal(mask.float().numpy(), np.array(expect, dtype=np.float32))


def test_non_causal_chunk_sees_later_rows(text_model):
    """The first row's logits change with the rows after it only when the chunk is non-causal."""
    rows = torch.randn(4, text_model.hp.n_embd, generator=torch.Generator().manual_seed(0))
    other = rows.clone()
    other[3] += 1.0
    first = {}
    for causal in (True, False):
        for name, r in (("a", rows), ("b", other)):
            text_model.reset()
            first[causal, name] = text_model.eval_embeddings(r, causal=causal)[0]
    text_model.reset()
    assert torch.equal(first[True, "a"], first[True, "b"])
    assert not torch.equal(first[False, "a"], first[False, "b"])


@pytest.mark.parametrize("call, message", [
    (lambda m: m.eval_embeddings(torch.zeros(2, 7)), "values must be float"),
    (lambda m: m.eval_embeddings(torch.zeros(2, 64, dtype=torch.int32)), "values must be float"),
    (lambda m: m.eval_embeddings(torch.zeros(m.n_batch + 1, 64), causal=False), "must fit one micro-batch"),
    (lambda m: m.eval_parts([object()]), "a prompt part must be"),
    (lambda m: list(m.generate(["a", EmbeddingChunk(torch.zeros(2, 64))], max_tokens=1)), "must end with text"),
])
def test_eval_embeddings_errors(text_model, call, message):
    text_model.reset()
    with pytest.raises((ValueError, TypeError), match=message):
        call(text_model)


def test_generate_with_embeddings(text_model):
    """generate over [text, embeddings, text] evaluates the parts in order: with greedy sampling
    its tokens continue from eval_parts' logits."""
    rows = EmbeddingChunk(torch.randn(5, 64, generator=torch.Generator().manual_seed(1)), causal=False)
    prompt = ["Once", rows, " upon"]
    text_model.reset()
    first = int(text_model.eval_parts(prompt)[0].argmax())
    choices = list(text_model.generate_tokens(prompt, max_tokens=3, params=SamplingParams(temperature=0.0)))
    text_model.reset()
    if text_model.tokenizer.is_eog(first):
        assert choices == []
    else:
        assert choices[0].token == first


def test_mrope_image_positions(qwen3vl_text_model, monkeypatch):
    """An image of 3 x 2 tokens after 4 text tokens: rotary positions (4, 4 + row, 4 + column, 0);
    the text after it continues at 4 + max(3, 2) = 7, as llama.cpp's M-RoPE images; a prefix cut
    before the image forgets the jump, one after it keeps it."""
    m = qwen3vl_text_model
    m.reset()
    m.eval([1, 50, 60, 70])
    rows = torch.randn(6, m.hp.n_embd_inp, generator=torch.Generator().manual_seed(2))
    seen, real = [], m._eval_ubatch

    def spy(*args, **kwargs):  # the rotary positions the micro-batch is given
        seen.append(inspect.signature(real).bind(*args, **kwargs).arguments["rope4"])
        return real(*args, **kwargs)
    monkeypatch.setattr(m, "_eval_ubatch", spy)
    m.eval_embeddings(rows, grid=(3, 2))
    monkeypatch.undo()
    assert seen[0].tolist() == [[4] * 6, [4, 4, 4, 5, 5, 5], [4, 5, 6, 4, 5, 6], [0] * 6]
    kv = m.memory
    assert kv.seq_len(0) == 10
    assert kv.rope_positions(np.array([0, 0]), np.array([10, 11], np.int32)).tolist() == [7, 8]
    kv.keep_prefix(0, 10)
    assert kv.rope_positions(np.array([0]), np.array([10], np.int32)).tolist() == [7]
    kv.keep_prefix(0, 6)
    assert kv.rope_positions(np.array([0]), np.array([6], np.int32)).tolist() == [6]
    m.reset()


@pytest.mark.parametrize("grid, message", [((4, 2), "grid 4x2 is not the 6 rows given")])
def test_mrope_grid_must_match(qwen3vl_text_model, grid, message):
    qwen3vl_text_model.reset()
    with pytest.raises(ValueError, match=message):
        qwen3vl_text_model.eval_embeddings(torch.zeros(6, qwen3vl_text_model.hp.n_embd_inp), grid=grid)


def test_mmproj_width_must_match(files, text_model, tmp_path):
    path = write_tiny_mmproj(tmp_path / "narrow.gguf", replace(MMPROJ_BY_NAME["gemma3"], n_embd_text=32))
    with pytest.raises(ValueError, match="32-wide embeddings but .* has n_embd 64"):
        Multimodal(text_model, load_mmproj(path))


# ---------------------------------------------------------------- docs/multimodal.md


def test_docs_example_runs(tmp_path, monkeypatch, capsys):
    import re
    doc = Path(__file__).resolve().parents[1] / "docs" / "multimodal.md"
    blocks = re.findall(r"^```python\n(.*?)^```", doc.read_text(), flags=re.S | re.M)
    assert len(blocks) == 2
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "multimodal_doc"}
    exec(compile("\n".join(blocks), str(doc), "exec"), namespace)
    out = capsys.readouterr().out.splitlines()
    assert out[-2:] == ["(64, 48) [(3, 64, 64)]", "(16, 64)"]
    assert tuple(namespace["logits"].shape) == (1, namespace["model"].n_vocab)
    namespace["mm"].close()


# ---------------------------------------------------------------- prompts with markers, the CLI


@pytest.mark.parametrize("text, n, expect", [
    ("Describe <__media__> now", 1, ["Describe ", "IMG0", " now"]),
    ("no marker", 2, ["IMG0", "IMG1", "no marker"]),
    ("<__media__><__media__>", 2, ["IMG0", "IMG1"]),
])
def test_media_prompt(text, n, expect):
    from torchggml.mtmd import media_prompt
    parts = media_prompt(text, [f"img{i}.png" for i in range(n)])
    shown = [f"IMG{p.source[3]}" if isinstance(p, Image) else p for p in parts]
    assert shown == expect


@pytest.mark.parametrize("content, text, n_media", [
    ("plain", "plain", 0),
    ([{"type": "text", "text": "a "}, {"type": "image", "image": "x.png"}, " b"], "a <__media__> b", 1),
    ([Image("x.png"), Audio(np.zeros(4, np.float32))], "<__media__><__media__>", 2),
    ([PILImage.new("RGB", (4, 4)), {"type": "audio", "audio": "a.wav"}], "<__media__><__media__>", 2),
])
def test_split_media(content, text, n_media):
    from torchggml.mtmd import split_media
    messages, media = split_media([{"role": "user", "content": content}])
    assert messages == [{"role": "user", "content": text}] and len(media) == n_media
    assert all(isinstance(m, (Image, Audio)) or isinstance(m, PILImage.Image) for m in media)


def test_split_media_bad_part():
    from torchggml.mtmd import split_media
    with pytest.raises(ValueError, match=r"messages\[0\]: a content part must be text, an image or audio"):
        split_media([{"role": "user", "content": [{"type": "video", "video": "v.mp4"}]}])


def test_chat_with_image_equals_generate(files, text_model):
    """Multimodal.chat renders the template with the media marker where the image is, and
    generates over those parts: the same tokens as generate on the parts built by hand."""
    mm = Multimodal(text_model, load_mmproj(files["gemma3-F32"]))
    messages = [{"role": "user", "content": ["Look: ", {"type": "image", "image": synthetic_image()}, " ok?"]}]
    by_chat = "".join(mm.chat(messages, max_tokens=4, temperature=0))
    prompt = text_model.chat_prompt([{"role": "user", "content": "Look: <__media__> ok?"}])
    from torchggml.mtmd import media_prompt
    parts = media_prompt(prompt, [Image(synthetic_image())])
    parts[0] = text_model.tokenize(parts[0], add_special=True, parse_special=True)
    by_hand = "".join(mm.generate(parts, max_tokens=4, temperature=0, stop=text_model.chat_stops()))
    assert by_chat == by_hand
    mm.encoder.close()
    mm.mmproj.close()


def test_media_prompt_count_mismatch():
    from torchggml.mtmd import media_prompt
    with pytest.raises(ValueError, match="2 <__media__> markers for 1 images or audio clips"):
        media_prompt("<__media__> and <__media__>", ["a.png"])


@pytest.mark.parametrize("extra, ok, message", [
    (["--mmproj", "{mmproj}", "--image", "{image}", "-p", "Look <__media__>"], True, ""),
    (["--image", "{image}"], False, "--image needs --mmproj"),
    (["--mmproj", "{mmproj}", "--image", "{bad}"], False, "not an image Pillow can decode"),
])
def test_cli_run_with_image(files, tmp_path, capsys, extra, ok, message):
    from torchggml.cli import main
    image, bad = tmp_path / "x.png", tmp_path / "bad.png"
    PILImage.fromarray(synthetic_image()).save(image)
    bad.write_bytes(b"nope")
    values = {"mmproj": str(files["gemma3-F32"]), "image": str(image), "bad": str(bad)}
    argv = ["run", str(files["text"]), "-n", "3", "-s", "0"] + [a.format(**values) for a in extra]
    rc = main(argv)
    err = capsys.readouterr().err
    assert (rc == 0) == ok and message in err


# ---------------------------------------------------------------- audio


def _wav(path, samples, rate=16000, channels=1, width=2):
    import wave
    pcm = (np.repeat(samples[:, None], channels, 1) * 32767).astype(np.int16 if width == 2 else np.int32)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return path


@pytest.mark.parametrize("channels", [1, 2])
def test_load_audio_wav(tmp_path, channels):
    from torchggml.mtmd import load_audio
    x = synthetic_audio(0.1)
    ours = load_audio(_wav(tmp_path / "a.wav", x, channels=channels))
    assert ours.dtype == np.float32 and np.abs(ours - x).max() < 1e-4


@pytest.mark.parametrize("make, message", [
    (lambda p: _wav(p, synthetic_audio(0.1), width=1), "8-bit PCM; 16 or 32-bit PCM WAV files are read"),
    (lambda p: (p.write_bytes(b"RIFF....not a wav"), p)[1], "not a WAV file"),
])
def test_load_audio_errors(tmp_path, make, message):
    from torchggml.mtmd import load_audio
    with pytest.raises(ValueError, match=message):
        load_audio(make(tmp_path / "a.wav"))


@pytest.mark.parametrize("name, stack, n_tokens", [("qwen2a", 1, 750), ("ultravox", 4, 375), ("voxtral", 5, 150)])
def test_audio_stack_factor(files, name, stack, n_tokens):
    """A 30 s chunk's 1500 encoder frames: qwen2a and voxtral pool pairs; ultravox and voxtral
    stack `stack` frames as one row."""
    mm = load_mmproj(files[f"{name}-F32"])
    assert mm.audio.stack_factor == stack
    enc = Encoder(mm)
    assert enc.encode_mel(torch.zeros(16, 3000)).shape == (n_tokens, 64)
    enc.close()
    mm.close()


def test_stack_frames_pads_the_last_row():
    """7 frames of 2 stacked by 3: rows of 6, the last row's missing frames zeros (llama.cpp's build_stack)."""
    import torchggml as ggml
    from torchggml.context import Context, new_tensor_2d
    from torchggml.graph import build_forward_expand, new_graph
    from torchggml.mtmd.whisper import stack_frames
    from torchggml.types import Type
    ctx = Context(no_alloc=True)
    x = new_tensor_2d(ctx, Type.F32, 2, 7)
    out = stack_frames(ctx, x, 3)
    graph = new_graph(ctx)
    build_forward_expand(graph, out)
    cpu = ggml.backend_cpu_init()
    buffer = ggml.backend_alloc_ctx_tensors(ctx, cpu)
    ggml.backend_tensor_set(x, torch.arange(14, dtype=torch.float32))
    ggml.backend_graph_compute(cpu, graph)
    assert out.ne[:2] == [6, 3]
    expect = torch.cat([torch.arange(14, dtype=torch.float32), torch.zeros(4)]).reshape(3, 6)
    assert torch.equal(ggml.backend_tensor_get(out).reshape(3, 6), expect)
    ggml.backend_buffer_free(buffer)
    ggml.backend_free(cpu)


def wav_44k(path):
    """The 44.1 kHz WAV of scripts/gen_mtmd_golden.py (kept equal: libmtmd decoded it)."""
    import wave
    t = np.arange(44100 // 2) / 44100.0
    rng = np.random.default_rng(7)
    x = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * 1234 * t) + 0.05 * rng.normal(size=t.size)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(44100)
        w.writeframes((np.clip(x, -1, 1) * 32767).astype(np.int16).tobytes())
    return path


@needs_golden
def test_resampling_is_miniaudios(tmp_path):
    """A 44.1 kHz WAV resampled to 16 kHz equals libmtmd's decode (miniaudio's linear resampler)
    sample for sample."""
    from torchggml.mtmd import load_audio
    ours, theirs = load_audio(wav_44k(tmp_path / "a.wav")), np.load(DATA / "decode.npz")["wav"]
    assert ours.shape == theirs.shape and np.array_equal(ours, theirs)


@needs_golden
def test_mp3_decoding_vs_libmtmd(files):
    """An mp3 (44.1 kHz) through soundfile (libsndfile's mpg123) and our resampler, against
    libmtmd's (dr_mp3 and miniaudio's resampler): the decoders differ by float rounding."""
    soundfile = pytest.importorskip("soundfile", reason="the audio extra (soundfile) is not installed")
    if "MP3" not in soundfile.available_formats():
        pytest.skip(f"libsndfile {soundfile.__libsndfile_version__} reads no mp3 (1.1 or newer does)")
    from torchggml.mtmd import load_audio
    ours, theirs = load_audio(DATA / "tone-44k.mp3"), np.load(DATA / "decode.npz")["mp3"]
    assert ours.shape == theirs.shape
    assert float(np.abs(ours - theirs).max()) <= MP3_MAX_SAMPLE_DIFF
    mm = load_mmproj(files["qwen2a-F32"])
    mel_ours, mel_theirs = log_mel(ours, mm.audio), log_mel(theirs, mm.audio)
    assert max(float((a - b).abs().max()) for a, b in zip(mel_ours, mel_theirs)) <= MP3_MAX_MEL_DIFF
    mm.close()


@pytest.mark.parametrize("n, rate_in, rate_out, n_out", [(441, 44100, 16000, 160), (1000, 48000, 16000, 333),
                                                         (100, 8000, 16000, 200), (50, 16000, 16000, 50)])
def test_resample_lengths(n, rate_in, rate_out, n_out):
    """floor(n * rate_out / rate_in) samples, the first the filter's zero state (miniaudio's)."""
    from torchggml.mtmd.audio import resample
    y = resample(np.ones(n, np.float32), rate_in, rate_out)
    assert y.size == n_out and (rate_in == rate_out or y[0] == 0.0)


@pytest.mark.parametrize("name, size", [("ldp", 40), ("ldpv2", 64)])
def test_ldp_needs_its_grid(files, name, size):
    """clip.cpp's LDP graphs take a 24 x 24 patch grid only: another tile is refused by name."""
    mm = load_mmproj(files[f"{name}-F32"])
    with pytest.raises(ValueError, match=f"{name} needs a 24x24 patch grid \\(a 48x48 tile\\), got {size}x{size}"):
        Encoder(mm).encode_tile(torch.zeros(3, size, size))
    mm.close()


def test_audio_hparams_and_chunks(files):
    mm = load_mmproj(files["qwen2a-F32"])
    assert mm.vision is None and mm.projector == "qwen2a" and mm.n_embd_text == 64
    assert (mm.audio.n_mel, mm.audio.n_embd, mm.audio.n_layer) == (16, 32, 2)
    # 2 s of audio plus the 30 s of silence whisper pads: one 3000-frame chunk; 31 s: two
    assert [tuple(m.shape) for m in log_mel(synthetic_audio(2.0), mm.audio)] == [(16, 3000)]
    assert len(log_mel(synthetic_audio(31.0), mm.audio)) == 2
    with pytest.raises(ValueError, match="encodes mel chunks, not images"):
        Encoder(mm).encode_tile(torch.zeros(3, 64, 64))
    mm.close()
