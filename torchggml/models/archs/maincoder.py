"""Maincoder (maincoder): llama's layer with per-head q/k RMS norms applied after the (normal)
rotary embedding."""
from __future__ import annotations

from .dense import Dense


class Maincoder(Dense):
    names = ("maincoder",)
    qk_norm = True
    qk_norm_after_rope = True


ARCHS = [Maincoder()]
