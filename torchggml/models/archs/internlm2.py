"""InternLM2 (internlm2): llama's layer (q/k/v separate or fused, optional biases), normal rotary
embedding, output head required.
"""
from __future__ import annotations

from ...enums import RopeType
from ..builder import Arch, load_attention, load_ffn


class InternLM2(Arch):
    names = ("internlm2",)
    rope_type = RopeType.NORMAL
    output_head = "required"
    biases = {"attn_q": False, "attn_k": False, "attn_v": False, "attn_qkv": False}
    fused_qkv = True

    def load_layer(self, L, hp):
        load_attention(L, hp)
        load_ffn(L, hp)

    def build(self, b, w):
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            x = b.add_attention(il, x, b.self_attention(il, b.norm(x, layer.attn_norm), layer))
            x = b.add(x, b.ffn(b.norm(x, layer.ffn_norm), layer))
        return b.output(x, w)


ARCHS = [InternLM2()]
