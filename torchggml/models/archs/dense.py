"""`Dense`: the pre-norm decoder layer most architectures share, configured by class attributes:
x += attention(norm(x)); x += ffn(norm(x)); logits = output(norm(x)). Its attributes: RMS or
LayerNorm (with the file's biases), the FFN's activation and whether it is gated, q/k norms
before or after the rotation, optional rope_freqs factors.
"""
from __future__ import annotations

from ...enums import RopeType
from ..builder import Arch, load_attention, load_ffn

QKV_BIASES = {"attn_q": False, "attn_k": False, "attn_v": False, "attn_qkv": False}
# llama's optional biases (q/k/v, attention output, FFN)
LLAMA_BIASES = {**QKV_BIASES, "attn_output": False, "ffn_gate": False, "ffn_up": False, "ffn_down": False}


class Dense(Arch):
    rope_type = RopeType.NORMAL
    biases = QKV_BIASES
    fused_qkv = True
    rms = True                 # RMS norms (else LayerNorm)
    act, gated = "silu", True  # the FFN's activation, and whether it has ffn_gate
    qk_norm = False            # per-head q/k RMS norms (required)
    qk_norm_after_rope = False

    def load_layer(self, L, hp):
        load_attention(L, hp, qk_norm=self.qk_norm)
        load_ffn(L, hp, gated=self.gated)

    def attention(self, b, il, h, layer, w):
        if not self.qk_norm_after_rope:
            return b.self_attention(il, h, layer, w.rope_freqs)
        q, k, v = b.qkv(h, layer, qk_norms=False)
        q = b.qk_norm(b.rope(q, il, w.rope_freqs), layer.attn_q_norm)
        k = b.qk_norm(b.rope(k, il, w.rope_freqs), layer.attn_k_norm)
        return b.attention(il, q, k, v, layer.attn_output, layer.attn_output_b)

    def build(self, b, w):
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            h = b.norm(x, layer.attn_norm, layer.attn_norm_b, rms=self.rms)
            x = b.add_attention(il, x, self.attention(b, il, h, layer, w))
            h = b.norm(x, layer.ffn_norm, layer.ffn_norm_b, rms=self.rms)
            x = b.add(x, b.ffn(h, layer, act=self.act))
        return b.output(x, w, rms=self.rms)
