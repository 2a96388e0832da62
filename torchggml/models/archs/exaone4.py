"""EXAONE 4 (exaone4): OLMo 2's layer (no pre-norms; RMS norms after attention and after the FFN)
with per-head q/k RMS norms, NeoX rotary embedding (with optional rope_freqs), and the 32B's
interleaved attention: when the file has 64 layers, three of every four slide within a 4096-token
(or attention.sliding_window) window and only those rotate; the dense layers use no positions.
"""
from __future__ import annotations

from ...enums import RopeType
from ..builder import Arch, load_attention, load_ffn
from ..hparams import read_swa_pattern


class Exaone4(Arch):
    names = ("exaone4",)
    rope_type = RopeType.NEOX
    rope_freqs = True
    biases = {"attn_q": False, "attn_k": False, "attn_v": False, "attn_qkv": False}
    fused_qkv = True

    def read_hparams(self, hp, keys):
        if hp.n_layer == 64:  # llama.cpp: only the 32B interleaves sliding-window layers
            hp.n_swa = int(keys.get("attention.sliding_window", 4096))
            read_swa_pattern(hp, keys, 4)
            hp.rope_freq_base_swa = float(keys.get("rope.freq_base_swa", hp.rope_freq_base))
            hp.rope_freq_scale_swa = hp.rope_freq_scale

    def load_layer(self, L, hp):
        load_attention(L, hp, qk_norm=True, norm=False)
        L.weight("post_attention_norm", [hp.n_embd])
        load_ffn(L, hp, norm=False)
        L.weight("post_ffw_norm", [hp.n_embd])

    def build(self, b, w):
        hp = b.hp
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            rope = hp.is_swa(il) or not hp.swa_layers
            h, x = b.output_rows(il, b.self_attention(il, x, layer, w.rope_freqs, rope=rope), x)
            x = b.add(x, b.norm(h, layer.post_attention_norm))
            x = b.add(x, b.norm(b.ffn(x, layer), layer.post_ffw_norm))
        return b.output(x, w)


ARCHS = [Exaone4()]
