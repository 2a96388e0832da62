"""OLMoE (olmoe): OLMo's attention with q/k RMS norms over the whole projections (all heads
together) and NeoX rotary embedding, then a mixture of experts whose softmax router weights are
not renormalised over the chosen experts.
"""
from __future__ import annotations

from ...enums import RopeType
from ..builder import Arch, load_attention, load_moe


class OLMoE(Arch):
    names = ("olmoe",)
    rope_type = RopeType.NEOX
    output_head = "required"
    biases = {"attn_q": False, "attn_k": False, "attn_v": False, "attn_qkv": False}
    fused_qkv = True

    def load_layer(self, L, hp):
        load_attention(L, hp, qk_norm_full=True)
        load_moe(L, hp, hp.n_ff)

    def build(self, b, w):
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            x = b.add_attention(il, x, b.self_attention(il, b.norm(x, layer.attn_norm), layer))
            x = b.add(x, b.moe(b.norm(x, layer.ffn_norm), layer, norm_weights=False))
        return b.output(x, w)


ARCHS = [OLMoE()]
