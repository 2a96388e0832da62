"""nemotron_h (NVIDIA Nemotron-H): each layer is one block, a Mamba-2 mixer, attention (no
rotary positions) or a squared-ReLU FFN, chosen per layer by the per-layer keys
(attention.head_count_kv 0 and feed_forward_length 0: Mamba-2; feed_forward_length 0: attention;
otherwise the FFN). Per layer: x += block(rms_norm(x)).
"""
from __future__ import annotations

from ... import ops
from ..builder import load_attention
from ..recurrent_layers import HybridArch, attention_no_rope, load_mamba2, mamba2_mixer


class NemotronH(HybridArch):
    names = ("nemotron_h",)

    def is_recurrent(self, hp, il):
        return hp.layer_n_head_kv[il] == 0 and hp.layer_n_ff[il] == 0

    def has_attention(self, hp, il):
        return not self.is_recurrent(hp, il) and hp.layer_n_ff[il] == 0

    def load_layer(self, L, hp):
        if self.is_recurrent(hp, L.il):
            L.weight("attn_norm", [hp.n_embd])
            load_mamba2(L, hp)
        elif self.has_attention(hp, L.il):
            load_attention(L, hp)
        else:
            n_ff = hp.layer_n_ff[L.il]
            L.weight("attn_norm", [hp.n_embd])
            L.weight("ffn_up", [hp.n_embd, n_ff])
            L.weight("ffn_down", [n_ff, hp.n_embd])
            L.bias("ffn_up", [n_ff])
            L.bias("ffn_down", [hp.n_embd])

    def block(self, b, il, h, layer):
        if self.is_recurrent(b.hp, il):
            return mamba2_mixer(b, il, h, layer)
        if self.has_attention(b.hp, il):
            return attention_no_rope(b, il, h, layer)
        up = b.linear(h, layer.ffn_up, layer.ffn_up_b)
        return b.linear(ops.sqr(b.ctx, ops.relu(b.ctx, up)), layer.ffn_down, layer.ffn_down_b)

    def build(self, b, w):
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            x = b.add_attention(il, x, self.block(b, il, b.norm(x, layer.attn_norm), layer))
        return b.output(x, w)


ARCHS = [NemotronH()]
