"""OLMo (olmo): llama's layer with non-parametric LayerNorms (no weights, no biases), q/k/v
clamped to attention.clamp_kqv when the file sets it, normal rotary embedding, output head
optional (tied to token_embd)."""
from __future__ import annotations

from .dense import Dense
from ..builder import LayerLoader, load_attention, load_ffn


class Olmo(Dense):
    names = ("olmo",)
    rms = False

    def read_hparams(self, hp, keys):
        hp.clamp_kqv = float(keys.get("attention.clamp_kqv", 0.0))

    def load_weights(self, w, hp):
        w.add("token_embd", "token_embd.weight", [hp.n_embd, hp.n_vocab])
        if w.add("output", "output.weight", [hp.n_embd, hp.n_vocab], required=False) is None:
            w.globals["output"] = w.token_embd
        for il in range(hp.n_layer):
            L = LayerLoader(w, il)
            load_attention(L, hp, norm=False)
            load_ffn(L, hp, norm=False)
            w.layers.append(L.layer)

ARCHS = [Olmo()]
