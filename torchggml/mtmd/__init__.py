"""Multimodal input (llama.cpp's libmtmd) on torch devices: mmproj files (loader.py), image
preprocessing (preprocess.py), the encoders (encoder.py over one graph module per projector
type: gemma3.py, idefics3.py, llava.py; shared ViT pieces in vit.py) and the API (api.py)."""
from .loader import (MMProj, SUPPORTED_PROJECTORS, UnsupportedProjectorError, VisionHParams, load_mmproj)
from .preprocess import PreprocessedImage, Tile, load_image, preprocess
from .encoder import ENCODERS, VisionEncoder
from .api import MEDIA_MARKER, Image, Multimodal, load_multimodal, media_prompt

__all__ = ["MMProj", "SUPPORTED_PROJECTORS", "UnsupportedProjectorError", "VisionHParams", "load_mmproj",
           "PreprocessedImage", "Tile", "load_image", "preprocess", "ENCODERS", "VisionEncoder",
           "MEDIA_MARKER", "Image", "Multimodal", "load_multimodal", "media_prompt"]
