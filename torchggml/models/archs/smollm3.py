"""SmolLM3 (smollm3): llama's layer where every fourth layer (3, 7, ...) attends without rotary
positions (NoPE).
"""
from __future__ import annotations

from .dense import Dense

NO_ROPE_LAYER_STEP = 4  # llama.cpp's n_no_rope_layer_step for smollm3


class SmolLM3(Dense):
    names = ("smollm3",)

    def attention(self, b, il, h, layer, w):
        return b.self_attention(il, h, layer, rope=(il + 1) % NO_ROPE_LAYER_STEP != 0)


ARCHS = [SmolLM3()]
