"""falcon-h1: every layer runs attention and a Mamba-2 mixer side by side on the same normed
input and adds both (hybrid memory: each layer has a KV cache and recurrent states).

Per layer: h = rms_norm(x); x += attention(h) (NeoX rotary) + mamba2(h); x += ffn(rms_norm(x)).
The FFN norm is stored as blk.N.ffn_norm (no ".weight" suffix), as llama.cpp names it.
"""
from __future__ import annotations

from ...enums import RopeType
from ..builder import load_attention, load_ffn
from ..recurrent_layers import HybridArch, load_mamba2, mamba2_mixer


class FalconH1(HybridArch):
    names = ("falcon-h1",)
    rope_type = RopeType.NEOX

    def is_recurrent(self, hp, il):
        return True

    def has_attention(self, hp, il):
        return True

    def load_layer(self, L, hp):
        load_attention(L, hp)
        load_mamba2(L, hp, norm=False)
        L.w.add("ffn_norm", f"blk.{L.il}.ffn_norm", [hp.n_embd], True, L.layer)
        load_ffn(L, hp, norm=False)

    def build(self, b, w):
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            h = b.norm(x, layer.attn_norm)
            mixed = b.add(b.self_attention(il, h, layer), mamba2_mixer(b, il, h, layer))
            x = b.add_attention(il, x, mixed)
            x = b.add(x, b.ffn(b.norm(x, layer.ffn_norm), layer))
        return b.output(x, w)


ARCHS = [FalconH1()]
