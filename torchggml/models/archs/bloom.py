"""BLOOM and MPT (bloom, mpt): no rotary embedding but ALiBi (attention scores biased by
-slope_h * |p - p0|, the slopes from max_alibi_bias: 8 for bloom, attention.max_alibi_bias for
mpt), LayerNorms (with biases), one fused attn_qkv, an ungated GELU FFN.
- bloom: a LayerNorm on the token embeddings (token_embd_norm), every bias present.
- mpt: biases optional, q/k/v clamped to attention.clamp_kqv, optional learned position
  embeddings.
"""
from __future__ import annotations

from ..builder import Arch, load_attention, load_ffn

_ALL_BIASES = ("attn_norm", "attn_qkv", "attn_output", "ffn_norm", "ffn_up", "ffn_down", "output_norm")


class Bloom(Arch):
    names = ("bloom",)
    biases = dict.fromkeys(_ALL_BIASES, True)
    fused_qkv = True

    def read_hparams(self, hp, keys):
        hp.max_alibi_bias = 8.0

    def load_weights(self, w, hp):
        super().load_weights(w, hp)
        w.add("tok_norm", "token_embd_norm.weight", [hp.n_embd])
        w.add("tok_norm_b", "token_embd_norm.bias", [hp.n_embd])

    def load_layer(self, L, hp):
        load_attention(L, hp)
        load_ffn(L, hp, gated=False)

    def embed(self, b, w):
        return b.norm(b.embed(w.token_embd), w.tok_norm, w.tok_norm_b, rms=False)

    def build(self, b, w):
        x = self.embed(b, w)
        for il, layer in enumerate(w.layers):
            h = b.norm(x, layer.attn_norm, layer.attn_norm_b, rms=False)
            x = b.add_attention(il, x, b.self_attention(il, h, layer, rope=False))
            h = b.norm(x, layer.ffn_norm, layer.ffn_norm_b, rms=False)
            x = b.add(x, b.ffn(h, layer, act="gelu"))
        return b.output(x, w, rms=False)


class MPT(Bloom):
    names = ("mpt",)
    biases = dict.fromkeys(_ALL_BIASES, False)

    def read_hparams(self, hp, keys):
        hp.max_alibi_bias = float(keys.get("attention.max_alibi_bias", 0.0))
        hp.clamp_kqv = float(keys.get("attention.clamp_kqv", 0.0))

    def load_weights(self, w, hp):
        Arch.load_weights(self, w, hp)
        w.add("pos_embd", "position_embd.weight", [hp.n_embd, hp.n_ctx_train], required=False)

    def embed(self, b, w):
        return b.embed(w.token_embd, pos_embd=w.pos_embd)


ARCHS = [Bloom(), MPT()]
