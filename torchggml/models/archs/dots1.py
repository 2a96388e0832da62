"""rednote dots.llm1 (dots1): per-head q/k RMS norms, NeoX rotary embedding; after
leading_dense_block_count dense layers, experts routed as the file says (expert_gating_func,
optional selection bias exp_probs_b, expert_weights_norm / scale) plus expert_shared_count shared
experts; output head required."""
from __future__ import annotations

from ...enums import RopeType
from .dense import Dense
from .glm4moe import load_routed_ffn, read_routing, routed_ffn
from ..builder import load_attention


class Dots1(Dense):
    names = ("dots1",)
    rope_type = RopeType.NEOX
    output_head = "required"

    def read_hparams(self, hp, keys):
        read_routing(hp, keys, default_gating=None)

    def load_layer(self, L, hp):
        load_attention(L, hp, qk_norm=True)
        load_routed_ffn(L, hp)

    def build(self, b, w):
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            x = b.add_attention(il, x, b.self_attention(il, b.norm(x, layer.attn_norm), layer))
            x = b.add(x, routed_ffn(b, b.norm(x, layer.ffn_norm), layer))
        return b.output(x, w)


ARCHS = [Dots1()]
