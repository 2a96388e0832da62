"""Images as llama.cpp's mtmd preprocesses them (mtmd-image.cpp), on torch.

Decoding is Pillow's (the optional extra `vision`); llama.cpp decodes with stb_image, whose
JPEG decoder rounds a little differently, so a decoded JPEG can differ from llama.cpp's by a
few levels per pixel; both sides are given the same RGB bytes when they are compared. Resizing
is Pillow's own: llama.cpp's resize is a port of Pillow's separable resampling (bilinear,
bicubic with a = -0.5, Lanczos-3, 22-bit fixed point), so Pillow's result is llama.cpp's to the
byte. Normalisation is float32 (x / 255 - mean) / std per channel, as clip_image_f32::normalize.

An image becomes one or more `Tile`s, each a float32 [3, H, W] tensor the encoder reads:
- fixed size (gemma3, LLaVA 1.5 `mlp`, MobileVLM `ldp` / `ldpv2`): letterboxed into image_size x image_size (PAD_CEIL: the
  scaled size rounded up, centred on the pad colour);
- dynamic size (qwen2vl, pixtral): the aspect ratio kept, each side a multiple of patch x merge, the
  pixel count within the projector's token limits (transformers' smart_resize), letterboxed;
- idefics3: resized so the longest edge is preproc_image_size, then up to a multiple of
  image_size and cut into image_size tiles row by row, after an overview of the whole image;
- LLaVA-UHD slicing with candidate sizes (internvl's tile grids, LLaVA 1.6's pinpoints): an image larger than image_size is
  letterboxed into the candidate size that keeps most of its pixels (then wastes least) and cut
  into image_size tiles row by row; the overview is the whole image stretched to image_size.
  the slices come first, the overview last (libmtmd's order for both);
- lfm2 (LFM2-VL): the aspect kept within 64..256 tokens (as dynamic size, stretched); an image
  above twice the token limit is also cut into 512 x 512 tiles on the grid of 2..10 tiles whose
  aspect is closest, letterboxed, the resized whole image (the thumbnail) after them."""
from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass, field

import numpy as np
import torch

from .loader import VisionHParams


def _pil():
    try:
        from PIL import Image
    except ImportError:
        raise ImportError("images need Pillow: pip install 'torchggml[vision]'") from None
    return Image


def load_image(source) -> np.ndarray:
    """RGB uint8 [H, W, 3] from a path, bytes, a PIL image, or a uint8 array / tensor [H, W, 3].
    A file Pillow cannot read raises ValueError naming it."""
    Image = _pil()
    if isinstance(source, torch.Tensor):
        source = source.detach().cpu().numpy()
    if isinstance(source, np.ndarray):
        if source.dtype != np.uint8 or source.ndim != 3 or source.shape[2] != 3:
            raise ValueError(f"image array: expected uint8 [H, W, 3] RGB, got {source.dtype} {list(source.shape)}")
        return np.ascontiguousarray(source)
    if isinstance(source, Image.Image):
        return np.asarray(source.convert("RGB"))
    name = "image bytes" if isinstance(source, (bytes, bytearray)) else os.fspath(source)
    try:
        with Image.open(io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else name) as img:
            return np.asarray(img.convert("RGB"))
    except FileNotFoundError:
        raise
    except Exception as e:  # Pillow's UnidentifiedImageError, truncated data (OSError), ...
        raise ValueError(f"{name}: not an image Pillow can decode ({type(e).__name__}: {e})") from None


def resize(image: np.ndarray, width: int, height: int, algo: str) -> np.ndarray:
    """Pillow's resampling (llama.cpp's resize_pillow), uint8 RGB in and out."""
    Image = _pil()
    if image.shape[1] == width and image.shape[0] == height:
        return image
    resample = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "lanczos": Image.LANCZOS}[algo]
    return np.asarray(Image.fromarray(image).resize((width, height), resample, reducing_gap=None))


def letterbox(image: np.ndarray, width: int, height: int, algo: str, pad: str, color) -> np.ndarray:
    """Resize into width x height keeping the aspect ratio, centred on `color` (img_tool::resize:
    PAD_CEIL rounds the scaled size up, PAD_NEAREST to nearest; PAD_NONE stretches)."""
    h0, w0 = image.shape[:2]
    if pad == "none" or (w0 == width and h0 == height):
        return resize(image, width, height, algo)
    # float32 arithmetic, as the C++ (float scale, float products)
    scale = min(np.float32(width) / np.float32(w0), np.float32(height) / np.float32(h0))
    rnd = math.ceil if pad == "ceil" else lambda x: int(np.round(x))
    new_w = min(int(rnd(np.float32(w0) * scale)), width)
    new_h = min(int(rnd(np.float32(h0) * scale)), height)
    out = np.empty((height, width, 3), dtype=np.uint8)
    out[:] = np.asarray(color, dtype=np.uint8)
    if pad == "ceil":
        x0, y0 = (width - new_w) // 2, (height - new_h) // 2
    else:
        x0, y0 = int(np.round((width - new_w) / 2.0)), int(np.round((height - new_h) / 2.0))
    out[y0:y0 + new_h, x0:x0 + new_w] = resize(image, new_w, new_h, algo)
    return out


