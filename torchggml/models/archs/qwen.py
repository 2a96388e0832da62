"""The Qwen family: qwen2 (q/k/v biases), qwen3 (per-head q/k RMS norms, often a tied output),
qwen2moe (experts plus a shared expert behind a sigmoid gate) and qwen3moe (experts, q/k norms).
All are llama's layer with NeoX rotary embedding (the two halves of each head rotate together).
"""
from __future__ import annotations

from ...enums import RopeType
from ..builder import Arch, load_attention, load_ffn, load_moe, load_shared_expert


class Qwen2(Arch):
    names = ("qwen2",)
    rope_type = RopeType.NEOX
    biases = {"attn_q": True, "attn_k": True, "attn_v": True}
    qk_norm = False

    def load_layer(self, L, hp):
        load_attention(L, hp, qk_norm=self.qk_norm)
        self.load_ffn(L, hp)

    def load_ffn(self, L, hp):
        load_ffn(L, hp)

    def ffn(self, b, h, layer):
        return b.ffn(h, layer)

    def build(self, b, w):
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            x = b.add_attention(il, x, b.self_attention(il, b.norm(x, layer.attn_norm), layer))
            x = b.deepstack(il, b.add(x, self.ffn(b, b.norm(x, layer.ffn_norm), layer)))
        return b.output(x, w)


class Qwen3(Qwen2):
    names = ("qwen3",)
    biases = {}
    qk_norm = True


class Qwen2Moe(Qwen2):
    """Router weights are not renormalised over the chosen experts; the shared expert's width is
    expert_shared_feed_forward_length."""
    names = ("qwen2moe",)
    biases = {"attn_q": False, "attn_k": False, "attn_v": False}
    output_head = "required"

    def load_ffn(self, L, hp):
        load_moe(L, hp, hp.n_ff_exp or hp.n_ff // hp.n_expert_used)
        load_shared_expert(L, hp, hp.n_ff_shexp or hp.n_ff)

    def ffn(self, b, h, layer):
        return b.add(b.moe(h, layer, norm_weights=False), b.shared_expert(h, layer))


class Qwen3Moe(Qwen2):
    names = ("qwen3moe",)
    biases = {}
    qk_norm = True

    def load_ffn(self, L, hp):
        load_moe(L, hp, hp.n_ff_exp or hp.n_ff // hp.n_expert_used)

    def ffn(self, b, h, layer):
        return b.moe(h, layer)


ARCHS = [Qwen2(), Qwen3(), Qwen2Moe(), Qwen3Moe()]
