"""Phi-3.5-MoE (phimoe): phi3's attention (Q scaled by 1/sqrt(head_dim) before attention, NeoX
rotary embedding with LongRoPE factors) with biases on every norm and projection, RMS norms with
biases (as llama.cpp runs it), and a mixture of experts (softmax router, renormalised over the
chosen ones); the output head has a bias.
"""
from __future__ import annotations

from .phi3 import Phi3
from ..builder import load_attention, load_moe


class PhiMoE(Phi3):
    names = ("phimoe",)
    output_head = "required"
    biases = {"attn_norm": True, "attn_q": False, "attn_k": False, "attn_v": False, "attn_qkv": False,
              "attn_output": True, "ffn_norm": True, "output_norm": True, "output": True}
    rope_freqs = False

    def load_layer(self, L, hp):
        load_attention(L, hp)
        load_moe(L, hp, hp.n_ff)
        L.bias("ffn_norm", [hp.n_embd])

    def ffn(self, b, h, layer):
        return b.moe(h, layer)


ARCHS = [PhiMoE()]
