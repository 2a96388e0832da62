"""Ling 2 / Ring 2 (bailingmoe2): a fused q/k/v projection with per-head q/k RMS norms before a
(partial) NeoX rotary embedding; after leading_dense_block_count dense SwiGLU layers, experts
routed by expert_gating_func (sigmoid in the released files) with the optional selection bias
exp_probs_b and grouped top-k (expert_group_count), renormalised when expert_weights_norm, times
expert_weights_scale, plus expert_shared_count shared experts of expert_shared_feed_forward_length
(else the experts' width) each. The multi-token-prediction blocks (nextn_predict_layers) are
skipped, as llama.cpp does; the output head is required."""
from __future__ import annotations

from ...enums import RopeType
from ..builder import load_attention
from .glm4moe import RoutedDense, load_routed_ffn, read_routing, skip_nextn_layers


class BailingMoe2(RoutedDense):
    names = ("bailingmoe2",)
    rope_type = RopeType.NEOX
    output_head = "required"
    biases = {}  # none read
    qk_norm = True

    def read_hparams(self, hp, keys):
        read_routing(hp, keys, default_gating=None)
        skip_nextn_layers(hp, keys)

    def load_layer(self, L, hp):
        load_attention(L, hp, qk_norm=True)
        load_routed_ffn(L, hp, probs_bias=False, n_ff_shexp=hp.n_ff_shexp)


ARCHS = [BailingMoe2()]
