"""Command R7B / Command A (cohere2): command-r's parallel block (one LayerNorm feeds attention and
FFN, both added to the residual; output tied to token_embd and scaled by logit_scale) with
interleaved attention: three of every four layers slide within attention.sliding_window and
rotate; the fourth attends over everything with no positions (NoPE).
"""
from __future__ import annotations

from ...enums import RopeType
from ..builder import Arch, load_attention, load_ffn
from ..hparams import read_swa_pattern


class Cohere2(Arch):
    names = ("cohere2",)
    rope_type = RopeType.NORMAL
    output_head = "tied"
    biases = {"attn_q": False, "attn_k": False, "attn_v": False, "attn_qkv": False}
    fused_qkv = True

    def read_hparams(self, hp, keys):
        hp.n_swa = int(keys.get("attention.sliding_window"))
        read_swa_pattern(hp, keys, 4)
        hp.rope_freq_base_swa = float(keys.get("rope.freq_base_swa", hp.rope_freq_base))
        hp.rope_freq_scale_swa = hp.rope_freq_scale
        hp.logit_scale = float(keys.get("logit_scale"))

    def load_layer(self, L, hp):
        load_attention(L, hp)
        load_ffn(L, hp, norm=False)  # the attention norm feeds the FFN too

    def build(self, b, w):
        hp = b.hp
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            h = b.norm(x, layer.attn_norm, rms=False)
            attn = b.self_attention(il, h, layer, rope=hp.is_swa(il))
            attn, x, h = b.output_rows(il, attn, x, h)
            x = b.add(b.add(b.ffn(h, layer), x), attn)
        return b.output(x, w, rms=False, scale=hp.logit_scale)


ARCHS = [Cohere2()]
