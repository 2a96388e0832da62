"""A text model with an mmproj: images in prompts.

    from torchggml.mtmd import Image, load_multimodal
    mm = load_multimodal("model.gguf", "mmproj.gguf")
    print("".join(mm.generate(["Describe ", Image("photo.jpg"), " briefly."], max_tokens=32)))

A prompt is a list of parts: texts, token-id lists, images (`Image(path | bytes | PIL image |
uint8 array)`, or a PIL image directly) and audio (`Audio(wav path | float samples)`). Each image becomes what libmtmd's tokenizer makes of it:
the projector's marker texts around its embeddings (gemma3: <start_of_image> ... <end_of_image>,
read non-causally), idefics3's tiles with their row/column markers, slices first and the
overview last, InternVL's slices and overview between <img> and </img>, LFM2-VL's tiles
(<|img_row_i_col_j|>) and thumbnail between <|image_start|> and <|image_end|>, Qwen-VL's image
between <|vision_start|> and <|vision_end|> at 2-D positions (its merged patch grid)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..models.prompt import EmbeddingChunk
from .encoder import Encoder
from .loader import MMProj, load_mmproj
from .audio import load_audio, log_mel
from .preprocess import PreprocessedImage, preprocess

# the non-causal projectors (mtmd_decode_use_non_causal)
NON_CAUSAL = frozenset({"gemma3"})

# the texts libmtmd puts around an audio clip's chunks
AUDIO_MARKERS = {"qwen2a": ("<|audio_bos|>", "<|audio_eos|>"), "voxtral": ("[BEGIN_AUDIO]", ""), "ultravox": ("", "")}

# the projectors whose images take M-RoPE positions in the text model (mtmd_decode_use_mrope)
MROPE = frozenset({"qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger"})

# where an image goes in a text prompt (libmtmd's default media marker)
MEDIA_MARKER = "<__media__>"


@dataclass
class Image:
    """An image part of a prompt: a path, bytes, a PIL image or a uint8 [H, W, 3] array."""
    source: object


@dataclass
class Audio:
    """An audio part of a prompt: a WAV path or float mono samples at 16 kHz (see audio.py)."""
    source: object


def _is_image(part) -> bool:
    if isinstance(part, (Image, bytes, bytearray)):
        return True
    if isinstance(part, np.ndarray) and part.dtype == np.uint8 and part.ndim == 3:
        return True
    try:
        from PIL import Image as PILImage
    except ImportError:
        return False
    return isinstance(part, PILImage.Image)


def media_prompt(text: str, media: list) -> list:
    """A text with a MEDIA_MARKER per image or audio clip as prompt parts (no marker: the media
    first, as llama.cpp's mtmd-cli puts them). ValueError when the counts differ."""
    n = text.count(MEDIA_MARKER)
    if n == 0:
        text = MEDIA_MARKER * len(media) + text
    elif n != len(media):
        raise ValueError(f"the prompt has {n} {MEDIA_MARKER} markers for {len(media)} images or audio clips")
    pieces = text.split(MEDIA_MARKER)
    parts = [pieces[0]]
    for item, piece in zip(media, pieces[1:]):
        parts += [item if isinstance(item, (Image, Audio)) else Image(item), piece]
    return [p for p in parts if not (isinstance(p, str) and not p)]


def _content_media(part, where: str):
    """A message's content part as text (str) or media (Image / Audio)."""
    if isinstance(part, str):
        return part
    if isinstance(part, (Image, Audio)) or _is_image(part):
        return part
    if isinstance(part, dict):
        kind = part.get("type")
        if kind == "text":
            return str(part.get("text") or "")
        if kind in ("image", "audio") and kind in part:
            return Image(part[kind]) if kind == "image" else Audio(part[kind])
    raise ValueError(f"{where}: a content part must be text, an image or audio ({{'type': 'text' | 'image' | "
                     f"'audio', ...}}, Image(...), Audio(...)), got {str(part)[:80]}")


def split_media(messages) -> tuple[list[dict], list]:
    """Chat messages whose content may list images and audio, as a chat template reads them:
    each media part becomes MEDIA_MARKER in its message's text (as llama-server does); and the
    media, in order."""
    out, media = [], []
    for i, m in enumerate(messages):
        content = m.get("content")
        if isinstance(content, (list, tuple)):
            text = ""
            for part in content:
                item = _content_media(part, f"messages[{i}]")
                if isinstance(item, str):
                    text += item
                else:
                    text += MEDIA_MARKER
                    media.append(item)
            m = dict(m, content=text)
        out.append(m)
    return out, media


class Multimodal:
    """A Model and an MMProj whose projector outputs the model's embedding width."""

    def __init__(self, model, mmproj: MMProj, n_threads: int | None = None):
        if mmproj.n_embd_text != model.hp.n_embd_inp:
            raise ValueError(f"{mmproj.path}: the projector outputs {mmproj.n_embd_text}-wide embeddings but "
                             f"{model.path} has n_embd {model.hp.n_embd_inp}")
        self.model, self.mmproj = model, mmproj
        self.encoder = Encoder(mmproj, n_threads)
        self._by_piece: dict[str, int] | None = None

    def lookup_token(self, piece: str) -> list[int]:
        """The id of the token whose text is `piece` (libmtmd's lookup_token), as a one-id part;
        no part when the vocabulary has none (libmtmd would pass LLAMA_TOKEN_NULL)."""
        if self._by_piece is None:
            tok = self.model.tokenizer
            self._by_piece = {}
            for i in range(tok.n_vocab):
                self._by_piece.setdefault(tok.token_to_piece(i, True), i)
        return [self._by_piece[piece]] if piece in self._by_piece else []

    def audio_parts(self, audio: Audio) -> list:
        """The prompt parts for one audio clip: its 30-second chunks' embeddings between the
        projector's markers (Qwen2-Audio: <|audio_bos|> ... <|audio_eos|>; Voxtral: [BEGIN_AUDIO] before;
        Ultravox: none), as libmtmd makes them."""
        if self.mmproj.audio is None:
            raise ValueError(f"{self.mmproj.path}: projector {self.mmproj.projector} has no audio encoder")
        mels = log_mel(load_audio(audio.source, self.mmproj.audio.sample_rate), self.mmproj.audio)
        begin, end = AUDIO_MARKERS[self.mmproj.projector]
        return [begin, *(EmbeddingChunk(self.encoder.encode_mel(m)) for m in mels), end]

    def preprocess(self, image) -> PreprocessedImage:
        return preprocess(image.source if isinstance(image, Image) else image, self.mmproj.projector,
                          self.mmproj.vision)

    def image_parts(self, image) -> list:
        """The prompt parts for one image: marker texts and EmbeddingChunks, in libmtmd's order."""
        if self.mmproj.vision is None:
            raise ValueError(f"{self.mmproj.path}: projector {self.mmproj.projector} has no vision encoder")
        pre = self.preprocess(image)
        rows = self.encoder.encode(pre)
        causal = self.mmproj.projector not in NON_CAUSAL
        chunk = lambda x: EmbeddingChunk(x, causal)  # noqa: E731
        if self.mmproj.projector == "gemma3":
            return ["<start_of_image>", chunk(rows[0]), "<end_of_image>"]
        if self.mmproj.projector == "idefics3":  # slices (a text marker each), then the overview
            (gx, gy), parts = pre.grid, []
            ids = lambda *pieces: [i for p in pieces for i in self.lookup_token(p)]  # noqa: E731
            for y in range(gy):
                for x in range(gx):
                    parts += [f"<fake_token_around_image><row_{y + 1}_col_{x + 1}>", chunk(rows[1 + y * gx + x])]
                if y != gy - 1:
                    parts.append(ids("\n"))
            return parts + [ids("\n\n", "<fake_token_around_image>", "<global-img>"), chunk(rows[0]),
                            ids("<fake_token_around_image>")]
        if self.mmproj.projector == "internvl":  # the slices, then the overview, each a chunk
            return ["<img>", *(chunk(r) for r in rows), "</img>"]
        if self.mmproj.projector in ("mlp", "ldp", "ldpv2"):  # LLaVA 1.6's slices and overview, no markers (LLaVA 1.5: one tile)
            return [chunk(r) for r in rows]
        if self.mmproj.projector == "lfm2":  # tiles with their <|img_row_i_col_j|> markers, the thumbnail last
            if pre.grid == (0, 0):
                return ["<|image_start|>", chunk(rows[0]), "<|image_end|>"]
            gx, parts = pre.grid[0], ["<|image_start|>"]
            for i, r in enumerate(rows[:-1]):
                parts += [f"<|img_row_{i // gx + 1}_col_{i % gx + 1}|>", chunk(r)]
            return parts + [self.lookup_token("<|img_thumbnail|>"), chunk(rows[-1]), "<|image_end|>"]
        if self.mmproj.projector in MROPE:  # the merged patch grid: the text model's 2-D positions
            tile, side = pre.tiles[0].pixels, self.mmproj.vision.patch_size * self.mmproj.vision.n_merge
            grid = (int(tile.shape[2]) // side, int(tile.shape[1]) // side)
            return ["<|vision_start|>", EmbeddingChunk(rows[0], True, grid), "<|vision_end|>"]
        if self.mmproj.projector == "pixtral":
            return [chunk(rows[0]), "[IMG_END]"]
        return [chunk(rows[0])]

    def parts(self, prompt) -> list:
        """The prompt with every image replaced by its parts (a text prompt is one part)."""
        if isinstance(prompt, str):
            return [prompt]
        out = []
        for p in prompt:
            out += self.audio_parts(p) if isinstance(p, Audio) else self.image_parts(p) if _is_image(p) else [p]
        return out

    def chat_parts(self, messages) -> list:
        """The prompt parts of a chat whose messages may hold images and audio (see split_media):
        the model's chat template rendered, its BOS once, each media marker replaced by the media."""
        messages, media = split_media(messages)
        text = self.model.chat_prompt(messages)
        tok = self.model.tokenizer
        has_bos = tok.bos_id is not None and text.startswith(tok.token_text(tok.bos_id))
        parts = media_prompt(text, media) if media else [text]
        if isinstance(parts[0], str):  # the first text: BOS unless the template wrote it, as Model.chat
            parts[0] = self.model.tokenize(parts[0], add_special=not has_bos, parse_special=True)
        return parts

    def chat(self, messages, **generate_args):
        """Stream the assistant's reply to `messages`, whose content may list images and audio
        (paths, bytes, PIL images, arrays: {"type": "image", "image": ...}, {"type": "audio",
        "audio": ...}, Image(...), Audio(...)); generate_args as Model.generate's."""
        generate_args["stop"] = list(generate_args.get("stop") or ()) + self.model.chat_stops()
        return self.generate(self.chat_parts(messages), **generate_args)

    def generate(self, prompt, **generate_args):
        """Model.generate over the prompt's parts, images encoded."""
        return self.model.generate(self.parts(prompt), **generate_args)

    def eval(self, prompt, seq_id: int = 0):
        """The logits [1, n_vocab] after the prompt's parts (appended to sequence seq_id)."""
        return self.model.eval_parts(self.parts(prompt), seq_id)

    def close(self) -> None:
        self.encoder.close()
        self.mmproj.close()
        self.model.close()


def load_multimodal(model, mmproj, device=None, **model_options) -> Multimodal:
    """A text model (a path or a loaded Model) and an mmproj file, both on `device` (None: the
    CPU) unless the model was given loaded; model_options go to load_model."""
    if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
        from ..models import load_model
        if device is not None:
            model_options.setdefault("devices", [device])
        model = load_model(model, **model_options)
    return Multimodal(model, load_mmproj(mmproj, device))
