"""rwkv6 (RWKV "Finch"): attention-free; every layer a time mix (the WKV6 recurrence over a
per-head S x S state) and a channel mix, both mixing each token with its predecessor (token
shift: the last token of the previous micro-batch is kept as the r state).

x = layer_norm(embed(tokens)); per layer: a = layer_norm(x); x += time_mix(a, a_prev);
f = layer_norm_2(x); x += channel_mix(f, f_prev); x halves every rescale_every_n_layers layers;
logits = output(layer_norm(x)). Time mix: data-dependent lerps between the token and its
predecessor (a low-rank tanh MLP), r/k/v/gate projections, the decay w = exp(-exp(decay +
LoRA(x_w))), rwkv_wkv6 with the bonus time_mix_first, a group norm per head, silu(gate).
"""
from __future__ import annotations

from ... import ops
from ..builder import LayerLoader
from ..recurrent_layers import (RecurrentArch, previous_tokens, read_states, token_shift_load, token_shift_store,
                                write_states)


class RWKV6(RecurrentArch):
    names = ("rwkv6",)

    def read_hparams(self, hp, keys):
        get = keys.get
        hp.head_size = int(get("wkv.head_size"))
        hp.time_mix_extra_dim = int(get("time_mix_extra_dim"))
        hp.time_decay_extra_dim = int(get("time_decay_extra_dim"))
        hp.rescale_every_n_layers = int(get("rescale_every_n_layers", 0))
        hp.token_shift_count = int(get("token_shift_count", 2))

    def n_embd_r(self, hp):
        return hp.token_shift_count * hp.n_embd

    def n_embd_s(self, hp):
        return hp.n_embd * hp.head_size

    def load_weights(self, w, hp):
        e = hp.n_embd
        w.add("token_embd", "token_embd.weight", [e, hp.n_vocab])
        w.add("tok_norm", "token_embd_norm.weight", [e])
        w.add("tok_norm_b", "token_embd_norm.bias", [e])
        w.add("output_norm", "output_norm.weight", [e])
        w.add("output_norm_b", "output_norm.bias", [e])
        w.add("output", "output.weight", [e, hp.n_vocab])
        for il in range(hp.n_layer):
            L = LayerLoader(w, il)
            self.load_layer(L, hp)
            w.layers.append(L.layer)

    @staticmethod
    def load_shared(L, hp):
        """What RWKV-6 and -7 layers both hold: the two LayerNorms, the time mix's group norm and
        output, the channel mix's key lerp and its key / value projections."""
        e = hp.n_embd
        for name in ("attn_norm", "attn_norm_2", "time_mix_ln"):
            L.weight(name, [e])
            L.bias(name, [e], required=True)
        L.weight("time_mix_output", [e, e])
        L.weight("channel_mix_lerp_k", [e, 1, 1])
        L.weight("channel_mix_key", [e, hp.n_ff])
        L.weight("channel_mix_value", [hp.n_ff, e])

    def load_layer(self, L, hp):
        e, x_dim, d_dim = hp.n_embd, hp.time_mix_extra_dim, hp.time_decay_extra_dim
        self.load_shared(L, hp)
        L.weight("time_mix_w1", [e, x_dim * 5])
        L.weight("time_mix_w2", [x_dim, e, 5])
        for name in ("time_mix_lerp_x", "channel_mix_lerp_r"):
            L.weight(name, [e, 1, 1])
        L.weight("time_mix_lerp_fused", [e, 1, 1, 5])
        L.weight("time_mix_first", [hp.head_size, e // hp.head_size])
        L.weight("time_mix_decay", [e])
        L.weight("time_mix_decay_w1", [e, d_dim])
        L.weight("time_mix_decay_w2", [d_dim, e])
        for name in ("time_mix_key", "time_mix_value", "time_mix_receptance", "time_mix_gate",
                     "channel_mix_receptance"):
            L.weight(name, [e, e])

    def time_mix(self, b, il, x, x_prev, layer, first: dict):
        ctx, hp, n = b.ctx, b.hp, b.n_tokens
        e, S = hp.n_embd, hp.head_size
        H = e // S
        sx = ops.reshape_2d(ctx, ops.sub(ctx, x_prev, x), e, n)
        x = ops.reshape_2d(ctx, x, e, n)
        xxx = ops.add(ctx, ops.mul(ctx, sx, layer.time_mix_lerp_x), x)
        xxx = ops.tanh(ctx, ops.mul_mat(ctx, layer.time_mix_w1, xxx))              # [5 extra, n]
        xxx = ops.cont(ctx, ops.permute(ctx, ops.reshape_4d(ctx, xxx, hp.time_mix_extra_dim, 1, 5, n), 0, 1, 3, 2))
        w2 = layer.time_mix_w2
        xxx = ops.mul_mat(ctx, ops.reshape_4d(ctx, w2, w2.ne[0], w2.ne[1], 1, 5), xxx)  # [e, 1, n, 5]
        xxx = ops.add(ctx, ops.mul(ctx, ops.add(ctx, xxx, layer.time_mix_lerp_fused), ops.reshape_3d(ctx, sx, e, 1, n)),
                      ops.reshape_3d(ctx, x, e, 1, n))
        xw, xk, xv, xr, xg = (ops.view_2d(ctx, xxx, e, n, xxx.nb[1], i * e * n * 4) for i in range(5))
        r = ops.reshape_3d(ctx, b.linear(xr, layer.time_mix_receptance), S, H, n)
        k = ops.reshape_3d(ctx, b.linear(xk, layer.time_mix_key), S, H, n)
        v = ops.reshape_3d(ctx, b.linear(xv, layer.time_mix_value), S, H, n)
        g = ops.silu(ctx, b.linear(xg, layer.time_mix_gate))
        w = ops.mul_mat(ctx, layer.time_mix_decay_w2, ops.tanh(ctx, ops.mul_mat(ctx, layer.time_mix_decay_w1, xw)))
        w = ops.exp(ctx, ops.neg(ctx, ops.exp(ctx, ops.add(ctx, w, layer.time_mix_decay))))
        w = ops.reshape_3d(ctx, w, S, H, n)
        states = b.memory.recurrent.s[il]
        out = ops.rwkv_wkv6(ctx, k, v, r, layer.time_mix_first, w, read_states(b, states))
        write_states(b, states, ops.view_1d(ctx, out, e * S * b.n_seqs, e * n * 4))
        y = ops.norm(ctx, ops.reshape_3d(ctx, ops.view_1d(ctx, out, e * n, 0), S, H, n), 64e-5)  # per head
        y = ops.add(ctx, ops.mul(ctx, ops.reshape_2d(ctx, y, e, n), layer.time_mix_ln), layer.time_mix_ln_b)
        return ops.reshape_3d(ctx, b.linear(ops.mul(ctx, y, g), layer.time_mix_output), e, b.n_seq_tokens, b.n_seqs)

    def channel_mix(self, b, x, x_prev, layer):
        ctx = b.ctx
        sx = ops.sub(ctx, x_prev, x)
        xk = ops.add(ctx, ops.mul(ctx, sx, layer.channel_mix_lerp_k), x)
        xr = ops.add(ctx, ops.mul(ctx, sx, layer.channel_mix_lerp_r), x)
        r = ops.sigmoid(ctx, b.linear(xr, layer.channel_mix_receptance))
        k = ops.sqr(ctx, ops.relu(ctx, b.linear(xk, layer.channel_mix_key)))
        return ops.mul(ctx, r, b.linear(k, layer.channel_mix_value))

    def build(self, b, w):
        ctx, hp = b.ctx, b.hp
        e, n = hp.n_embd, b.n_tokens
        x = b.norm(b.embed(w.token_embd), w.tok_norm, w.tok_norm_b, rms=False)
        first = {}  # what the first layer's time mix leaves the others (RWKV-7's value)
        for il, layer in enumerate(w.layers):
            x = ops.reshape_3d(ctx, x, e, b.n_seq_tokens, b.n_seqs)
            att_shift, ffn_shift = token_shift_load(b, il, 2)
            att = b.norm(x, layer.attn_norm, layer.attn_norm_b, rms=False)
            ffn_inp = ops.add(ctx, self.time_mix(b, il, att, previous_tokens(b, att_shift, att), layer, first), x)
            ffn = b.norm(ffn_inp, layer.attn_norm_2, layer.attn_norm_2_b, rms=False)
            ffn_prev = previous_tokens(b, ffn_shift, ffn)
            token_shift_store(b, il, att, ffn)
            rows = (ops.reshape_2d(ctx, t, e, n) for t in (ffn_inp, ffn, ffn_prev))
            ffn_inp, ffn, ffn_prev = b.output_rows(il, *rows)
            x = ops.add(ctx, self.channel_mix(b, ffn, ffn_prev, layer), ffn_inp)
            if getattr(hp, "rescale_every_n_layers", 0) and (il + 1) % hp.rescale_every_n_layers == 0:
                x = ops.scale(ctx, x, 0.5)
        return b.output(x, w, rms=False)


ARCHS = [RWKV6()]
