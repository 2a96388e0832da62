"""DeepSeek V2 / V3 / R1 and Kimi K2 (deepseek2): multi-head latent attention (MLA) with its
compressed KV cache, and DeepSeek-style experts.

Attention, as llama.cpp runs MLA files (attn_k_b / attn_v_b): the query comes from a low-rank
pair (attn_q_a, RMS-normed, then attn_q_b; or one attn_q in the Lite models) and splits per head
into a part without positions (nope) and a rotary part; one projection attn_kv_a_mqa gives the
token's compressed latent (kv_lora_rank values, RMS-normed) and a rotary key shared by every head.
The cache keeps only [latent | rotary key] per token (attention.key_length values, one K/V head;
V is the latent, read from the same rows: `KVCache(v_in_k=True)`). The nope query is absorbed into
the latent space by attn_k_b, so attention scores are [q_absorbed | q_rope] . [latent | k_rope];
each head's output over the latents is decompressed by attn_v_b, then projected by attn_output.
Scores are scaled by mscale^2 / sqrt(key_length_mla) (mscale: YaRN's correction; 1 without YaRN),
queries optionally by Llama 4's temperature (attention.temperature_scale).

FFN: leading_dense_block_count dense SwiGLU layers, then experts routed by softmax or sigmoid
(expert_gating_func) with the selection bias exp_probs_b, grouped top-k (expert_group_count),
expert_weights_norm / expert_weights_scale, plus expert_shared_count always-on shared experts.
The multi-token-prediction blocks (nextn_predict_layers) are skipped as llama.cpp does.
"""
from __future__ import annotations

import math

from ... import ops
from ...enums import RopeType
from ...gguf.loader import GGUFError
from ..builder import Arch
from .glm4moe import load_routed_ffn, read_routing, routed_ffn, skip_nextn_layers


def read_mla(hp, keys) -> None:
    """The MLA keys: the low ranks, the heads' key and value widths, and the cache's one K/V head
    of key_length = kv_lora_rank + rope.dimension_count (its value_length, kv_lora_rank, may be
    absent: V is read from K)."""
    path = keys.f.path
    hp.n_lora_q = int(keys.get("attention.q_lora_rank", 0))
    hp.n_lora_kv = int(keys.get("attention.kv_lora_rank"))
    hp.head_dim_k_mla = int(keys.get("attention.key_length_mla", 0))
    hp.head_dim_v_mla = int(keys.get("attention.value_length_mla", 0))
    if not keys.has("attention.value_length"):
        hp.head_dim_v = hp.n_lora_kv
    if not hp.head_dim_k_mla or not hp.head_dim_v_mla:
        raise GGUFError(f"{path}: {keys.arch}: the file has no attention.key_length_mla / value_length_mla: "
                        f"an older conversion (attn_kv_b) without MLA, not supported: convert it again")
    if hp.n_head_kv != 1 or hp.head_dim_k != hp.n_lora_kv + hp.n_rot or hp.head_dim_v != hp.n_lora_kv:
        raise GGUFError(f"{path}: {keys.arch}: an MLA cache has one K/V head of key_length = kv_lora_rank + "
                        f"rope.dimension_count ({hp.n_lora_kv} + {hp.n_rot}) and value_length = kv_lora_rank; "
                        f"the file has {hp.n_head_kv} heads of {hp.head_dim_k} / {hp.head_dim_v}")


def load_low_rank_query(L, hp, head_dim: int) -> None:
    """The query's low-rank pair: attn_q_a to q_lora_rank values, RMS-normed, attn_q_b to the heads."""
    L.weight("attn_q_a_norm", [hp.n_lora_q])
    L.weight("attn_q_a", [hp.n_embd, hp.n_lora_q])
    L.weight("attn_q_b", [hp.n_lora_q, hp.n_head * head_dim])


def low_rank_query(b, x, layer):
    return b.linear(b.norm(b.linear(x, layer.attn_q_a), layer.attn_q_a_norm), layer.attn_q_b)


def load_mla(L, hp) -> None:
    """The MLA projections (the query's low-rank pair, or attn_q)."""
    e, nh, k_mla, v_mla = hp.n_embd, hp.n_head, hp.head_dim_k_mla, hp.head_dim_v_mla
    if hp.n_lora_q:
        load_low_rank_query(L, hp, k_mla)
    else:
        L.weight("attn_q", [e, nh * k_mla])
    L.weight("attn_kv_a_norm", [hp.n_lora_kv])
    L.weight("attn_kv_a_mqa", [e, hp.n_lora_kv + hp.n_rot])
    L.weight("attn_k_b", [k_mla - hp.n_rot, hp.n_lora_kv, nh])
    L.weight("attn_v_b", [hp.n_lora_kv, v_mla, nh])
    L.weight("attn_output", [nh * v_mla, e])


