"""mmproj GGUF files (llama.cpp's multimodal projectors) to weights on a torch device.

An mmproj file holds a vision (or audio) encoder and the projector that maps its output into a
text model's embedding space. Its metadata is under `clip.*` (clip.cpp's keys): the projector
type, the encoder's sizes under `clip.vision.*`, the image size, patch size, mean and std, the
merge factor; its tensors are `v.*` (the ViT), `mm.*` (the projector) and `a.*` (audio).
`load_mmproj` reads the keys as clip.cpp's load_hparams does (with each projector type's
defaults: resize algorithm, padding, merge size) and places every tensor on one device."""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..backend.device import Device
from ..gguf.loader import GGUFFile, WeightBuffers, load_weights, open_gguf
from ..gguf.reader import GGUFError
from ..models.placement import cpu_device, find_device
from ..tensor import Tensor

# projector types torchggml encodes (one graph module each; see encoders.py)
SUPPORTED_PROJECTORS = ("gemma3", "idefics3", "mlp", "qwen2vl_merger", "qwen2.5vl_merger", "pixtral", "qwen2a",
                        "internvl", "lfm2", "qwen3vl_merger", "ultravox", "voxtral", "ldp", "ldpv2")
AUDIO_PROJECTORS = frozenset({"qwen2a", "ultravox", "voxtral"})

# every type clip.cpp's projector table names, for the error that tells "unknown" from "not yet"
LLAMA_CPP_PROJECTORS = frozenset((
    "mlp", "mlp_norm", "ldp", "ldpv2", "resampler", "glm_edge", "merger", "gemma3", "gemma3nv", "gemma3na",
    "gemma4v", "gemma4a", "idefics3", "pixtral", "qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger",
    "ultravox", "internvl", "llama4", "qwen2a", "qwen2.5o", "voxtral", "lfm2", "kimivl", "lightonocr",
    "cogvlm", "janus_pro", "lfm2a", "glm4v", "youtuvl", "phi4", "kimik25", "deepseekocr", "musicflamingo",
    "glma", "paddleocr", "step3vl", "minicpmv4_6", "qwen3a", "dotsocr", "hunyuanocr"))


class UnsupportedProjectorError(GGUFError):
    """An mmproj file whose projector type torchggml has no encoder for."""


# clip.cpp's resize algorithms and paddings (mtmd-image.cpp)
RESIZE_ALGOS = ("bilinear", "bicubic", "lanczos")
PADDINGS = ("none", "ceil", "nearest")


@dataclass
class EncoderHParams:
    """What every encoder has (clip.{vision,audio}.*): the transformer's sizes and the projection."""
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    n_head_kv: int
    d_head: int
    projection_dim: int
    eps: float


@dataclass
class VisionHParams(EncoderHParams):
    """The vision encoder's hyper-parameters, as clip.cpp's clip_hparams after load_hparams."""
    image_size: int = 0
    patch_size: int = 0
    image_mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    image_std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    act: str = "gelu_quick"      # the FFN activation: gelu, silu or gelu_quick (clip.use_gelu/use_silu)
    n_merge: int = 1             # patches merged per side by the projector (pool, pixel shuffle)
    resize_algo: str = "bicubic"
    resize_pad: str = "ceil"     # letterbox a non-square image into the fixed size (PAD_CEIL)
    pad_color: tuple[int, int, int] = (0, 0, 0)
    image_longest_edge: int = 0  # idefics3: the resized image's longest edge (0: image_size)
    min_pixels: int = 0          # dynamic-size projectors (qwen2vl): the resized image's pixel range
    max_pixels: int = 0
    n_wa_pattern: int = 0        # qwen2.5vl: every n-th layer attends fully, the others by window
    # LLaVA-UHD slicing (internvl, LLaVA 1.6): the refined image's candidate sizes (w, h), and how the
    # overview (ov) and the refined image (rf) are resized (clip.cpp's image_*_ov / image_*_rf)
    res_candidates: tuple[tuple[int, int], ...] = ()
    resize_algo_ov: str = "bicubic"
    resize_pad_ov: str = "none"
    resize_algo_rf: str = "bicubic"
    resize_pad_rf: str = "ceil"
    pad_color_rf: tuple[int, int, int] = (0, 0, 0)


@dataclass
class AudioHParams(EncoderHParams):
    """The audio encoder's hyper-parameters (clip.audio.*; whisper's preprocessing constants)."""
    n_mel: int = 0
    act: str = "gelu_erf"        # every whisper-encoder projector (clip.cpp sets FFN_GELU_ERF)
    sample_rate: int = 16000
    n_fft: int = 400
    window: int = 400
    hop: int = 160
    chunk_frames: int = 3000     # 30 s: the encoder reads one chunk of mel frames at a time
    stack_factor: int = 1        # ultravox, voxtral: encoder frames stacked as one projector row


