"""Multimodal input (llama.cpp's libmtmd) on torch devices: mmproj files (loader.py), image
preprocessing (preprocess.py), audio's log-mel (audio.py), the encoders (encoder.py over one graph
module per projector type: gemma3.py, idefics3.py, llava.py, qwen2vl.py, pixtral.py, whisper.py;
shared ViT pieces in vit.py) and the API (api.py)."""
from .loader import (MMProj, SUPPORTED_PROJECTORS, UnsupportedProjectorError, VisionHParams, load_mmproj)
from .preprocess import PreprocessedImage, Tile, load_image, preprocess
from .encoder import ENCODERS, Encoder
from .api import MEDIA_MARKER, Audio, Image, Multimodal, load_multimodal, media_prompt, split_media
from .audio import load_audio, log_mel

__all__ = ["MMProj", "SUPPORTED_PROJECTORS", "UnsupportedProjectorError", "VisionHParams", "load_mmproj",
           "PreprocessedImage", "Tile", "load_image", "preprocess", "ENCODERS", "Encoder",
           "MEDIA_MARKER", "Audio", "Image", "Multimodal", "load_multimodal", "media_prompt", "split_media", "load_audio", "log_mel"]
