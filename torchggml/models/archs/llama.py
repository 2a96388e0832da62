"""llama (and mistral-style llama, with mixtral's mixture of experts when the file has experts).

x = embed(tokens); per layer: x += attention(rms_norm(x)); x += ffn(rms_norm(x)), the FFN a
SwiGLU or, when the layer has ffn_gate_inp, the top-k experts weighted by the router's softmax
renormalised over the chosen ones; logits = output(rms_norm(x)). Rotary embedding on adjacent
pairs, with Llama 3.1's per-pair frequency factors (rope_freqs) when the file has them; the
query temperature when an architecture built on this one sets hp.attn_temp_scale (mistral3).
"""
from __future__ import annotations

from ...enums import RopeType
from ...gguf.loader import GGUFError
from ..builder import Arch, load_attention, load_ffn, load_moe


class Llama(Arch):
    names = ("llama", "mistral")
    rope_type = RopeType.NORMAL
    biases = {"attn_q": False, "attn_k": False, "attn_v": False, "attn_output": False, "ffn_gate": False, "ffn_up": False, "ffn_down": False}
    rope_freqs = True

    def read_hparams(self, hp, keys):
        if hp.n_rot != hp.head_dim_k:  # llama.cpp: "invalid n_rot" (llama rotates whole heads)
            raise GGUFError(f"{keys.f.path}: metadata key '{keys.arch}.rope.dimension_count' = {hp.n_rot}, "
                            f"expected the head size {hp.head_dim_k}")

    def load_layer(self, L, hp):
        load_attention(L, hp)
        if hp.n_expert:
            load_moe(L, hp)
        else:
            load_ffn(L, hp)

    def build(self, b, w):
        hp = b.hp
        q_temp = b.attn_temperature(hp.attn_temp_scale, hp.n_ctx_orig) if hp.attn_temp_scale else None
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            x = b.add_attention(il, x, b.self_attention(il, b.norm(x, layer.attn_norm), layer, w.rope_freqs,
                                                        q_scale=q_temp))
            h = b.norm(x, layer.ffn_norm)
            x = b.add(x, b.moe(h, layer) if layer.ffn_gate_inp is not None else b.ffn(h, layer))
        return b.output(x, w)


ARCHS = [Llama()]
