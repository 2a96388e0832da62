"""A prompt's parts: text, token ids, and input embeddings (an image's rows from its projector,
torchggml.mtmd), in order, as llama.cpp's mtmd chunks a prompt into text and media chunks.

    model.generate(["<start_of_turn>user\\n", EmbeddingChunk(rows, causal=False), "Describe it."])
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch


@dataclass
class EmbeddingChunk:
    """Input embeddings taking one position each: float [n_tokens, n_embd]. causal=False: the
    rows attend to each other both ways (Gemma 3 reads an image so). grid=(width, height): an
    image's tokens in row order, which a multi-axis RoPE model places in 2-D (Model.eval_embeddings)."""
    values: torch.Tensor
    causal: bool = True
    grid: tuple[int, int] | None = None

    def __len__(self) -> int:
        return int(self.values.shape[0])


def is_parts(prompt) -> bool:
    """A list of parts rather than one text or one list of token ids."""
    return isinstance(prompt, (list, tuple)) and any(
        isinstance(p, (str, EmbeddingChunk, list, tuple, torch.Tensor, np.ndarray)) for p in prompt)


def prompt_parts(prompt, tokenize: Callable[[str, bool], list[int]], what: str) -> list:
    """The parts as int32 id arrays and EmbeddingChunks (empty parts dropped). Texts are tokenized
    with special tokens parsed (media markers), the first one with BOS (tokenize(text, first))."""
    parts, first = [], True
    for p in prompt:
        if isinstance(p, str):
            p = np.asarray(tokenize(p, first), dtype=np.int32)
        elif isinstance(p, EmbeddingChunk):
            pass
        elif isinstance(p, (list, tuple, np.ndarray)) or (isinstance(p, torch.Tensor) and p.dim() == 1):
            p = np.asarray(p, dtype=np.int64).astype(np.int32)
        else:
            raise TypeError(f"{what}: a prompt part must be text, token ids or an EmbeddingChunk, got {type(p).__name__}")
        first = False
        if len(p):
            parts.append(p)
    if not parts:
        raise ValueError(f"{what}: the prompt has no tokens")
    return parts
