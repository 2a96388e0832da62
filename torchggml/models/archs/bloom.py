"""BLOOM and MPT (bloom, mpt): gpt2's layer (LayerNorms with biases, one fused attn_qkv, an
ungated GELU FFN) with ALiBi instead of positions: attention scores biased by -slope_h * |p - p0|,
the slopes from max_alibi_bias (8 for bloom, attention.max_alibi_bias for mpt).
- bloom: a LayerNorm on the token embeddings (token_embd_norm), every bias present.
- mpt: biases optional, q/k/v clamped to attention.clamp_kqv, optional learned position
  embeddings.
"""
from __future__ import annotations

from .gpt2 import GPT2


class Bloom(GPT2):
    names = ("bloom",)
    pos_embd = None

    def read_hparams(self, hp, keys):
        hp.max_alibi_bias = 8.0

    def load_weights(self, w, hp):
        super().load_weights(w, hp)
        w.add("tok_norm", "token_embd_norm.weight", [hp.n_embd])
        w.add("tok_norm_b", "token_embd_norm.bias", [hp.n_embd])

    def embed(self, b, w):
        return b.norm(b.embed(w.token_embd), w.tok_norm, w.tok_norm_b, rms=False)


class MPT(GPT2):
    names = ("mpt",)
    biases = dict.fromkeys(GPT2.biases, False)
    pos_embd = False

    def read_hparams(self, hp, keys):
        hp.max_alibi_bias = float(keys.get("attention.max_alibi_bias", 0.0))
        hp.clamp_kqv = float(keys.get("attention.clamp_kqv", 0.0))


ARCHS = [Bloom(), MPT()]
