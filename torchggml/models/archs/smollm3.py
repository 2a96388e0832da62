"""SmolLM3 (smollm3): llama's layer where every fourth layer (3, 7, ...) attends without rotary
positions (NoPE).
"""
from __future__ import annotations

from ...enums import RopeType
from ..builder import Arch, load_attention, load_ffn

NO_ROPE_LAYER_STEP = 4  # llama.cpp's n_no_rope_layer_step for smollm3


class SmolLM3(Arch):
    names = ("smollm3",)
    rope_type = RopeType.NORMAL
    biases = {"attn_q": False, "attn_k": False, "attn_v": False, "attn_qkv": False}
    fused_qkv = True

    def load_layer(self, L, hp):
        load_attention(L, hp)
        load_ffn(L, hp)

    def build(self, b, w):
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            rope = (il + 1) % NO_ROPE_LAYER_STEP != 0
            x = b.add_attention(il, x, b.self_attention(il, b.norm(x, layer.attn_norm), layer, rope=rope))
            x = b.add(x, b.ffn(b.norm(x, layer.ffn_norm), layer))
        return b.output(x, w)


ARCHS = [SmolLM3()]
