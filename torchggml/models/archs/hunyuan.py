"""Tencent Hunyuan (hunyuan-dense, hunyuan-moe): llama's layer with NeoX rotary embedding and
per-head q/k RMS norms applied after the rotation; rope.scaling.alpha (NTK-aware scaling) raises
the rotary base to base * alpha^(d / (d - 2)) (d the head size). hunyuan-moe's FFN is a mixture
of experts (softmax router, renormalised over the chosen ones; experts as wide as
feed_forward_length) plus an always-on SwiGLU shared expert.
"""
from __future__ import annotations

from ...enums import RopeType
from ..builder import Arch, load_attention, load_ffn, load_moe, load_shared_expert


class Hunyuan(Arch):
    names = ("hunyuan-dense", "hunyuan-moe")
    rope_type = RopeType.NEOX
    biases = {"attn_q": False, "attn_k": False, "attn_v": False, "attn_qkv": False}
    fused_qkv = True

    def read_hparams(self, hp, keys):
        if hp.arch == "hunyuan-moe":
            keys.get("expert_feed_forward_length")  # required by llama.cpp (the experts are feed_forward_length wide)
        alpha = float(keys.get("rope.scaling.alpha", 0.0))
        if alpha > 0.0 and hp.arch == "hunyuan-dense":  # llama.cpp applies it to the dense model only
            d = hp.head_dim_k
            hp.rope_freq_base *= alpha ** (d / (d - 2))

    def load_layer(self, L, hp):
        load_attention(L, hp, qk_norm=True)
        if hp.arch == "hunyuan-moe":
            load_moe(L, hp, hp.n_ff)
            load_shared_expert(L, hp, hp.n_ff_shexp or hp.n_ff, gate_inp=False)
        else:
            load_ffn(L, hp)

    def build(self, b, w):
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            q, k, v = b.qkv(b.norm(x, layer.attn_norm), layer, qk_norms=False)  # normed after the rotation
            q = b.norm(b.rope(q, il), layer.attn_q_norm)
            k = b.norm(b.rope(k, il), layer.attn_k_norm)
            x = b.add_attention(il, x, b.attention(il, q, k, v, layer.attn_output))
            h = b.norm(x, layer.ffn_norm)
            h = b.ffn(h, layer) if layer.ffn_gate_inp is None else b.add(b.moe(h, layer), b.ffn(h, layer, suffix="_shexp"))
            x = b.add(x, h)
        return b.output(x, w)


ARCHS = [Hunyuan()]