def _key_reader(file: GGUFFile, section: str):
    """key(name, default): metadata clip.{section}.{name}; GGUFError naming it when it is
    missing and no default is given."""
    def key(name, default=GGUFError):
        value = file.get(f"clip.{section}.{name}", None)
        if value is None:
            if default is GGUFError:
                raise GGUFError(f"{file.path}: metadata key 'clip.{section}.{name}' is missing")
            return default
        return value
    return key


def _encoder_hparams(key) -> dict:
    n_embd, n_head = int(key("embedding_length")), int(key("attention.head_count"))
    return dict(n_embd=n_embd, n_ff=int(key("feed_forward_length")), n_layer=int(key("block_count")), n_head=n_head,
                n_head_kv=int(key("attention.head_count_kv", n_head)),
                d_head=int(key("attention.head_dim", 0)) or n_embd // n_head,
                projection_dim=int(key("projection_dim")), eps=float(key("attention.layer_norm_epsilon")))


def read_audio_hparams(file: GGUFFile, projector: str) -> AudioHParams:
    key = _key_reader(file, "audio")
    stack = int(key("projector.stack_factor")) if projector in ("ultravox", "voxtral") else 1
    if stack < 1:
        raise GGUFError(f"{file.path}: clip.audio.projector.stack_factor is {stack}")
    return AudioHParams(**_encoder_hparams(key), n_mel=int(key("num_mel_bins")), stack_factor=stack)


def _projector_type(file: GGUFFile) -> str:
    projector = file.get("clip.projector_type", None) or file.get("clip.vision.projector_type", None)
    if projector is None:
        raise GGUFError(f"{file.path}: not an mmproj file: metadata key 'clip.projector_type' is missing")
    return str(projector)


def check_projector(path: str, projector: str) -> None:
    """The one-line error for a projector type without an encoder here."""
    if projector in SUPPORTED_PROJECTORS:
        return
    known = "a type llama.cpp knows, not yet supported here" if projector in LLAMA_CPP_PROJECTORS \
        else "unknown to llama.cpp too"
    raise UnsupportedProjectorError(f"{path}: projector type {projector!r} is {known} "
                                    f"(supported: {', '.join(SUPPORTED_PROJECTORS)})")


def read_vision_hparams(file: GGUFFile, projector: str) -> VisionHParams:
    """clip.vision.* with the projector type's defaults (clip.cpp's load_hparams)."""
    if not file.get("clip.has_vision_encoder", False):
        raise GGUFError(f"{file.path}: the mmproj file has no vision encoder (clip.has_vision_encoder)")
    key = _key_reader(file, "vision")
    mean, std = key("image_mean", None), key("image_std", None)
    if mean is None or std is None or len(mean) < 3 or len(std) < 3:
        raise GGUFError(f"{file.path}: clip.vision.image_mean and image_std need 3 values each, "
                        f"got {mean!r} and {std!r}")
    gelu, silu = bool(file.get("clip.use_gelu", False)), bool(file.get("clip.use_silu", False))
    if gelu and silu:
        raise GGUFError(f"{file.path}: clip.use_gelu and clip.use_silu are both set")
    hp = VisionHParams(
        **_encoder_hparams(key), image_size=int(key("image_size")), patch_size=int(key("patch_size")),
        image_mean=tuple(float(x) for x in mean[:3]), image_std=tuple(float(x) for x in std[:3]),
        act="gelu" if gelu else "silu" if silu else "gelu_quick")
    scale_factor = key("projector.scale_factor", None)
    if projector == "gemma3":
        hp.n_merge, hp.resize_algo = int(scale_factor or 4), "bilinear"
    elif projector == "idefics3":
        hp.n_merge, hp.resize_algo = int(scale_factor or 1), "lanczos"
        hp.image_longest_edge = int(key("preproc_image_size", 0))
    elif projector in ("mlp", "ldp", "ldpv2"):
        if key("feature_layer", None) is not None:
            raise UnsupportedProjectorError(f"{file.path}: projector {projector!r} with clip.vision.feature_layer (several "
                                            f"layers' features) is not supported yet")
        pinpoints = [int(v) for v in key("image_grid_pinpoints", [])]
        if len(pinpoints) % 2:
            raise GGUFError(f"{file.path}: clip.vision.image_grid_pinpoints has an odd number of values ({len(pinpoints)})")
        # LLaVA 1.6: LLaVA-UHD slicing over the pinpoints (the overview stretched, the refined image
        # letterboxed on black, both bicubic: clip.cpp's defaults then); LLaVA 1.5: letterboxed on grey
        if pinpoints and projector != "mlp":
            raise UnsupportedProjectorError(f"{file.path}: projector {projector!r} with image_grid_pinpoints "
                                            f"(slices) is not supported")
        hp.res_candidates = tuple(zip(pinpoints[0::2], pinpoints[1::2]))
        hp.pad_color = (122, 116, 104)
    elif projector in ("qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger"):
        hp.n_merge, hp.resize_algo = int(key("spatial_merge_size", 2)), "bicubic"
        # Qwen2.5-VL must say its window pattern (clip.cpp requires the key); Qwen2-VL may
        hp.n_wa_pattern = int(key("n_wa_pattern") if projector == "qwen2.5vl_merger" else key("n_wa_pattern", 0))
        if hp.n_merge != 2:
            raise GGUFError(f"{file.path}: {projector} with spatial_merge_size {hp.n_merge}: the graph merges 2 x 2")
        area = (hp.patch_size * hp.n_merge) ** 2  # llama.cpp's token limits: 8 to 4096 tokens
        hp.min_pixels, hp.max_pixels = 8 * area, 4096 * area
    elif projector == "pixtral":
        hp.n_merge, hp.resize_algo = int(key("spatial_merge_size", 1)), "bicubic"
        area = (hp.patch_size * hp.n_merge) ** 2  # llama.cpp's token limits: 8 to 1024 tokens
        hp.min_pixels, hp.max_pixels = 8 * area, 1024 * area
    elif projector == "internvl":
        hp.n_merge = int(scale_factor or 1)
        lo, hi = int(key("preproc_min_tiles", 1)), int(key("preproc_max_tiles", 12))
        if not 1 <= lo <= hi:
            raise GGUFError(f"{file.path}: internvl tiles: preproc_min_tiles {lo}, preproc_max_tiles {hi}")
        hp.res_candidates = internvl_candidates(hp.image_size, lo, hi)
    elif projector == "lfm2":
        hp.n_merge, hp.resize_algo = int(scale_factor or 1), "bilinear"
        hp.resize_algo_ov = hp.resize_algo_rf = "bilinear"
        area = (hp.patch_size * hp.n_merge) ** 2  # LFM2-VL's processor: 64 to 256 tokens
        hp.min_pixels, hp.max_pixels = 64 * area, 256 * area
    if hp.image_size % hp.patch_size:
        raise GGUFError(f"{file.path}: image_size {hp.image_size} is not a multiple of patch_size {hp.patch_size}")
    return hp


