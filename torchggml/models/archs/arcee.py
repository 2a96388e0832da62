"""Arcee AFM (arcee): llama's attention (optional rope_freqs) with an ungated
FFN activated by relu(x)^2."""
from __future__ import annotations

from .dense import Dense


class Arcee(Dense):
    names = ("arcee",)
    rope_freqs = True
    act, gated = "relu_sqr", False


ARCHS = [Arcee()]
