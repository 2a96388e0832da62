"""GPT-2 and StarCoder (gpt2, starcoder): learned position embeddings added to the token
embeddings (no rotary embedding), LayerNorms with biases, one fused attn_qkv with its bias
(starcoder: multi-query, one K/V head), an ungated GELU FFN with biases.
"""
from __future__ import annotations

from ..builder import Arch, load_attention, load_ffn


class GPT2(Arch):
    names = ("gpt2", "starcoder")
    biases = {"attn_norm": True, "attn_qkv": True, "attn_output": True, "ffn_norm": True, "ffn_up": True,
              "ffn_down": True, "output_norm": True}
    fused_qkv = True

    def load_weights(self, w, hp):
        super().load_weights(w, hp)
        w.add("pos_embd", "position_embd.weight", [hp.n_embd, hp.n_ctx_train])

    def load_layer(self, L, hp):
        load_attention(L, hp)
        load_ffn(L, hp, gated=False)

    def build(self, b, w):
        x = b.embed(w.token_embd, pos_embd=w.pos_embd)
        for il, layer in enumerate(w.layers):
            h = b.norm(x, layer.attn_norm, layer.attn_norm_b, rms=False)
            x = b.add_attention(il, x, b.self_attention(il, h, layer, rope=False))
            h = b.norm(x, layer.ffn_norm, layer.ffn_norm_b, rms=False)
            x = b.add(x, b.ffn(h, layer, act="gelu"))
        return b.output(x, w, rms=False)


ARCHS = [GPT2()]
