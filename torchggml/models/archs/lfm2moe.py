"""lfm2moe (LiquidAI LFM2-MoE): LFM2's short-convolution and attention layers (no sliding window:
llama.cpp reads none here) whose FFNs, after leading_dense_block_count dense ones, are mixtures of
experts routed by expert_gating_func (sigmoid in the released files) with the selection bias
exp_probs_b, the chosen weights renormalised, no scale."""
from __future__ import annotations

from .glm4moe import load_routed_ffn, read_routing, routed_ffn
from .lfm2 import LFM2


class LFM2Moe(LFM2):
    names = ("lfm2moe",)

    def read_hparams(self, hp, keys):
        super().read_hparams(hp, keys)
        hp.n_swa, hp.swa_layers = 0, []
        read_routing(hp, keys, default_gating=None, shared=False)
        hp.expert_weights_norm, hp.expert_weights_scale = True, 0.0  # as llama.cpp, whatever the keys say

    def load_ffn(self, L, hp):
        load_routed_ffn(L, hp, probs_bias=True)

    def ffn(self, b, h, layer):
        return routed_ffn(b, h, layer)


ARCHS = [LFM2Moe()]
