"""DeepSeek V1 / MoE 16B (deepseek): llama's attention (normal rotary embedding, optional
rope_freqs); after leading_dense_block_count dense SwiGLU layers, a mixture of experts whose
softmax router weights are not renormalised (times expert_weights_scale) plus
expert_shared_count always-on shared experts."""
from __future__ import annotations

from .dense import Dense
from .glm4moe import load_routed_ffn
from ..builder import load_attention


class DeepSeek(Dense):
    names = ("deepseek",)
    rope_freqs = True

    def read_hparams(self, hp, keys):
        hp.n_layer_dense_lead = int(keys.get("leading_dense_block_count", 0))
        hp.n_expert_shared = int(keys.get("expert_shared_count"))
        hp.expert_weights_scale = float(keys.get("expert_weights_scale", 0.0))

    def load_layer(self, L, hp):
        load_attention(L, hp)
        load_routed_ffn(L, hp)

    def build(self, b, w):
        hp = b.hp
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            x = b.add_attention(il, x, self.attention(b, il, b.norm(x, layer.attn_norm), layer, w))
            h = b.norm(x, layer.ffn_norm)
            if layer.ffn_gate_inp is None:
                h = b.ffn(h, layer)
            else:
                h = b.add(b.moe(h, layer, norm_weights=False, w_scale=hp.expert_weights_scale),
                          b.ffn(h, layer, suffix="_shexp"))
            x = b.add(x, h)
        return b.output(x, w)


ARCHS = [DeepSeek()]
