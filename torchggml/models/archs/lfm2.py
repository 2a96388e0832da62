"""lfm2 (LiquidAI LFM2): gated short-convolution layers and attention layers (hybrid memory; a
layer is a convolution where attention.head_count_kv is 0).

Per layer: h = rms_norm(x); x += shortconv(h) or attention(h) (q/k RMS norms, NeoX rotary);
x += ffn(rms_norm(x)). The short convolution: b, c, x = in_proj(h) in thirds; y = c *
conv(b * x) (a depthwise causal convolution of shortconv.l_cache taps, continuing from the
sequence's last l_cache - 1 inputs); out_proj(y). With attention.sliding_window every attention
layer attends within the window. The output norm is stored as token_embd_norm.
"""
from __future__ import annotations

from ... import ops
from ...enums import RopeType
from ..builder import LayerLoader, load_attention, load_ffn
from ..recurrent_layers import HybridArch, causal_conv, per_layer


class LFM2(HybridArch):
    names = ("lfm2",)
    rope_type = RopeType.NEOX

    def read_hparams(self, hp, keys):
        hp.l_cache = int(keys.get("shortconv.l_cache"))
        hp.layer_n_head_kv = per_layer(keys, "attention.head_count_kv", hp.n_layer, hp.n_head_kv)
        hp.n_swa = int(keys.get("attention.sliding_window", 0))
        if hp.n_swa:  # every attention layer slides (the standard window)
            hp.swa_layers = [self.has_attention(hp, il) for il in range(hp.n_layer)]

    def n_embd_r(self, hp):
        return hp.n_embd * (hp.l_cache - 1)

    def n_embd_s(self, hp):
        return 0

    def load_weights(self, w, hp):
        e = hp.n_embd
        w.add("token_embd", "token_embd.weight", [e, hp.n_vocab])
        w.add("output_norm", "token_embd_norm.weight", [e])
        if w.add("output", "output.weight", [e, hp.n_vocab], required=False) is None:
            w.globals["output"] = w.token_embd
        for il in range(hp.n_layer):
            L = LayerLoader(w, il)
            self.load_layer(L, hp)
            w.layers.append(L.layer)

    def load_layer(self, L, hp):
        e = hp.n_embd
        if self.is_recurrent(hp, L.il):
            L.weight("attn_norm", [e])
            L.weight("shortconv.conv", [hp.l_cache, e])
            L.weight("shortconv.in_proj", [e, 3 * e])
            L.weight("shortconv.out_proj", [e, e])
        else:
            load_attention(L, hp, qk_norm=True)
        self.load_ffn(L, hp)

    def load_ffn(self, L, hp):
        load_ffn(L, hp)

    def ffn(self, b, h, layer):
        return b.ffn(h, layer)

    def shortconv(self, b, il, h, layer):
        ctx, e = b.ctx, b.hp.n_embd
        bcx = b.linear(ops.reshape_3d(ctx, h, e, b.n_seq_tokens, b.n_seqs), layer["shortconv.in_proj"])
        gate_b, gate_c, x = (ops.view_3d(ctx, bcx, e, b.n_seq_tokens, b.n_seqs, bcx.nb[1], bcx.nb[2], i * e * bcx.nb[0])
                             for i in range(3))
        conv = causal_conv(b, il, ops.mul(ctx, gate_b, x), layer["shortconv.conv"], None)
        y = b.linear(ops.mul(ctx, gate_c, conv), layer["shortconv.out_proj"])
        return ops.reshape_2d(ctx, y, e, b.n_tokens)

    def build(self, b, w):
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            h = b.norm(x, layer.attn_norm)
            h = self.shortconv(b, il, h, layer) if self.is_recurrent(b.hp, il) else b.self_attention(il, h, layer)
            x = b.add_attention(il, x, h)
            x = b.add(x, self.ffn(b, b.norm(x, layer.ffn_norm), layer))
        return b.output(x, w)


ARCHS = [LFM2()]
