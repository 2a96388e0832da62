"""Nemotron (nemotron): LayerNorms with biases, partial NeoX rotary embedding, an ungated FFN
activated by relu(x)^2 (optional biases), optional attention output bias, output head required."""
from __future__ import annotations

from ...enums import RopeType
from .dense import QKV_BIASES, Dense


class Nemotron(Dense):
    names = ("nemotron",)
    rope_type = RopeType.NEOX
    output_head = "required"
    biases = {**QKV_BIASES, "attn_norm": True, "ffn_norm": True, "output_norm": True, "attn_output": False,
              "ffn_up": False, "ffn_down": False}
    rms = False
    act, gated = "relu_sqr", False


ARCHS = [Nemotron()]
