"""gpt-oss (OpenAI's open-weight MoE): every layer is attention with biases and per-head sink
logits (every other layer, from layer 0, within a sliding window) and a mixture of experts with
biases, routed by a softmax over the chosen experts' logits and activated by the clamped
swiglu_oai. The experts are usually MXFP4. post_attention_norm is the FFN's input norm. NeoX
rotary embedding, usually with YaRN scaling.
"""
from __future__ import annotations

from ...enums import RopeType
from ..builder import Arch, load_attention, load_moe
from ..hparams import read_swa_pattern


class GptOss(Arch):
    names = ("gpt-oss",)
    rope_type = RopeType.NEOX
    output_head = "required"
    biases = {"attn_q": True, "attn_k": True, "attn_v": True, "attn_output": True}

    def read_hparams(self, hp, keys):
        hp.n_ff_exp = int(keys.get("expert_feed_forward_length"))
        hp.n_swa = int(keys.get("attention.sliding_window"))
        read_swa_pattern(hp, keys, 2)
        hp.rope_freq_base_swa = float(keys.get("rope.freq_base_swa", hp.rope_freq_base))
        hp.rope_freq_scale_swa = hp.rope_freq_scale

    def load_layer(self, L, hp):
        load_attention(L, hp)
        L.weight("attn_sinks", [hp.n_head])
        load_moe(L, hp, biases=True, norm="post_attention_norm")  # the FFN's input norm

    def build(self, b, w):
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            x = b.add_attention(il, x, b.self_attention(il, b.norm(x, layer.attn_norm), layer))
            h = b.norm(x, layer.post_attention_norm)
            x = b.add(x, b.moe(h, layer, act="swiglu_oai", norm_weights=False, gating="softmax_weight"))
        return b.output(x, w)


ARCHS = [GptOss()]
