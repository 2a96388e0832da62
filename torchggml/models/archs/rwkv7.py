"""rwkv7 (RWKV "Goose"): rwkv6's layer layout with RWKV-7's time mix: the state is updated by
the generalized delta rule of rwkv_wkv7 (a = -kk, b = kk * iclr with kk the L2-normed key), the
decay w = exp(-0.606531 sigmoid(LoRA_w(x))), values mixed with the first layer's values
(LoRA_v gate), an r.k bonus per head and an optional LoRA output gate; the channel mix is
relu(k)^2 without a receptance.
"""
from __future__ import annotations

from ... import ops
from .rwkv6 import RWKV6
from ..recurrent_layers import read_states, write_states


class RWKV7(RWKV6):
    names = ("rwkv7",)

    def read_hparams(self, hp, keys):
        get = keys.get
        hp.head_size = int(get("wkv.head_size"))
        hp.n_lora_decay = int(get("attention.decay_lora_rank"))
        hp.n_lora_iclr = int(get("attention.iclr_lora_rank"))
        hp.n_lora_value_res_mix = int(get("attention.value_residual_mix_lora_rank"))
        hp.n_lora_gate = int(get("attention.gate_lora_rank", 0))
        hp.token_shift_count = int(get("token_shift_count", 2))

    def load_layer(self, L, hp):
        e = hp.n_embd
        self.load_shared(L, hp)
        value_rank = hp.n_lora_iclr if L.il == 0 else hp.n_lora_value_res_mix
        for x, rank in (("w", hp.n_lora_decay), ("a", hp.n_lora_iclr), ("v", value_rank)):
            L.weight(f"time_mix_{x}0", [e])
            L.weight(f"time_mix_{x}1", [e, rank])
            L.weight(f"time_mix_{x}2", [rank, e])
        L.weight("time_mix_g1", [e, hp.n_lora_gate], required=False)
        L.weight("time_mix_g2", [hp.n_lora_gate, e], required=False)
        L.weight("time_mix_lerp_fused", [e, 1, 1, 6 if L.layer.time_mix_g1 is not None else 5])
        for name in ("time_mix_k_k", "time_mix_k_a", "time_mix_r_k"):
            L.weight(name, [e])
        for name in ("time_mix_key", "time_mix_value", "time_mix_receptance"):
            L.weight(name, [e, e])

    def time_mix(self, b, il, x, x_prev, layer, first: dict):
        ctx, hp, n = b.ctx, b.hp, b.n_tokens
        e, S = hp.n_embd, hp.head_size
        H = e // S
        gated = layer.time_mix_g1 is not None
        n_mix = 6 if gated else 5
        sx = ops.repeat_4d(ctx, ops.sub(ctx, x_prev, x), e, b.n_seq_tokens, b.n_seqs, n_mix)
        xxx = ops.add(ctx, ops.mul(ctx, sx, layer.time_mix_lerp_fused), x)
        xr, xw, xk, xv, xa, *xg = (ops.view_2d(ctx, xxx, e, n, xxx.nb[1], i * e * n * 4) for i in range(n_mix))

        def lora(name, inp, act=None):  # x2 @ act(x1 @ inp)
            h = ops.mul_mat(ctx, layer[f"time_mix_{name}1"], inp)
            return ops.mul_mat(ctx, layer[f"time_mix_{name}2"], act(ctx, h) if act else h)

        r = b.linear(xr, layer.time_mix_receptance)
        w = ops.add(ctx, lora("w", xw, ops.tanh), layer.time_mix_w0)
        w = ops.exp(ctx, ops.scale(ctx, ops.sigmoid(ctx, w), -0.606531))
        k = b.linear(xk, layer.time_mix_key)
        v = b.linear(xv, layer.time_mix_value)
        if "v" not in first:
            first["v"] = v
        else:  # the first layer's values, mixed in by a learned gate
            mix = ops.sigmoid(ctx, ops.add(ctx, lora("v", xv), layer.time_mix_v0))
            v = ops.add(ctx, v, ops.mul(ctx, ops.sub(ctx, first["v"], v), mix))
        a = ops.sigmoid(ctx, ops.add(ctx, lora("a", xa), layer.time_mix_a0))
        kk = ops.l2_norm(ctx, ops.reshape_3d(ctx, ops.mul(ctx, k, layer.time_mix_k_k), S, H, n), 1e-12)
        ka = ops.mul(ctx, k, layer.time_mix_k_a)
        k = ops.add(ctx, k, ops.sub(ctx, ops.mul(ctx, a, ka), ka))
        r, w, k, v, a = (ops.reshape_3d(ctx, t, S, H, n) for t in (r, w, k, v, a))
        states = b.memory.recurrent.s[il]
        out = ops.rwkv_wkv7(ctx, r, w, k, v, ops.neg(ctx, kk), ops.mul(ctx, kk, a), read_states(b, states))
        write_states(b, states, ops.view_1d(ctx, out, e * S * b.n_seqs, e * n * 4))
        y = ops.norm(ctx, ops.reshape_3d(ctx, ops.view_1d(ctx, out, e * n, 0), S, H, n), 64e-5)  # per head
        y = ops.add(ctx, ops.mul(ctx, ops.reshape_2d(ctx, y, e, n), layer.time_mix_ln), layer.time_mix_ln_b)
        rk = ops.sum_rows(ctx, ops.mul(ctx, ops.mul(ctx, k, r), ops.reshape_2d(ctx, layer.time_mix_r_k, S, H)))
        y = ops.add(ctx, y, ops.reshape_2d(ctx, ops.mul(ctx, v, rk), e, n))
        if gated:
            y = ops.mul(ctx, y, lora("g", xg[0], ops.sigmoid))
        return ops.reshape_3d(ctx, b.linear(y, layer.time_mix_output), e, b.n_seq_tokens, b.n_seqs)

    def channel_mix(self, b, x, x_prev, layer):
        ctx = b.ctx
        xk = ops.add(ctx, ops.mul(ctx, ops.sub(ctx, x_prev, x), layer.channel_mix_lerp_k), x)
        return b.linear(ops.sqr(ctx, ops.relu(ctx, b.linear(xk, layer.channel_mix_key))), layer.channel_mix_value)


ARCHS = [RWKV7()]
