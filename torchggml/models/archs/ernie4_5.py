"""Baidu ERNIE 4.5 (ernie4_5, ernie4_5-moe): llama's layer (normal rotary embedding, q/k/v
separate or fused with optional biases). ernie4_5-moe: after leading_dense_block_count dense
layers, every interleave_moe_layer_step-th layer is a mixture of experts (softmax router,
renormalised over the chosen ones, an optional selection bias exp_probs_b) plus, with
expert_shared_feed_forward_length, a SwiGLU shared expert.
"""
from __future__ import annotations

from ...enums import RopeType
from ...gguf.loader import GGUFError
from ..builder import Arch, load_attention, load_ffn, load_moe, load_shared_expert


class Ernie4_5(Arch):
    names = ("ernie4_5",)
    rope_type = RopeType.NORMAL
    biases = {"attn_q": False, "attn_k": False, "attn_v": False, "attn_qkv": False}
    fused_qkv = True

    def load_layer(self, L, hp):
        load_attention(L, hp)
        self.load_ffn(L, hp)

    def load_ffn(self, L, hp):
        load_ffn(L, hp)

    def ffn(self, b, il, h, layer):
        return b.ffn(h, layer)

    def build(self, b, w):
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            x = b.add_attention(il, x, b.self_attention(il, b.norm(x, layer.attn_norm), layer))
            x = b.add(x, self.ffn(b, il, b.norm(x, layer.ffn_norm), layer))
        return b.output(x, w)


class Ernie4_5Moe(Ernie4_5):
    names = ("ernie4_5-moe",)

    def read_hparams(self, hp, keys):
        hp.n_layer_dense_lead = int(keys.get("leading_dense_block_count", 0))
        hp.n_moe_layer_step = int(keys.get("interleave_moe_layer_step"))
        if hp.n_moe_layer_step != 1:  # llama.cpp loads experts for every layer after the dense ones
            raise GGUFError(f"{keys.f.path}: {keys.arch}.interleave_moe_layer_step {hp.n_moe_layer_step}: only 1 "
                            f"is supported")

    def is_moe(self, hp, il):
        return il >= hp.n_layer_dense_lead and (il + 1) % hp.n_moe_layer_step == 0

    def load_ffn(self, L, hp):
        if not self.is_moe(hp, L.il):
            return load_ffn(L, hp)
        load_moe(L, hp, probs_bias=False)
        if hp.n_ff_shexp:
            load_shared_expert(L, hp, hp.n_ff_shexp, gate_inp=False)

    def ffn(self, b, il, h, layer):
        if not self.is_moe(b.hp, il):
            return b.ffn(h, layer)
        out = b.moe(h, layer)
        return out if layer.ffn_up_shexp is None else b.add(out, b.ffn(h, layer, suffix="_shexp"))


ARCHS = [Ernie4_5(), Ernie4_5Moe()]
