"""EXAONE 3 (exaone): llama's layer with NeoX rotary embedding (optional rope_freqs)."""
from __future__ import annotations

from ...enums import RopeType
from .dense import Dense


class Exaone(Dense):
    names = ("exaone",)
    rope_type = RopeType.NEOX
    rope_freqs = True


ARCHS = [Exaone()]
