"""Two LayerNorm architectures that fall out of the same pieces.

- starcoder2: LayerNorms with biases, biased projections, a plain (ungated) GELU FFN with
  biases, NeoX rotary embedding.
- command-r (Cohere): one LayerNorm feeds attention and FFN in parallel, both added to the
  residual; output tied to token_embd and scaled by logit_scale; per-head q/k LayerNorms in the
  large models.
"""
from __future__ import annotations

from ...enums import RopeType
from ..builder import Arch, load_attention, load_ffn


class Starcoder2(Arch):
    names = ("starcoder2",)
    rope_type = RopeType.NEOX
    biases = {"attn_norm": True, "attn_q": True, "attn_k": True, "attn_v": True, "attn_output": True, "ffn_norm": True, "ffn_up": True, "ffn_down": True, "output_norm": True}

    def load_layer(self, L, hp):
        load_attention(L, hp)
        load_ffn(L, hp, gated=False)

    rotary = True  # gpt2, bloom, mpt (built on this class): positions by other means

    def embed(self, b, w):
        return b.embed(w.token_embd)

    def build(self, b, w):
        x = self.embed(b, w)
        for il, layer in enumerate(w.layers):
            h = b.norm(x, layer.attn_norm, layer.attn_norm_b, rms=False)
            x = b.add_attention(il, x, b.self_attention(il, h, layer, rope=self.rotary))
            h = b.norm(x, layer.ffn_norm, layer.ffn_norm_b, rms=False)
            x = b.add(x, b.ffn(h, layer, act="gelu"))
        return b.output(x, w, rms=False)


class CommandR(Arch):
    names = ("command-r",)
    rope_type = RopeType.NORMAL
    output_head = "tied"
    biases = {}

    def read_hparams(self, hp, keys):
        hp.logit_scale = float(keys.get("logit_scale", 1.0))


    def load_layer(self, L, hp):
        load_attention(L, hp, qk_norm_per_head=True)
        load_ffn(L, hp, norm=False)  # the attention norm feeds the FFN too

    def build(self, b, w):
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            h = b.norm(x, layer.attn_norm, rms=False)
            q, k, v = b.qkv(h, layer, qk_rms=False)
            q, k = b.rope(q, il), b.rope(k, il)
            attn = b.attention(il, q, k, v, layer.attn_output, layer.attn_output_b)
            attn, x, h = b.output_rows(il, attn, x, h)  # h (the norm) feeds the parallel FFN
            x = b.add(b.add(b.ffn(h, layer), x), attn)
        return b.output(x, w, rms=False, scale=b.hp.logit_scale)


ARCHS = [Starcoder2(), CommandR()]
