"""StableLM (stablelm): LayerNorms with biases, optional q/k/v biases, optional per-head q/k
LayerNorms ([head_dim, n_head]), partial NeoX rotary embedding, a SwiGLU FFN; a layer without
ffn_norm (StableLM 2 12B) is parallel: the FFN reads the attention's norm.
"""
from __future__ import annotations

from ...enums import RopeType
from ..builder import Arch, load_attention


class StableLM(Arch):
    names = ("stablelm",)
    rope_type = RopeType.NEOX
    output_head = "required"
    biases = {"attn_norm": True, "attn_q": False, "attn_k": False, "attn_v": False, "attn_qkv": False,
              "ffn_norm": False, "output_norm": True}
    fused_qkv = True

    def load_layer(self, L, hp):
        load_attention(L, hp, qk_norm_per_head=True)
        L.weight("ffn_norm", [hp.n_embd], required=False)
        L.bias("ffn_norm", [hp.n_embd])
        L.weight("ffn_gate", [hp.n_embd, hp.n_ff])
        L.weight("ffn_up", [hp.n_embd, hp.n_ff])
        L.weight("ffn_down", [hp.n_ff, hp.n_embd])

    def build(self, b, w):
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            h = b.norm(x, layer.attn_norm, layer.attn_norm_b, rms=False)
            q, k, v = b.qkv(h, layer, qk_rms=False)
            q, k = b.rope(q, il), b.rope(k, il)
            attn = b.attention(il, q, k, v, layer.attn_output)
            attn, x, h = b.output_rows(il, attn, x, h)
            x = b.add(x, attn)
            h = h if layer.ffn_norm is None else b.norm(x, layer.ffn_norm, layer.ffn_norm_b, rms=False)
            x = b.add(x, b.ffn(h, layer))
        return b.output(x, w, rms=False)


ARCHS = [StableLM()]
