"""GPT-NeoX / Pythia (gptneox): LayerNorms with biases, one fused attn_qkv with its bias, partial
NeoX rotary embedding, an ungated GELU FFN with biases; with use_parallel_residual the FFN reads
the layer's input (through its own norm) and both blocks are added to the residual together.
"""
from __future__ import annotations

from ...enums import RopeType
from ..builder import Arch, load_attention, load_ffn


class GPTNeoX(Arch):
    names = ("gptneox",)
    rope_type = RopeType.NEOX
    output_head = "required"
    biases = {"attn_norm": True, "attn_qkv": True, "attn_output": True, "ffn_norm": True, "ffn_up": True,
              "ffn_down": True, "output_norm": True}
    fused_qkv = True

    def read_hparams(self, hp, keys):
        hp.parallel_residual = bool(keys.get("use_parallel_residual"))

    def load_layer(self, L, hp):
        load_attention(L, hp)
        load_ffn(L, hp, gated=False)

    def build(self, b, w):
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            h = b.norm(x, layer.attn_norm, layer.attn_norm_b, rms=False)
            attn, x = b.output_rows(il, b.self_attention(il, h, layer), x)
            ffn_in = x if b.hp.parallel_residual else b.add(x, attn)
            h = b.ffn(b.norm(ffn_in, layer.ffn_norm, layer.ffn_norm_b, rms=False), layer, act="gelu")
            x = b.add(b.add(h, x), attn) if b.hp.parallel_residual else b.add(h, ffn_in)
        return b.output(x, w, rms=False)


ARCHS = [GPTNeoX()]
