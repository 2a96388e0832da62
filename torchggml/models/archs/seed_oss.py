"""ByteDance Seed-OSS (seed_oss): llama's layer with NeoX rotary embedding; the FFN's input norm
is stored as post_attention_norm.
"""
from __future__ import annotations

from ...enums import RopeType
from ..builder import Arch, load_attention, load_ffn


class SeedOss(Arch):
    names = ("seed_oss",)
    rope_type = RopeType.NEOX
    biases = {"attn_q": False, "attn_k": False, "attn_v": False, "attn_qkv": False}
    fused_qkv = True

    def load_layer(self, L, hp):
        load_attention(L, hp)
        L.weight("post_attention_norm", [hp.n_embd])  # the FFN's input norm
        load_ffn(L, hp, norm=False)

    def build(self, b, w):
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            x = b.add_attention(il, x, b.self_attention(il, b.norm(x, layer.attn_norm), layer))
            x = b.add(x, b.ffn(b.norm(x, layer.post_attention_norm), layer))
        return b.output(x, w)


ARCHS = [SeedOss()]
