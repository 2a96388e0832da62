"""Falcon (falcon): one fused attn_qkv (multi-query in 7B), NeoX rotary embedding, and the
parallel block: the attention norm (LayerNorm with bias) feeds an ungated GELU FFN, attention
reads it too or, in 40B/180B, its own attn_norm_2; both blocks add to the residual.
"""
from __future__ import annotations

from ...enums import RopeType
from ..builder import Arch, load_attention, load_ffn


class Falcon(Arch):
    names = ("falcon",)
    rope_type = RopeType.NEOX
    biases = {"attn_norm": True, "output_norm": True}
    fused_qkv = True

    def load_layer(self, L, hp):
        load_attention(L, hp)
        L.weight("attn_norm_2", [hp.n_embd], required=False)
        if L.layer.attn_norm_2 is not None:
            L.bias("attn_norm_2", [hp.n_embd], required=True)
        load_ffn(L, hp, gated=False, norm=False)

    def build(self, b, w):
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            h = b.norm(x, layer.attn_norm, layer.attn_norm_b, rms=False)
            h2 = h if layer.attn_norm_2 is None else b.norm(x, layer.attn_norm_2, layer.attn_norm_2_b, rms=False)
            attn, x, h = b.output_rows(il, b.self_attention(il, h2, layer), x, h)
            x = b.add(b.add(b.ffn(h, layer, act="gelu"), attn), x)
        return b.output(x, w, rms=False)


ARCHS = [Falcon()]
