"""Swiss AI Apertus (apertus): llama's attention with per-head q/k RMS norms and NeoX rotary
embedding (with optional rope_freqs), and an ungated FFN activated by xIELU, whose four
parameters (xielu.alpha_n, alpha_p, beta, eps: one value or one per layer) come from the file.
"""
from __future__ import annotations

from ...enums import RopeType
from ...gguf.loader import GGUFError
from ... import ops
from ..builder import Arch, load_attention, load_ffn

XIELU_KEYS = ("alpha_n", "alpha_p", "beta", "eps")


class Apertus(Arch):
    names = ("apertus",)
    rope_type = RopeType.NEOX
    output_head = "required"
    rope_freqs = True
    biases = {"attn_q": False, "attn_k": False, "attn_v": False, "attn_qkv": False, "attn_output": False}
    fused_qkv = True

    def read_hparams(self, hp, keys):
        hp.xielu = []  # per layer: (alpha_n, alpha_p, beta, eps)
        per_key = []
        for name in XIELU_KEYS:
            value = keys.f.get(f"xielu.{name}", None)
            if value is None:
                raise GGUFError(f"{keys.f.path}: metadata key 'xielu.{name}' is missing")
            value = list(value) if isinstance(value, list) else [value] * hp.n_layer
            if len(value) != hp.n_layer:
                raise GGUFError(f"{keys.f.path}: xielu.{name} has {len(value)} entries for {hp.n_layer} layers")
            per_key.append([float(v) for v in value])
        hp.xielu = list(zip(*per_key))

    def load_layer(self, L, hp):
        load_attention(L, hp, qk_norm=True)
        load_ffn(L, hp, gated=False)

    def build(self, b, w):
        hp = b.hp
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            x = b.add_attention(il, x, b.self_attention(il, b.norm(x, layer.attn_norm), layer, w.rope_freqs))
            up = b.linear(b.norm(x, layer.ffn_norm), layer.ffn_up)
            x = b.add(x, b.linear(ops.xielu(b.ctx, up, *hp.xielu[il]), layer.ffn_down))
        return b.output(x, w)


ARCHS = [Apertus()]