def normalize(image: np.ndarray, mean, std, device=None) -> torch.Tensor:
    """uint8 [H, W, 3] -> float32 [3, H, W]: (x / 255 - mean) / std, in float32 like clip.cpp."""
    x = torch.from_numpy(np.array(image, dtype=np.uint8)).to(device).permute(2, 0, 1).float() / 255.0
    m = torch.tensor(mean, dtype=torch.float32, device=x.device).view(3, 1, 1)
    s = torch.tensor(std, dtype=torch.float32, device=x.device).view(3, 1, 1)
    return (x - m) / s


@dataclass
class Tile:
    pixels: torch.Tensor         # float32 [3, H, W], normalised
    kind: str = "image"          # "image" (the whole image), "overview" or "slice"
    row: int = 0                 # a slice's place in the grid
    col: int = 0


@dataclass
class PreprocessedImage:
    tiles: list[Tile]
    size: tuple[int, int]        # the decoded image's (width, height)
    grid: tuple[int, int] = (0, 0)  # slices per row and column (0, 0: not sliced)
    extra: dict = field(default_factory=dict)


def preprocess(image, projector: str, hp: VisionHParams, device=None) -> PreprocessedImage:
    """The tiles the encoder of `projector` reads for `image` (see load_image for the sources)."""
    rgb = load_image(image)
    size = (rgb.shape[1], rgb.shape[0])
    norm = lambda u8: normalize(u8, hp.image_mean, hp.image_std, device)  # noqa: E731
    if projector in ("internvl", "mlp") and hp.res_candidates:  # the slices, then the overview
        pre = slice_by_candidates(rgb, hp, norm, size)
        pre.tiles = pre.tiles[1:] + pre.tiles[:1]
        return pre
    if projector in ("gemma3", "mlp", "ldp", "ldpv2"):
        n = hp.image_size
        return PreprocessedImage([Tile(norm(letterbox(rgb, n, n, hp.resize_algo, hp.resize_pad, hp.pad_color)))], size)
    if projector == "idefics3":
        return _idefics3(rgb, hp, norm, size)
    if projector == "lfm2":
        return _lfm2(rgb, hp, norm, size)
    if projector in ("qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger", "pixtral"):
        w, h = dynamic_size(size[0], size[1], hp.patch_size * hp.n_merge, hp.min_pixels, hp.max_pixels)
        return PreprocessedImage([Tile(norm(letterbox(rgb, w, h, hp.resize_algo, hp.resize_pad, hp.pad_color)))], size)
    raise ValueError(f"preprocess: no preprocessing for projector {projector!r}")


