"""Ling / Bailing MoE (bailingmoe): llama's attention with heads of rope.dimension_count values
(scores scaled by 1/sqrt of it), normal rotary embedding; every layer a mixture of experts
(softmax router, renormalised when expert_weights_norm, times expert_weights_scale) plus
expert_shared_count shared experts; output head required."""
from __future__ import annotations

from .dense import QKV_BIASES, Dense
from .glm4moe import load_routed_ffn, read_routing, routed_ffn
from ..builder import load_attention


class BailingMoe(Dense):
    names = ("bailingmoe",)
    output_head = "required"
    biases = {**QKV_BIASES, "attn_output": False}

    def read_hparams(self, hp, keys):
        read_routing(hp, keys, default_gating=1)
        hp.expert_gating, hp.n_layer_dense_lead = "softmax", 0  # llama.cpp reads neither here
        hp.head_dim_k = hp.head_dim_v = hp.n_rot  # the heads are rope.dimension_count wide

    def load_layer(self, L, hp):
        load_attention(L, hp)
        load_routed_ffn(L, hp)

    def build(self, b, w):
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            x = b.add_attention(il, x, b.self_attention(il, b.norm(x, layer.attn_norm), layer))
            x = b.add(x, routed_ffn(b, b.norm(x, layer.ffn_norm), layer))
        return b.output(x, w)


ARCHS = [BailingMoe()]
