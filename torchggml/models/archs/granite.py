"""IBM Granite 3 (granite, granitemoe): llama's layer with four scales from the file: the token
embeddings times embedding_scale, attention scores by attention.scale (instead of
1/sqrt(head_dim)), each block's output times residual_scale before it joins the residual, and the
logits divided by logit_scale. granitemoe's FFN is a mixture of experts (softmax router,
renormalised over the chosen ones, experts as wide as feed_forward_length) plus, when
expert_shared_feed_forward_length is set, an ungated shared expert added to it.
"""
from __future__ import annotations

from ...enums import RopeType
from ..builder import Arch, load_attention, load_ffn, load_moe, load_shared_expert
from .dense import LLAMA_BIASES


class Granite(Arch):
    names = ("granite", "granitemoe")
    rope_type = RopeType.NORMAL
    rope_freqs = True
    biases = LLAMA_BIASES
    fused_qkv = True

    def read_hparams(self, hp, keys):
        hp.logit_scale = float(keys.get("logit_scale"))
        hp.residual_scale = float(keys.get("residual_scale", 0.0))
        hp.embedding_scale = float(keys.get("embedding_scale", 0.0))
        hp.attention_scale = float(keys.get("attention.scale", 0.0))

    def load_layer(self, L, hp):
        load_attention(L, hp)
        if hp.n_expert:
            load_moe(L, hp, hp.n_ff)
            if hp.n_ff_shexp:
                load_shared_expert(L, hp, hp.n_ff_shexp, gate_inp=False)
        else:
            load_ffn(L, hp)

    def build(self, b, w):
        hp = b.hp
        res = (lambda t: b.scale(t, hp.residual_scale)) if hp.residual_scale else (lambda t: t)
        x = b.embed(w.token_embd, hp.embedding_scale or 1.0)
        for il, layer in enumerate(w.layers):
            x = b.add_attention(il, x, res(b.self_attention(il, b.norm(x, layer.attn_norm), layer, w.rope_freqs)))
            h = b.norm(x, layer.ffn_norm)
            if layer.ffn_gate_inp is None:
                h = b.ffn(h, layer)
            else:
                h = b.moe(h, layer) if layer.ffn_up_shexp is None else b.add(b.moe(h, layer), b.ffn(h, layer, suffix="_shexp"))
            x = b.add(x, res(h))
        return b.output(x, w, scale=1.0 / hp.logit_scale)


ARCHS = [Granite()]