def dynamic_size(width: int, height: int, align: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The resized (width, height): each side rounded to a multiple of `align`, then scaled down
    (up) to within max_pixels (min_pixels), in float32 as img_tool::calc_size_preserved_ratio."""
    f32, fa = np.float32, np.float32(align)
    rnd = lambda x: int(math.floor(float(f32(x) / fa) + 0.5)) * align  # noqa: E731  (std::round, x >= 0)
    ceil_ = lambda x: int(math.ceil(float(f32(x) / fa))) * align  # noqa: E731
    floor_ = lambda x: int(math.floor(float(f32(x) / fa))) * align  # noqa: E731
    w_bar, h_bar = max(align, rnd(width)), max(align, rnd(height))
    if max_pixels > 0 and w_bar * h_bar > max_pixels:
        beta = np.sqrt(f32(height) * f32(width) / f32(max_pixels))
        h_bar, w_bar = max(align, floor_(f32(height) / beta)), max(align, floor_(f32(width) / beta))
    elif min_pixels > 0 and w_bar * h_bar < min_pixels:
        beta = np.sqrt(f32(min_pixels) / (f32(height) * f32(width)))
        h_bar, w_bar = ceil_(f32(height) * beta), ceil_(f32(width) * beta)
    return w_bar, h_bar


def _idefics3(rgb: np.ndarray, hp: VisionHParams, norm, size) -> PreprocessedImage:
    tile, longest = hp.image_size, hp.image_longest_edge
    if longest <= 0:
        raise ValueError("idefics3 preprocessing needs clip.vision.preproc_image_size (files without it: "
                         "not supported yet)")
    w0, h0 = size
    aspect = w0 / h0  # double, as the C++
    if w0 >= h0:
        w, h = longest, int(longest / aspect)
        h += h % 2
    else:
        w, h = int(longest * aspect), longest
        w += w % 2
    gx, gy = (w + tile - 1) // tile, (h + tile - 1) // tile
    refined = resize(resize(rgb, w, h, hp.resize_algo), gx * tile, gy * tile, hp.resize_algo)
    tiles = [Tile(norm(resize(refined, tile, tile, hp.resize_algo)), "overview")]
    for y in range(gy):
        for x in range(gx):
            tiles.append(Tile(norm(refined[y * tile:(y + 1) * tile, x * tile:(x + 1) * tile]), "slice", y, x))
    return PreprocessedImage(tiles, size, (gx, gy))


def best_resolution(width: int, height: int, candidates) -> tuple[int, int]:
    """The candidate (w, h) that keeps most of the image's pixels once the image is scaled into it
    (aspect kept, sides truncated), then wastes least (llava-uhd's select_best_resolution)."""
    best, best_kept, best_waste = None, 0, None
    for cw, ch in candidates:
        scale = min(np.float32(cw) / np.float32(width), np.float32(ch) / np.float32(height))
        kept = min(int(np.float32(width) * scale) * int(np.float32(height) * scale), width * height)
        waste = cw * ch - kept
        if kept > best_kept or (kept == best_kept and waste < best_waste):
            best, best_kept, best_waste = (cw, ch), kept, waste
    return best


def slice_by_candidates(rgb: np.ndarray, hp: VisionHParams, norm, size) -> PreprocessedImage:
    """The overview, then (for an image larger than image_size) the image_size slices of the
    refined image, row by row (mtmd-image.cpp's llava_uhd preprocessor with resolution candidates)."""
    n, (w0, h0) = hp.image_size, size
    tiles = [Tile(norm(letterbox(rgb, n, n, hp.resize_algo_ov, hp.resize_pad_ov, hp.pad_color)), "overview")]
    if w0 <= n and h0 <= n:
        return PreprocessedImage(tiles, size)
    rw, rh = best_resolution(w0, h0, hp.res_candidates)
    refined = letterbox(rgb, rw, rh, hp.resize_algo_rf, hp.resize_pad_rf, hp.pad_color_rf)
    for y in range(0, rh, n):
        for x in range(0, rw, n):
            tiles.append(Tile(norm(refined[y:y + n, x:x + n]), "slice", y // n, x // n))
    return PreprocessedImage(tiles, size, (rw // n, rh // n))


# LFM2-VL's processor constants (llama.cpp's mtmd_image_preprocessor_lfm2)
LFM2_TILE, LFM2_MIN_TILES, LFM2_MAX_TILES, LFM2_TOLERANCE = 512, 2, 10, 2.0


def lfm2_should_tile(width: int, height: int, hp: VisionHParams) -> bool:
    """Whether the image, rounded to the merged patch size (half to even, in double), exceeds twice
    the token limit."""
    align = hp.patch_size * hp.n_merge
    w_bar = max(hp.patch_size, int(np.rint(width / align)) * align)
    h_bar = max(hp.patch_size, int(np.rint(height / align)) * align)
    return float(h_bar) * float(w_bar) > hp.max_pixels * LFM2_TOLERANCE


def lfm2_grid(width: int, height: int) -> tuple[int, int]:
    """The (columns, rows) grid of 2..10 tiles whose aspect is closest to the image's; on a tie,
    the later grid (more tiles) when the image covers over half its area (float32, as the C++)."""
    grids = []
    for n in range(LFM2_MIN_TILES, LFM2_MAX_TILES + 1):
        for w in range(1, n + 1):
            for h in range(1, n + 1):
                if LFM2_MIN_TILES <= w * h <= LFM2_MAX_TILES and (w, h) not in grids:
                    grids.append((w, h))
    grids.sort(key=lambda g: g[0] * g[1])  # by area (std::sort's order within one area is not kept;
    # it matters only where two grids of one area tie in aspect distance)
    f32 = np.float32
    aspect, area = f32(width) / f32(height), f32(width * height)
    best, best_diff = (1, 1), f32(np.finfo(np.float32).max)
    for w, h in grids:
        diff = abs(aspect - f32(w) / f32(h))
        if diff < best_diff:
            best, best_diff = (w, h), diff
        elif diff == best_diff and area > f32(0.5) * f32(LFM2_TILE * LFM2_TILE * w * h):
            best = (w, h)
    return best


def _lfm2(rgb: np.ndarray, hp: VisionHParams, norm, size) -> PreprocessedImage:
    (w0, h0), align = size, hp.patch_size * hp.n_merge
    ov_w, ov_h = dynamic_size(w0, h0, align, hp.min_pixels, hp.max_pixels)
    overview = norm(letterbox(rgb, ov_w, ov_h, hp.resize_algo_ov, hp.resize_pad_ov, hp.pad_color))
    if not lfm2_should_tile(w0, h0, hp):
        return PreprocessedImage([Tile(overview)], size)
    gx, gy = lfm2_grid(w0, h0)
    n = LFM2_TILE
    refined = letterbox(rgb, gx * n, gy * n, hp.resize_algo_rf, hp.resize_pad_rf, hp.pad_color_rf)
    tiles = [Tile(norm(refined[y * n:(y + 1) * n, x * n:(x + 1) * n]), "slice", y, x)
             for y in range(gy) for x in range(gx)]
    return PreprocessedImage(tiles + [Tile(overview, "overview")], size, (gx, gy))
