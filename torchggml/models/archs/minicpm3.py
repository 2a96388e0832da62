"""MiniCPM3 (minicpm3): DeepSeek-V2-style low-rank attention, decompressed into an ordinary KV
cache. The query comes from a low-rank pair (attn_q_a, RMS-normed, attn_q_b); each head's key
is [nope | rope] (key_length values, the last rope.dimension_count rotated, NeoX): its nope part
and the value come from the RMS-normed compressed latent through attn_kv_b, its rope part is one
rotary key shared by the heads (the rest of attn_kv_a_mqa). LongRoPE factors (rope_factors_long /
short) when the file has them. Fixed scales, as llama.cpp's graph: embeddings x 12, each residual
branch x 1.4 / sqrt(n_layer), the logits x 256 / n_embd.
"""
from __future__ import annotations

import math

from ... import ops
from ...enums import RopeType
from ..builder import Arch, load_ffn
from .deepseek2 import load_low_rank_query, low_rank_query
from .phi3 import load_rope_factors, rope_factors

SCALE_EMBD, SCALE_DEPTH, N_EMBD_BASE = 12.0, 1.4, 256


class MiniCPM3(Arch):
    names = ("minicpm3",)
    rope_type = RopeType.NEOX
    biases = {}

    def read_hparams(self, hp, keys):
        hp.n_lora_q = int(keys.get("attention.q_lora_rank"))
        hp.n_lora_kv = int(keys.get("attention.kv_lora_rank"))

    def load_weights(self, w, hp):
        super().load_weights(w, hp)
        load_rope_factors(w, hp)

    def load_layer(self, L, hp):
        e, nope = hp.n_embd, hp.head_dim_k - hp.n_rot
        L.weight("attn_norm", [e])
        load_low_rank_query(L, hp, hp.head_dim_k)
        L.weight("attn_kv_a_norm", [hp.n_lora_kv])
        L.weight("attn_kv_a_mqa", [e, hp.n_lora_kv + hp.n_rot])
        L.weight("attn_kv_b", [hp.n_lora_kv, hp.n_head * (nope + hp.head_dim_v)])
        L.weight("attn_output", [hp.n_head * hp.head_dim_v, e])
        load_ffn(L, hp)

    def attention(self, b, il, x, layer, factors):
        hp, ctx, n = b.hp, b.ctx, b.n_tokens
        r, nope, lora, nh, dv = hp.n_rot, hp.head_dim_k - hp.n_rot, hp.n_lora_kv, hp.n_head, hp.head_dim_v
        q = ops.reshape_3d(ctx, low_rank_query(b, x, layer), hp.head_dim_k, nh, n)
        q_pe = b.rope(ops.view_3d(ctx, q, r, nh, n, q.nb[1], q.nb[2], nope * q.nb[0]), il, factors)
        q = ops.concat(ctx, ops.view_3d(ctx, q, nope, nh, n, q.nb[1], q.nb[2], 0), q_pe, 0)
        kv_a = b.linear(x, layer.attn_kv_a_mqa)                                  # [lora + r, n]
        latent = b.norm(ops.view_2d(ctx, kv_a, lora, n, kv_a.nb[1], 0), layer.attn_kv_a_norm)
        k_pe = b.rope(ops.view_3d(ctx, kv_a, r, 1, n, kv_a.nb[1], kv_a.nb[1], lora * kv_a.nb[0]), il, factors)
        kv = b.linear(latent, layer.attn_kv_b)                                  # [n_head * (nope + dv), n]
        row = (nope + dv) * kv.nb[0]
        k_nope = ops.view_3d(ctx, kv, nope, nh, n, row, row * nh, 0)
        v = ops.cont(ctx, ops.view_3d(ctx, kv, dv, nh, n, row, row * nh, nope * kv.nb[0]))
        k = ops.concat(ctx, k_nope, ops.repeat_4d(ctx, k_pe, r, nh, n, 1), 0)
        return b.attention(il, q, k, v, layer.attn_output)

    def build(self, b, w):
        hp = b.hp
        factors, res = rope_factors(b, w), SCALE_DEPTH / math.sqrt(hp.n_layer)
        x = b.embed(w.token_embd, scale=SCALE_EMBD)
        for il, layer in enumerate(w.layers):
            h = self.attention(b, il, b.norm(x, layer.attn_norm), layer, factors)
            x = b.add_attention(il, x, b.scale(h, res))
            x = b.add(x, b.scale(b.ffn(b.norm(x, layer.ffn_norm), layer), res))
        return b.output(x, w, scale=N_EMBD_BASE / hp.n_embd)


ARCHS = [MiniCPM3()]
