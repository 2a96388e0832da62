"""InternLM2 (internlm2): llama's layer (q/k/v separate or fused, optional biases), normal rotary
embedding, output head required.
"""
from __future__ import annotations

from .dense import Dense


class InternLM2(Dense):
    names = ("internlm2",)
    output_head = "required"


ARCHS = [InternLM2()]
