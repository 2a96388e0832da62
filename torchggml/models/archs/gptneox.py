"""GPT-NeoX / Pythia (gptneox): starcoder2's LayerNorm layer (biases, an ungated GELU FFN, partial
NeoX rotary embedding) with one fused attn_qkv and its bias; with use_parallel_residual the FFN
reads the layer's input (through its own norm) and both blocks are added to the residual together.
"""
from __future__ import annotations

from .gpt2 import GPT2
from .parallel import Starcoder2


class GPTNeoX(Starcoder2):
    names = ("gptneox",)
    output_head = "required"
    biases = GPT2.biases  # every bias of the fused-qkv LayerNorm layer, required
    fused_qkv = True

    def read_hparams(self, hp, keys):
        hp.parallel_residual = bool(keys.get("use_parallel_residual"))

    def build(self, b, w):
        if not b.hp.parallel_residual:
            return super().build(b, w)
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            h = b.norm(x, layer.attn_norm, layer.attn_norm_b, rms=False)
            attn, x = b.output_rows(il, b.self_attention(il, h, layer), x)
            h = b.ffn(b.norm(x, layer.ffn_norm, layer.ffn_norm_b, rms=False), layer, act="gelu")
            x = b.add(b.add(h, x), attn)
        return b.output(x, w, rms=False)


ARCHS = [GPTNeoX()]
