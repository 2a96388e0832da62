"""GLM-4 (glm4): llama's layer with RMS norms after attention and after the FFN too, one fused
ffn_up holding [gate | up] (SwiGLU), usually a partial rotary embedding (normal pairs, or
multi-axis when the file has rope.dimension_sections).
"""
from __future__ import annotations

from ...enums import RopeType
from ..builder import Arch, load_attention, load_ffn


class Glm4(Arch):
    names = ("glm4",)
    rope_type = RopeType.NORMAL
    biases = {"attn_q": False, "attn_k": False, "attn_v": False, "attn_qkv": False}
    fused_qkv = True

    def read_hparams(self, hp, keys):
        sections = keys.get_list("rope.dimension_sections")
        if sections and sections[0] > 0 and sections[1] > 0:  # llama.cpp's use_mrope
            hp.rope_sections, hp.rope_type = tuple(int(s) for s in sections[:4]), int(RopeType.MROPE)

    def load_layer(self, L, hp):
        load_attention(L, hp)
        L.weight("post_attention_norm", [hp.n_embd])
        load_ffn(L, hp, gated=False, n_ff_up=2 * hp.n_ff)
        L.weight("post_ffw_norm", [hp.n_embd])

    def build(self, b, w):
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            h, x = b.output_rows(il, b.self_attention(il, b.norm(x, layer.attn_norm), layer), x)
            x = b.add(x, b.norm(h, layer.post_attention_norm))
            x = b.add(x, b.norm(b.ffn(b.norm(x, layer.ffn_norm), layer), layer.post_ffw_norm))
        return b.output(x, w)


ARCHS = [Glm4()]
