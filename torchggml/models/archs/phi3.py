"""phi3: llama's layer with one fused attn_qkv projection and one fused ffn_up holding
[gate | up] (both split by views), Q scaled by 1/sqrt(head_dim) before attention, NeoX rotary
embedding and LongRoPE: per-pair frequency factors, rope_factors_long when the context exceeds
the original training context (rope.scaling.original_context_length), else rope_factors_short,
with the file's rope.scaling.attn_factor.
"""
from __future__ import annotations

from ...enums import RopeType
from ..builder import Arch, load_attention, load_ffn


def load_rope_factors(w, hp) -> None:
    """LongRoPE's optional per-pair factors, shared by the layers."""
    for name in ("rope_factors_long", "rope_factors_short"):
        w.add(name, f"{name}.weight", [hp.n_rot // 2], required=False)


def rope_factors(b, w):
    """rope_freqs, else LongRoPE's long factors when the context exceeds the original one, else
    the short ones (llama.cpp's get_rope_factors)."""
    hp = b.hp
    if w.rope_freqs is not None:
        return w.rope_freqs
    return w.rope_factors_long if b.memory.n_ctx > (hp.n_ctx_orig or hp.n_ctx_train) else w.rope_factors_short


class Phi3(Arch):
    names = ("phi3",)
    rope_type = RopeType.NEOX
    biases = {}
    fused_qkv = True

    def load_weights(self, w, hp):
        super().load_weights(w, hp)
        load_rope_factors(w, hp)

    def load_layer(self, L, hp):
        load_attention(L, hp)
        load_ffn(L, hp, gated=False, n_ff_up=2 * hp.n_ff)

    def build(self, b, w):
        hp, factors = b.hp, rope_factors(b, w)
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            x = b.add_attention(il, x, b.self_attention(il, b.norm(x, layer.attn_norm, layer.attn_norm_b), layer,
                                                        factors, q_scale=hp.kq_scale, kq_scale=1.0))
            x = b.add(x, self.ffn(b, b.norm(x, layer.ffn_norm, layer.ffn_norm_b), layer))
        return b.output(x, w)

    def ffn(self, b, h, layer):
        return b.ffn(h, layer)


ARCHS = [Phi3()]
