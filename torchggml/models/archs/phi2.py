"""Phi-2 (phi2): one LayerNorm (with bias) feeds attention and an ungated GELU FFN in parallel,
both added to the residual; q/k/v (fused or separate) and every projection with biases; partial
NeoX rotary embedding (rope.dimension_count of each head); Q scaled by 1/sqrt(head_dim) before
attention; the output head has a bias.
"""
from __future__ import annotations

from ...enums import RopeType
from ..builder import Arch, load_attention, load_ffn


class Phi2(Arch):
    names = ("phi2",)
    rope_type = RopeType.NEOX
    output_head = "required"
    biases = {"attn_norm": True, "attn_q": False, "attn_k": False, "attn_v": False, "attn_qkv": False,
              "attn_output": True, "ffn_up": True, "ffn_down": True, "output_norm": True, "output": True}
    fused_qkv = True

    def load_layer(self, L, hp):
        load_attention(L, hp)
        load_ffn(L, hp, gated=False, norm=False)  # the attention norm feeds the FFN too

    def build(self, b, w):
        hp = b.hp
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            h = b.norm(x, layer.attn_norm, layer.attn_norm_b, rms=False)
            attn = b.self_attention(il, h, layer, q_scale=hp.kq_scale, kq_scale=1.0)
            attn, x, h = b.output_rows(il, attn, x, h)
            x = b.add(b.add(attn, b.ffn(h, layer, act="gelu")), x)
        return b.output(x, w, rms=False)


ARCHS = [Phi2()]
