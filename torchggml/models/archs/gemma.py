"""Google's Gemma family: gemma, gemma2, gemma3.

All three scale the token embeddings by sqrt(n_embd), scale Q before attention (1/sqrt(head_dim),
so attention itself uses scale 1), use a GELU-gated FFN and NeoX rotary embedding.
- gemma: output tied to token_embd.
- gemma2: RMS norms after attention and after the FFN too; attention scores and logits soft-capped
  (tanh); every other layer (from layer 0) attends within a sliding window.
- gemma3: gemma2's post-norms plus per-head q/k RMS norms; five of every six layers slide and
  rotate with their own base (10000; the dense layers use rope.freq_base and the file's scaling);
  logits soft-capped only when the file says so.
"""
from __future__ import annotations

import math

from ...enums import RopeType
from ..builder import Arch, load_attention, load_ffn
from ..hparams import read_swa_pattern


class Gemma(Arch):
    names = ("gemma",)
    rope_type = RopeType.NEOX
    biases = {}
    post_norms = False
    qk_norm = False
    output_head = "tied"  # gemma and gemma2 always tie the output head

    def load_layer(self, L, hp):
        load_attention(L, hp, qk_norm=self.qk_norm)
        load_ffn(L, hp)
        if self.post_norms:
            L.weight("post_attention_norm", [hp.n_embd])
            L.weight("post_ffw_norm", [hp.n_embd])

    def build(self, b, w):
        hp = b.hp
        x = b.embed(w.token_embd, math.sqrt(hp.n_embd))
        for il, layer in enumerate(w.layers):
            h = b.self_attention(il, b.norm(x, layer.attn_norm), layer, q_scale=hp.kq_scale, kq_scale=1.0)
            h, x = b.output_rows(il, h, x)
            x = b.add(x, b.norm(h, layer.post_attention_norm) if self.post_norms else h)
            h = b.ffn(b.norm(x, layer.ffn_norm), layer, act="gelu")
            x = b.add(x, b.norm(h, layer.post_ffw_norm) if self.post_norms else h)
        return b.output(x, w, softcap=hp.final_softcap)


class Gemma2(Gemma):
    names = ("gemma2",)
    post_norms = True

    def read_hparams(self, hp, keys):
        hp.n_swa = int(keys.get("attention.sliding_window", 4096))
        read_swa_pattern(hp, keys, 2)
        hp.attn_softcap = float(keys.get("attn_logit_softcapping", 50.0))
        hp.final_softcap = float(keys.get("final_logit_softcapping", 30.0))
        hp.rope_freq_base_swa = float(keys.get("rope.freq_base_swa", hp.rope_freq_base))
        hp.rope_freq_scale_swa = hp.rope_freq_scale


class Gemma3(Gemma):
    names = ("gemma3",)
    post_norms = True
    qk_norm = True
    output_head = "optional"  # gemma3 may have its own output head

    def read_hparams(self, hp, keys):
        hp.n_swa = int(keys.get("attention.sliding_window", 0))
        hp.final_softcap = float(keys.get("final_logit_softcapping", 0.0))
        if hp.n_swa > 0:
            read_swa_pattern(hp, keys, 6)
            hp.rope_freq_base_swa = float(keys.get("rope.freq_base_swa", 10000.0))
            hp.rope_freq_scale_swa = 1.0



ARCHS = [Gemma(), Gemma2(), Gemma3()]
