"""Orion (orion): llama's layer with LayerNorms (with biases) and NeoX rotary embedding, output
head required."""
from __future__ import annotations

from ...enums import RopeType
from .dense import QKV_BIASES, Dense


class Orion(Dense):
    names = ("orion",)
    rope_type = RopeType.NEOX
    output_head = "required"
    biases = {**QKV_BIASES, "attn_norm": True, "ffn_norm": True, "output_norm": True}
    rms = False


ARCHS = [Orion()]