def mla_attention(b, il, x, layer, kq_scale: float, q_temp=None, rope: bool = True):
    """Multi-head latent attention over the compressed cache (see the module's docstring); without
    rotary positions with rope=False (kimi-linear: its rope.dimension_count values of each key
    are shared by the heads but not rotated)."""
    hp, ctx, n = b.hp, b.ctx, b.n_tokens
    r, nope, lora = hp.n_rot, hp.head_dim_k_mla - hp.n_rot, hp.n_lora_kv
    q = low_rank_query(b, x, layer) if layer.attn_q_a is not None else b.linear(x, layer.attn_q)
    q = ops.reshape_3d(ctx, q, hp.head_dim_k_mla, hp.n_head, n)
    kv = b.linear(x, layer.attn_kv_a_mqa)                                   # [lora + r, n]
    latent = ops.view_2d(ctx, kv, lora, n, kv.nb[1], 0)
    k_pe = ops.view_3d(ctx, kv, r, 1, n, kv.nb[1], kv.nb[1], lora * kv.nb[0])
    latent = b.norm(latent, layer.attn_kv_a_norm)
    q_nope = ops.view_3d(ctx, q, nope, hp.n_head, n, q.nb[1], q.nb[2], 0)
    q_pe = ops.view_3d(ctx, q, r, hp.n_head, n, q.nb[1], q.nb[2], nope * q.nb[0])
    if rope:
        k_pe, q_pe = b.rope(k_pe, il), b.rope(q_pe, il)
    # the nope query in the latent space, per head: attn_k_b [nope, lora, n_head]
    q_abs = ops.mul_mat(ctx, layer.attn_k_b, ops.permute(ctx, q_nope, 0, 2, 1, 3))  # [lora, n, n_head]
    q = ops.concat(ctx, ops.permute(ctx, q_abs, 0, 2, 1, 3), q_pe, 0)      # [lora + r, n_head, n]
    latent = ops.reshape_3d(ctx, latent, lora, 1, n)
    k = ops.concat(ctx, latent, k_pe, 0)                                    # [lora + r, 1, n]
    if q_temp is not None:
        q = ops.mul(ctx, q, q_temp)
    return b.attention(il, q, k, latent, layer.attn_output, kq_scale=kq_scale, v_mla=layer.attn_v_b)


class DeepSeek2(Arch):
    names = ("deepseek2",)
    rope_type = RopeType.NORMAL
    biases = {}
    v_in_k = True  # the KV cache: V is the start of each K row (the latent)

    def read_hparams(self, hp, keys):
        path = keys.f.path
        read_routing(hp, keys, default_gating=1)
        skip_nextn_layers(hp, keys)
        read_mla(hp, keys)
        log_mul = float(keys.get("rope.scaling.yarn_log_multiplier", 0.0))
        # llama.cpp stores it as 0.1 x mscale_all_dim and, for deepseek2 with mscale_all_dim != 1, takes
        # YaRN's mscale equal to it (its attention factor then 1)
        hp.yarn_log_mul = log_mul / 0.1
        hp.yarn_mscale = hp.yarn_log_mul if hp.yarn_log_mul not in (0.0, 1.0) else 1.0
        hp.attn_temp_scale = float(keys.get("attention.temperature_scale", 0.0))
        hp.attn_temp_length = int(keys.get("attention.temperature_length", 0))
        if hp.attn_temp_scale and not hp.attn_temp_length:
            raise GGUFError(f"{path}: {keys.arch}.attention.temperature_scale needs attention.temperature_length")

    def load_layer(self, L, hp):
        L.weight("attn_norm", [hp.n_embd])
        load_mla(L, hp)
        load_routed_ffn(L, hp)

    @staticmethod
    def kq_scale(hp) -> float:
        """llama.cpp's: mscale^2 / sqrt(key_length_mla), mscale YaRN's magnitude correction."""
        ln = math.log(1.0 / hp.rope_freq_scale)
        mscale = hp.yarn_attn_factor * (1.0 + 0.1 * ln) * (1.0 + 0.1 * hp.yarn_log_mul * ln)
        return mscale * mscale / math.sqrt(hp.head_dim_k_mla)

    def build(self, b, w):
        hp = b.hp
        q_temp = b.attn_temperature(hp.attn_temp_scale, hp.attn_temp_length) if hp.attn_temp_scale else None
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            attn = mla_attention(b, il, b.norm(x, layer.attn_norm), layer, self.kq_scale(hp), q_temp)
            x = b.add_attention(il, x, attn)
            x = b.add(x, routed_ffn(b, b.norm(x, layer.ffn_norm), layer))
        return b.output(x, w)


ARCHS = [DeepSeek2()]
