"""MiniMax-M2 (minimax-m2): q/k RMS norms over the whole projections (all heads together),
partial NeoX rotary embedding; every layer a mixture of experts routed as the file says
(expert_gating_func, usually sigmoid) with the selection bias exp_probs_b, renormalised over the
chosen experts; output head required."""
from __future__ import annotations

from ...enums import RopeType
from .dense import QKV_BIASES, Dense
from .glm4moe import read_routing
from ..builder import load_attention, load_moe


class MiniMaxM2(Dense):
    names = ("minimax-m2",)
    rope_type = RopeType.NEOX
    output_head = "required"
    biases = QKV_BIASES

    def read_hparams(self, hp, keys):
        read_routing(hp, keys, default_gating=None, shared=False)
        keys.get("expert_feed_forward_length")  # required by llama.cpp (the experts are feed_forward_length wide)
        hp.n_layer_dense_lead, hp.expert_weights_norm = 0, True  # llama.cpp: every layer, renormalised

    def load_layer(self, L, hp):
        load_attention(L, hp, qk_norm_full=True)
        load_moe(L, hp, hp.n_ff, probs_bias=True)

    def build(self, b, w):
        hp = b.hp
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            x = b.add_attention(il, x, b.self_attention(il, b.norm(x, layer.attn_norm), layer))
            h = b.norm(x, layer.ffn_norm)
            x = b.add(x, b.moe(h, layer, gating=hp.expert_gating, w_scale=hp.expert_weights_scale))
        return b.output(x, w)


ARCHS = [MiniMaxM2()]
