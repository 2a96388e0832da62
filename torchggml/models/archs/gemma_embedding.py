"""EmbeddingGemma (gemma-embedding): gemma3's layer as an encoder: attention over the whole
input (never causal), symmetric sliding windows (|p - p0| <= n_swa / 2) on five layers of six,
the final norm's states pooled by Model.embed, then the optional sentence-transformers
projections dense_2 and dense_3 (no biases: llama.cpp reads none for it) applied to the pooled vectors (to each
token's with pooling none), as llama.cpp's build_dense_out."""
from __future__ import annotations

import torch

from ...gguf.loader import GGUFError
from .bert import float_weight
from .gemma import Gemma3


class GemmaEmbedding(Gemma3):
    names = ("gemma-embedding",)
    encoder = True

    def read_hparams(self, hp, keys):
        if not keys.has("attention.sliding_window"):
            raise GGUFError(f"{keys.f.path}: gemma-embedding needs {keys.arch}.attention.sliding_window")
        super().read_hparams(hp, keys)
        hp.causal_attn = False  # as llama.cpp: whatever the file says
        hp.swa_symmetric = True
        hp.rope_freq_base_swa = float(keys.get("rope.freq_base_swa", hp.rope_freq_base))
        hp.dense_2_out = int(keys.get("dense_2_feat_out", 0))
        hp.dense_3_in = int(keys.get("dense_3_feat_in", 0))
        for key in ("dense_2_feat_in", "dense_3_feat_out"):
            if int(keys.get(key, 0)) not in (0, hp.n_embd):
                raise GGUFError(f"{keys.f.path}: {keys.arch}.{key} must equal n_embd {hp.n_embd}")

    def load_weights(self, w, hp):
        super().load_weights(w, hp)
        w.add("dense_2", "dense_2.weight", [hp.n_embd, hp.dense_2_out], required=False)
        w.add("dense_3", "dense_3.weight", [hp.dense_3_in, hp.n_embd], required=False)

    def build(self, b, w):
        if not b.embeddings:
            raise ValueError(f"{b.hp.arch} is an encoder: it has no logits; use Model.embed")
        return super().build(b, w)

    def project_pooled(self, w, x: torch.Tensor) -> torch.Tensor:
        for weight in (w.dense_2, w.dense_3):
            if weight is not None:
                x = x @ float_weight(weight).T
        return x


ARCHS = [GemmaEmbedding()]
