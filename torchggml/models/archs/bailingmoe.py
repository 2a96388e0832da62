"""Ling / Bailing MoE (bailingmoe): llama's attention with heads of rope.dimension_count values
(scores scaled by 1/sqrt of it), normal rotary embedding; every layer a mixture of experts
(softmax router, renormalised when expert_weights_norm, times expert_weights_scale) plus
expert_shared_count shared experts; output head required."""
from __future__ import annotations

from .glm4moe import RoutedDense, read_routing


class BailingMoe(RoutedDense):
    names = ("bailingmoe",)
    output_head = "required"

    def read_hparams(self, hp, keys):
        read_routing(hp, keys, default_gating=1)
        hp.expert_gating, hp.n_layer_dense_lead = "softmax", 0  # llama.cpp reads neither here
        hp.head_dim_k = hp.head_dim_v = hp.n_rot  # the heads are rope.dimension_count wide


ARCHS = [BailingMoe()]
