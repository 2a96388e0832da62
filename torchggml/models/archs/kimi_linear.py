"""Kimi-Linear (kimi-linear): Kimi Delta Attention (KDA) layers and multi-head latent attention
layers (a layer attends where its attention.head_count_kv is not 0; hybrid memory), DeepSeek-style
experts.

KDA layer: q, k, v (attn_q/k/v or one attn_qkv, kda.head_dim per head) each through a causal
short convolution (ssm_conv1d_q/k/v; one state row for the three) and silu; a per-channel decay
g = ssm_a * softplus(ssm_f_b(ssm_f_a(x)) + ssm_dt.bias) (ssm_a = -exp(A_log), per head), beta =
sigmoid(ssm_beta x); the gated delta rule with that vector gate over q, k L2-normed; the output
RMS-normed per head (ssm_norm), gated by sigmoid(ssm_g_b(ssm_g_a(x))), then attn_output.
MLA layer: deepseek2's compressed-cache attention without rotary positions (the query from attn_q),
scores scaled by 1/sqrt(key_length_mla).
FFN: leading_dense_block_count dense SwiGLU layers, then experts routed by expert_gating_func with
the selection bias exp_probs_b, renormalised, times expert_weights_scale, plus the shared experts.
"""
from __future__ import annotations

import math

from ... import ops
from ..recurrent_layers import HybridArch, causal_conv, delta_rule, per_layer
from .deepseek2 import load_mla, mla_attention, read_mla
from .glm4moe import load_routed_ffn, read_routing, routed_ffn


class KimiLinear(HybridArch):
    names = ("kimi-linear",)
    output_head = "required"
    biases = {}
    v_in_k = True  # the MLA layers' cache, as deepseek2's
    per_layer_keys = ("attention.head_count_kv",)

    def read_hparams(self, hp, keys):
        hp.layer_n_head_kv = per_layer(keys, "attention.head_count_kv", hp.n_layer, hp.n_head_kv)
        hp.d_conv = int(keys.get("ssm.conv_kernel"))
        hp.head_dim_kda = int(keys.get("kda.head_dim"))
        read_mla(hp, keys)
        read_routing(hp, keys, default_gating=None)
        hp.expert_weights_norm = True  # as llama.cpp, whatever the keys say

    def n_embd_r(self, hp):
        return 3 * (hp.d_conv - 1) * hp.head_dim_kda * hp.n_head

    def n_embd_s(self, hp):
        return hp.head_dim_kda * hp.head_dim_kda * hp.n_head

    def load_layer(self, L, hp):
        e, hd, d = hp.n_embd, hp.head_dim_kda, hp.head_dim_kda * hp.n_head
        L.weight("attn_norm", [e])
        if self.is_recurrent(hp, L.il):
            for x in "qkv":  # [d_conv, 1, d] (or [d_conv, 1, d, 1], as the converter writes them)
                L.weight(f"ssm_conv1d_{x}", [hp.d_conv, 1, d])
            if L.has("attn_qkv"):
                L.weight("attn_qkv", [e, 3 * d])
            else:
                for x in "qkv":
                    L.weight(f"attn_{x}", [e, d])
            L.weight("ssm_f_a", [e, hd])
            L.weight("ssm_f_b", [hd, d])
            L.weight("ssm_beta", [e, hp.n_head])
            L.w.add("ssm_a", f"blk.{L.il}.ssm_a", [1, hp.n_head], True, L.layer)  # -exp(A_log)
            L.bias("ssm_dt", [d], required=True)
            L.weight("ssm_g_a", [e, hd])
            L.weight("ssm_g_b", [hd, d])
            L.weight("ssm_norm", [hd])
            L.weight("attn_output", [d, e])
        else:
            load_mla(L, hp)
        load_routed_ffn(L, hp, probs_bias=True)

    def kda(self, b, il, x, layer):
        """Kimi Delta Attention of the layer's input x [n_embd, n_tokens]."""
        hp, ctx = b.hp, b.ctx
        hd, nh, nt, ns = hp.head_dim_kda, hp.n_head, b.n_seq_tokens, b.n_seqs
        d = hd * nh
        if layer.attn_qkv is not None:
            qkv = b.linear(x, layer.attn_qkv)
        else:
            q, k, v = (b.linear(x, layer[f"attn_{c}"]) for c in "qkv")
            qkv = ops.concat(ctx, ops.concat(ctx, q, k, 0), v, 0)
        # the three depthwise convolutions as one over [q | k | v]'s channels
        conv_w = [ops.reshape_2d(ctx, layer[f"ssm_conv1d_{c}"], hp.d_conv, d) for c in "qkv"]
        conv_w = ops.concat(ctx, ops.concat(ctx, conv_w[0], conv_w[1], 1), conv_w[2], 1)
        conv = ops.silu(ctx, causal_conv(b, il, ops.reshape_3d(ctx, qkv, 3 * d, nt, ns), conv_w, None))
        row = conv.nb[1]
        q, k, v = (ops.view_4d(ctx, conv, hd, nh, nt, ns, hd * 4, row, row * nt, i * d * 4) for i in range(3))
        g = ops.softplus(ctx, ops.add(ctx, b.linear(b.linear(x, layer.ssm_f_a), layer.ssm_f_b), layer.ssm_dt_b))
        g = ops.mul(ctx, ops.reshape_3d(ctx, g, hd, nh, nt * ns), ops.reshape_3d(ctx, layer.ssm_a, 1, nh, 1))
        beta = ops.reshape_4d(ctx, ops.sigmoid(ctx, b.linear(x, layer.ssm_beta)), 1, nh, nt, ns)
        y = delta_rule(b, il, q, k, v, ops.reshape_4d(ctx, g, hd, nh, nt, ns), beta)
        gate = ops.reshape_3d(ctx, b.linear(b.linear(x, layer.ssm_g_a), layer.ssm_g_b), hd, nh, nt * ns)
        y = ops.mul(ctx, b.norm(ops.reshape_3d(ctx, y, hd, nh, nt * ns), layer.ssm_norm), ops.sigmoid(ctx, gate))
        return b.linear(ops.reshape_2d(ctx, y, d, b.n_tokens), layer.attn_output)

    def build(self, b, w):
        hp = b.hp
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            h = b.norm(x, layer.attn_norm)
            if self.is_recurrent(hp, il):
                h = self.kda(b, il, h, layer)
            else:
                h = mla_attention(b, il, h, layer, 1.0 / math.sqrt(hp.head_dim_k_mla), rope=False)
            x = b.add_attention(il, x, h)
            x = b.add(x, routed_ffn(b, b.norm(x, layer.ffn_norm), layer))
        return b.output(x, w)


ARCHS = [KimiLinear()]
