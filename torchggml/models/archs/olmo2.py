"""OLMo 2 (olmo2): no norms before attention or FFN; RMS norms after each instead (on the block's
output, before the residual), q/k RMS norms over the whole projections (all heads together), NeoX
rotary embedding, output head required. With attention.sliding_window (OLMo 3), three of every
four layers slide and rotate without the file's scaling (the main base: llama.cpp's graph reads
no rope.freq_base_swa).
"""
from __future__ import annotations

from ...enums import RopeType
from ..builder import Arch, load_attention, load_ffn
from ..hparams import read_swa_pattern


class Olmo2(Arch):
    names = ("olmo2",)
    rope_type = RopeType.NEOX
    output_head = "required"
    biases = {"attn_q": False, "attn_k": False, "attn_v": False, "attn_qkv": False}
    fused_qkv = True

    def read_hparams(self, hp, keys):
        hp.n_swa = int(keys.get("attention.sliding_window", 0))
        if hp.n_swa > 0:
            read_swa_pattern(hp, keys, 4)
            hp.rope_freq_base_swa, hp.rope_freq_scale_swa = hp.rope_freq_base, 1.0

    def load_layer(self, L, hp):
        load_attention(L, hp, qk_norm_full=True, norm=False)
        L.weight("post_attention_norm", [hp.n_embd])
        load_ffn(L, hp, norm=False)
        L.weight("post_ffw_norm", [hp.n_embd])

    def build(self, b, w):
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            q, k, v = b.qkv(x, layer)
            yarn = not b.hp.is_swa(il)
            q, k = b.rope(q, il, yarn=yarn), b.rope(k, il, yarn=yarn)
            h, x = b.output_rows(il, b.attention(il, q, k, v, layer.attn_output), x)
            x = b.add(x, b.norm(h, layer.post_attention_norm))
            x = b.add(x, b.norm(b.ffn(x, layer), layer.post_ffw_norm))
        return b.output(x, w)


ARCHS = [Olmo2()]
