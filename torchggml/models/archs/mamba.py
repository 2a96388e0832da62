"""mamba and mamba2: every layer a selective state-space mixer, no attention.

x = embed(tokens); per layer: x += mixer(rms_norm(x)); logits = output(rms_norm(x)). Mamba's
mixer: a causal convolution then the selective scan with a decay per state value; Mamba-2's: x,
B and C through one convolution, a scalar decay per head, B/C shared by groups of heads, and a
grouped RMS norm before the output projection (recurrent_layers.py).
"""
from __future__ import annotations

from ..recurrent_layers import RecurrentArch, load_mamba, load_mamba2, mamba_mixer, mamba2_mixer, read_ssm


class Mamba(RecurrentArch):
    names = ("mamba",)
    mamba2 = False

    def read_hparams(self, hp, keys):
        read_ssm(hp, keys, self.mamba2)

    def load_layer(self, L, hp):
        if self.mamba2:
            L.weight("attn_norm", [hp.n_embd])
            load_mamba2(L, hp)
        else:
            load_mamba(L, hp)

    def build(self, b, w):
        mixer = mamba2_mixer if self.mamba2 else mamba_mixer
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            x = b.add_attention(il, x, mixer(b, il, b.norm(x, layer.attn_norm), layer))
        return b.output(x, w)


class Mamba2(Mamba):
    names = ("mamba2",)
    mamba2 = True


ARCHS = [Mamba(), Mamba2()]
