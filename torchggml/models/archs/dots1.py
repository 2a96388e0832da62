"""rednote dots.llm1 (dots1): per-head q/k RMS norms, NeoX rotary embedding; after
leading_dense_block_count dense layers, experts routed as the file says (expert_gating_func,
optional selection bias exp_probs_b, expert_weights_norm / scale) plus expert_shared_count shared
experts; output head required."""
from __future__ import annotations

from ...enums import RopeType
from .glm4moe import RoutedDense, read_routing


class Dots1(RoutedDense):
    names = ("dots1",)
    rope_type = RopeType.NEOX
    output_head = "required"
    qk_norm = True

    def read_hparams(self, hp, keys):
        read_routing(hp, keys, default_gating=None)


ARCHS = [Dots1()]
