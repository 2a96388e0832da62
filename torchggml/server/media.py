"""Images and audio in chat messages, as llama-server takes them: OpenAI's `image_url` and
`input_audio` content parts, whose bytes go to the model's projector (`serve --mmproj`,
torchggml.mtmd) and whose place in the text becomes the media marker.

A part's URL (image_url.url, input_audio.data) is one of
- a data URL, `data:image/png;base64,...` (image/, audio/ types);
- raw base64;
- `file://NAME`, a file under the server's `--media-path` folder (refused without one);
- `http://` / `https://`, downloaded (at most MAX_DOWNLOAD bytes, DOWNLOAD_TIMEOUT seconds).
"""
from __future__ import annotations

import base64
import binascii
import os
import urllib.request

from .protocol import APIError

MAX_DOWNLOAD = 10 << 20   # bytes, as llama-server
DOWNLOAD_TIMEOUT = 10.0   # seconds


def media_bytes(url: str, media_path: str | None, where: str) -> bytes:
    """The bytes a content part's URL names; APIError 400 naming `where` when it cannot be read."""
    if not isinstance(url, str) or not url:
        raise APIError(400, f"{where}: the url is missing", "messages")
    if url.startswith(("http://", "https://")):
        return _download(url, where)
    if url.startswith("file://"):
        return _local_file(url[len("file://"):], media_path, where)
    if url.startswith("data:"):
        head, sep, data = url.partition(",")
        if not sep or not head.startswith(("data:image/", "data:audio/")) or not head.endswith(";base64"):
            raise APIError(400, f"{where}: a data URL must be data:image/...;base64,... or data:audio/...;base64,... "
                                f"(got {head[:60]!r})", "messages")
        url = data
    try:
        raw = base64.b64decode(url, validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, f"{where}: neither a URL (data:, file://, http://) nor valid base64", "messages") from None
    if not raw:
        raise APIError(400, f"{where}: the media data is empty", "messages")
    return raw


def _local_file(name: str, media_path: str | None, where: str) -> bytes:
    if not media_path:
        raise APIError(400, f"{where}: file:// URLs are not allowed unless the server is started with --media-path",
                       where)
    root = os.path.realpath(media_path)
    path = os.path.realpath(os.path.join(root, name))
    if not name or os.path.isabs(name) or os.path.commonpath([root, path]) != root:
        raise APIError(400, f"{where}: file path {name[:200]!r} is not allowed (a name inside --media-path)", "messages")
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        raise APIError(400, f"{where}: file {name[:200]!r} does not exist or cannot be opened", "messages") from None


def _download(url: str, where: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT) as r:  # noqa: S310 (http(s) only, checked above)
            data = r.read(MAX_DOWNLOAD + 1)
    except Exception as e:
        raise APIError(400, f"{where}: failed to download {url[:200]} ({type(e).__name__}: {e})", "messages") from None
    if len(data) > MAX_DOWNLOAD:
        raise APIError(400, f"{where}: {url[:200]} is larger than {MAX_DOWNLOAD} bytes", "messages")
    return data


def resolve_content(content: list, mm, media_path: str | None, where: str) -> list[dict]:
    """OpenAI content parts as torchggml.mtmd's chat parts, decoded for the Multimodal `mm`:
    {"type": "text"}, {"type": "image", "image": RGB array}, {"type": "audio", "audio": samples}."""
    from ..mtmd import load_audio, load_image
    out = []
    for k, part in enumerate(content):
        here = f"{where}.content[{k}]"
        try:
            if part.type == "text":
                out.append({"type": "text", "text": part.text or ""})
            elif part.type == "image_url":
                if mm.mmproj.vision is None:
                    raise ValueError(f"projector {mm.mmproj.projector} has no vision encoder")
                url = part.image_url if isinstance(part.image_url, str) else (part.image_url or {}).get("url")
                out.append({"type": "image", "image": load_image(media_bytes(url, media_path, here))})
            elif part.type == "input_audio":
                if mm.mmproj.audio is None:
                    raise ValueError(f"projector {mm.mmproj.projector} has no audio encoder")
                url = (part.input_audio or {}).get("data") or (part.input_audio or {}).get("url")
                out.append({"type": "audio", "audio": load_audio(media_bytes(url, media_path, here),
                                                                 mm.mmproj.audio.sample_rate)})
            else:
                raise APIError(400, f"{here}: unsupported content type {part.type!r} (text, image_url, "
                                    f"input_audio)", "messages")
        except ValueError as e:  # media that cannot be decoded
            raise APIError(400, f"{here}: {e}", "messages") from None
    return out

