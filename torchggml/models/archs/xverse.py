"""XVERSE (xverse): llama's layer, normal rotary embedding, output head required."""
from __future__ import annotations

from .dense import Dense


class Xverse(Dense):
    names = ("xverse",)
    output_head = "required"


ARCHS = [Xverse()]