def internvl_candidates(size: int, lo: int, hi: int) -> tuple[tuple[int, int], ...]:
    """InternVL's tile grids a x b with lo <= a * b <= hi, as (width, height) in pixels, in
    clip.cpp's order (a ascending, then b)."""
    return tuple((a * size, b * size) for a in range(lo, hi + 1)
                 for b in range(max((lo + a - 1) // a, lo), min(hi // a, hi) + 1))


@dataclass
class MMProj:
    """A loaded mmproj file: its projector type, vision hyper-parameters and weights (ggml
    tensors in one device's buffers)."""
    path: str
    file: GGUFFile
    projector: str
    vision: VisionHParams | None   # None: an audio-only file
    weights: WeightBuffers
    device: Device
    audio: AudioHParams | None = None

    def hparams(self, prefix: str):
        """The encoder's hyper-parameters by tensor prefix: "v" (vision) or "a" (audio)."""
        return self.vision if prefix == "v" else self.audio

    def tensor(self, name: str, required: bool = True) -> Tensor | None:
        t = self.weights.get(name)
        if t is None and required:
            raise GGUFError(f"{self.path}: tensor {name!r} is missing (projector {self.projector!r})")
        return t

    @property
    def n_embd_text(self) -> int:
        """The width of the embeddings the projector outputs (the text model's input width: its
        n_embd, times 1 + the deepstack layers for Qwen3-VL)."""
        n_deepstack = sum(1 for il in range(self.vision.n_layer)
                          if self.weights.get(f"v.deepstack.{il}.fc2.weight") is not None) if self.vision else 0
        return (self.vision or self.audio).projection_dim * (1 + n_deepstack)

    def close(self) -> None:
        self.weights.free()
        self.file.close()


def load_mmproj(path, device=None) -> MMProj:
    """Read an mmproj GGUF and place its tensors on `device` (a name such as "CUDA0", a Device,
    or None for the CPU). UnsupportedProjectorError (one line: the file and the type) for a
    projector type without an encoder here."""
    path = os.fspath(path)
    file = open_gguf(path)
    try:
        projector = _projector_type(file)
        check_projector(path, projector)
        if projector in AUDIO_PROJECTORS:
            if not file.get("clip.has_audio_encoder", False):
                raise GGUFError(f"{path}: projector {projector!r} but no audio encoder (clip.has_audio_encoder)")
            vision, audio = None, read_audio_hparams(file, projector)
        else:
            vision, audio = read_vision_hparams(file, projector), None
        device = cpu_device() if device is None else find_device(device)
        buft = device.get_buffer_type()
        weights = load_weights(file, lambda name: buft, progress=False)
    except BaseException:
        file.close()
        raise
    return MMProj(path, file, projector, vision, weights, device, audio)
