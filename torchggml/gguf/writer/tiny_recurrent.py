"""The tensors of the tiny recurrent and hybrid models (tiny.py's cases whose architecture is in
RECURRENT_ARCHS): seeded random weights with the shapes llama.cpp loads, scaled so activations
stay O(1) and the recurrences decay (A < 0, decays in (0, 1)).

Each layer's kind (`layer_kinds`) follows llama.cpp's rule for the architecture from the keys the
case writes (head_count_kv 0 marks a recurrent layer; nemotron_h also reads feed_forward_length):
"m" the recurrent mixer (Mamba, Mamba-2 or LFM2's short convolution), "a" attention, "f" an FFN
only, "ma" both mixers side by side (falcon-h1). RWKV and Qwen3-Next have their own writers below.
"""
from __future__ import annotations

import numpy as np
import torch

RECURRENT_ARCHS = ("mamba", "mamba2", "jamba", "granitehybrid", "nemotron_h", "falcon-h1", "lfm2", "rwkv6", "rwkv7",
                   "qwen3next")
RECURRENT_ARCHS += ("qwen35", "qwen35moe", "lfm2moe", "kimi-linear")  # issue 37, second round

# written as F32 whatever the weight type (the ops read them as F32; llama.cpp's quantizer keeps
# them too): convolutions, decays, skip weights, norms
F32_SUFFIXES = ("ssm_conv1d.weight", ".ssm_a", ".ssm_d", "norm.weight", "shortconv.conv.weight")


# RWKV's lerps, bonus, decay and low-rank mixers
F32_PARTS = ("lerp", "time_mix_first", "time_mix_decay", "time_mix_w", "time_mix_a", "time_mix_v0", "time_mix_v1",
             "time_mix_v2", "time_mix_g1", "time_mix_g2", "time_mix_k_", "time_mix_r_k")


def keep_f32(name: str, data: np.ndarray) -> bool:
    """Recurrent tensors that stay F32, and rows no 32-value block divides."""
    return name.endswith(F32_SUFFIXES) or any(p in name for p in F32_PARTS) or data.shape[-1] % 32 != 0


def layer_kinds(case) -> list[str]:
    """Per layer, what it holds as llama.cpp decides from the keys: "m" a Mamba mixer, "a"
    attention, "f" only an FFN (nemotron_h), "ma" both mixers side by side (falcon-h1)."""
    meta, n = dict(case.metadata), case.n_layer

    def per(key, default):
        value = meta.get(key, default)
        return list(value) if isinstance(value, tuple) else [value] * n

    kv, ff = per("attention.head_count_kv", case.n_head_kv), per("feed_forward_length", case.n_ff)
    if case.arch in ("mamba", "mamba2"):
        return ["m"] * n
    if case.arch == "falcon-h1":
        return ["ma"] * n
    if case.arch == "nemotron_h":
        return ["m" if kv[i] == 0 and ff[i] == 0 else "a" if ff[i] == 0 else "f" for i in range(n)]
    return ["m" if kv[i] == 0 else "a" for i in range(n)]


def recurrent_tensors(case, gen: torch.Generator) -> dict[str, torch.Tensor]:
    meta, f = dict(case.metadata), case.features
    e, v, hd = case.n_embd, case.n_vocab, case.head_dim
    mamba1 = case.arch in ("mamba", "jamba")

    def mat(*shape):
        return torch.randn(*shape, generator=gen) / shape[-1] ** 0.5

    def vec(n, mean=0.0, std=0.1):
        return mean + std * torch.randn(n, generator=gen)

    w = {"token_embd.weight": torch.randn(v, e, generator=gen)}
    if case.arch in ("rwkv6", "rwkv7", "qwen3next", "qwen35", "qwen35moe", "kimi-linear"):
        own = {"rwkv6": _rwkv6, "rwkv7": _rwkv7, "kimi-linear": _kimi_linear}.get(case.arch, _qwen3next)
        return {**w, **own(case, meta, mat, vec, gen)}
    for il, kind in enumerate(layer_kinds(case)):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"] = vec(e, 1.0)
        if "a" in kind:
            n_kv = max(meta.get("attention.head_count_kv", case.n_head_kv)) if isinstance(
                meta.get("attention.head_count_kv"), tuple) else case.n_head_kv
            w[p + "attn_q.weight"] = mat(hd * case.n_head, e)
            w[p + "attn_k.weight"] = mat(hd * n_kv, e)
            w[p + "attn_v.weight"] = mat(hd * n_kv, e)
            w[p + "attn_output.weight"] = mat(e, hd * case.n_head)
        if "a" in kind and case.arch in ("lfm2", "lfm2moe"):
            w[p + "attn_q_norm.weight"], w[p + "attn_k_norm.weight"] = vec(hd, 1.0), vec(hd, 1.0)
        if "m" in kind and case.arch in ("lfm2", "lfm2moe"):
            l_cache = meta["shortconv.l_cache"]
            w[p + "shortconv.conv.weight"] = mat(e, l_cache)
            w[p + "shortconv.in_proj.weight"] = mat(3 * e, e)
            w[p + "shortconv.out_proj.weight"] = mat(e, e)
        elif "m" in kind:
            w.update((_mamba if mamba1 else _mamba2)(p, meta, e, mat, vec, gen))
            if case.arch == "jamba":
                dt_rank, d_state = meta["ssm.time_step_rank"], meta["ssm.state_size"]
                w[p + "ssm_dt_norm.weight"] = vec(dt_rank, 1.0)
                w[p + "ssm_b_norm.weight"], w[p + "ssm_c_norm.weight"] = vec(d_state, 1.0), vec(d_state, 1.0)
        if case.arch == "nemotron_h":
            if kind == "f":
                n_ff = meta["feed_forward_length"][il]
                w[p + "ffn_up.weight"], w[p + "ffn_down.weight"] = mat(n_ff, e), mat(e, n_ff)
        elif case.arch not in ("mamba", "mamba2"):
            w[p + ("ffn_norm" if case.arch == "falcon-h1" else "ffn_norm.weight")] = vec(e, 1.0)
            if ("moe" in f and il >= meta.get("leading_dense_block_count", 0)) or ("moe_odd" in f and il % 2):
                n, ff = case.n_expert, meta.get("expert_feed_forward_length", case.n_ff)
                if "probs_bias" in f:
                    w[p + "exp_probs_b.bias"] = vec(n, 0.0, 0.05)
                w[p + "ffn_gate_inp.weight"] = mat(n, e) * 4.0
                w[p + "ffn_gate_exps.weight"] = mat(n, ff, e)
                w[p + "ffn_up_exps.weight"] = mat(n, ff, e)
                w[p + "ffn_down_exps.weight"] = mat(n, e, ff)
                if "shexp" in f:
                    sh = meta["expert_shared_feed_forward_length"]
                    w[p + "ffn_gate_shexp.weight"], w[p + "ffn_up_shexp.weight"] = mat(sh, e), mat(sh, e)
                    w[p + "ffn_down_shexp.weight"] = mat(e, sh)
            else:
                w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"] = mat(case.n_ff, e), mat(case.n_ff, e)
                w[p + "ffn_down.weight"] = mat(e, case.n_ff)
    w["token_embd_norm.weight" if case.arch in ("lfm2", "lfm2moe") else "output_norm.weight"] = vec(e, 1.0)
    w["output.weight"] = mat(v, e)
    return w


def _mamba(p, meta, e, mat, vec, gen):
    d_inner, d_state = meta["ssm.inner_size"], meta["ssm.state_size"]
    d_conv, dt_rank = meta["ssm.conv_kernel"], meta["ssm.time_step_rank"]
    return {
        p + "ssm_in.weight": mat(2 * d_inner, e),
        p + "ssm_conv1d.weight": mat(d_inner, d_conv),
        p + "ssm_conv1d.bias": vec(d_inner),
        p + "ssm_x.weight": mat(dt_rank + 2 * d_state, d_inner),
        p + "ssm_dt.weight": mat(d_inner, dt_rank),
        p + "ssm_dt.bias": vec(d_inner, -1.0, 0.5),
        p + "ssm_a": -torch.exp(torch.rand(d_inner, d_state, generator=gen) * 2.0 - 1.0),
        p + "ssm_d": vec(d_inner, 1.0),
        p + "ssm_out.weight": mat(e, d_inner),
    }


def _mamba2(p, meta, e, mat, vec, gen):
    d_inner, d_state = meta["ssm.inner_size"], meta["ssm.state_size"]
    d_conv, n_head, n_group = meta["ssm.conv_kernel"], meta["ssm.time_step_rank"], meta["ssm.group_count"]
    conv = d_inner + 2 * n_group * d_state
    return {
        p + "ssm_in.weight": mat(d_inner + conv + n_head, e),
        p + "ssm_conv1d.weight": mat(conv, d_conv),
        p + "ssm_conv1d.bias": vec(conv),
        p + "ssm_dt.bias": vec(n_head, -1.0, 0.5),
        p + "ssm_a": -torch.exp(torch.rand(n_head, 1, generator=gen) * 2.0 - 1.0),
        p + "ssm_d": vec(n_head, 1.0).reshape(n_head, 1),
        p + "ssm_norm.weight": vec(d_inner, 1.0).reshape(n_group, d_inner // n_group),
        p + "ssm_out.weight": mat(e, d_inner),
    }


def _rwkv6(case, meta, mat, vec, gen):
    e, ff, S = case.n_embd, case.n_ff, meta["wkv.head_size"]
    x_dim, d_dim = meta["time_mix_extra_dim"], meta["time_decay_extra_dim"]

    def lerp(*shape):
        return torch.rand(*shape, generator=gen)

    w = {"token_embd_norm.weight": vec(e, 1.0), "token_embd_norm.bias": vec(e)}
    for il in range(case.n_layer):
        p = f"blk.{il}."
        for name in ("attn_norm", "attn_norm_2", "time_mix_ln"):
            w[p + name + ".weight"], w[p + name + ".bias"] = vec(e, 1.0), vec(e)
        w[p + "time_mix_w1.weight"] = mat(5 * x_dim, e) * 0.5
        w[p + "time_mix_w2.weight"] = mat(5, e, x_dim) * 0.5
        w[p + "time_mix_lerp_x.weight"] = lerp(1, 1, e)
        w[p + "time_mix_lerp_fused.weight"] = lerp(5, 1, 1, e)
        w[p + "time_mix_first.weight"] = vec(e, 0.0, 0.5).reshape(e // S, S)
        w[p + "time_mix_decay.weight"] = vec(e, -1.0, 0.5)
        w[p + "time_mix_decay_w1.weight"] = mat(d_dim, e) * 0.5
        w[p + "time_mix_decay_w2.weight"] = mat(e, d_dim) * 0.5
        for name in ("key", "value", "receptance", "gate", "output"):
            w[p + f"time_mix_{name}.weight"] = mat(e, e)
        w[p + "channel_mix_lerp_k.weight"], w[p + "channel_mix_lerp_r.weight"] = lerp(1, 1, e), lerp(1, 1, e)
        w[p + "channel_mix_key.weight"] = mat(ff, e)
        w[p + "channel_mix_value.weight"] = mat(e, ff)
        w[p + "channel_mix_receptance.weight"] = mat(e, e)
    w["output_norm.weight"], w["output_norm.bias"] = vec(e, 1.0), vec(e)
    w["output.weight"] = mat(case.n_vocab, e)
    return w


def _rwkv7(case, meta, mat, vec, gen):
    e, ff = case.n_embd, case.n_ff
    ranks = {"w": meta["attention.decay_lora_rank"], "a": meta["attention.iclr_lora_rank"],
             "g": meta["attention.gate_lora_rank"]}
    w = {"token_embd_norm.weight": vec(e, 1.0), "token_embd_norm.bias": vec(e)}
    for il in range(case.n_layer):
        p = f"blk.{il}."
        for name in ("attn_norm", "attn_norm_2", "time_mix_ln"):
            w[p + name + ".weight"], w[p + name + ".bias"] = vec(e, 1.0), vec(e)
        ranks["v"] = meta["attention.iclr_lora_rank"] if il == 0 else meta["attention.value_residual_mix_lora_rank"]
        for x in "wav":
            w[p + f"time_mix_{x}0.weight"] = vec(e, 0.0, 0.5)
            w[p + f"time_mix_{x}1.weight"] = mat(ranks[x], e) * 0.5
            w[p + f"time_mix_{x}2.weight"] = mat(e, ranks[x]) * 0.5
        w[p + "time_mix_g1.weight"], w[p + "time_mix_g2.weight"] = mat(ranks["g"], e), mat(e, ranks["g"])
        w[p + "time_mix_lerp_fused.weight"] = torch.rand(6, 1, 1, e, generator=gen)
        w[p + "time_mix_k_k.weight"], w[p + "time_mix_k_a.weight"] = vec(e, 1.0, 0.2), vec(e, 1.0, 0.2)
        w[p + "time_mix_r_k.weight"] = vec(e, 0.0, 0.5)
        for name in ("key", "value", "receptance", "output"):
            w[p + f"time_mix_{name}.weight"] = mat(e, e)
        w[p + "channel_mix_lerp_k.weight"] = torch.rand(1, 1, e, generator=gen)
        w[p + "channel_mix_key.weight"], w[p + "channel_mix_value.weight"] = mat(ff, e), mat(e, ff)
    w["output_norm.weight"], w["output_norm.bias"] = vec(e, 1.0), vec(e)
    w["output.weight"] = mat(case.n_vocab, e)
    return w


def _qwen3next(case, meta, mat, vec, gen):
    """qwen3next, and Qwen3.5's qwen35 (dense FFNs) and qwen35moe: separate ssm_beta / ssm_alpha;
    the last nextn_predict_layers blocks are full-attention prediction blocks (nextn.* tensors)."""
    e, hd, n_exp = case.n_embd, case.head_dim, case.n_expert
    dk, hk, hv = meta["ssm.state_size"], meta["ssm.group_count"], meta["ssm.time_step_rank"]
    d_conv = meta["ssm.conv_kernel"]
    value_dim = meta["ssm.inner_size"]
    conv = 2 * dk * hk + value_dim
    ff, sh = meta.get("expert_feed_forward_length"), meta.get("expert_shared_feed_forward_length")
    n_trunk = case.n_layer - meta.get("nextn_predict_layers", 0)
    recurrent = meta.get("attention.recurrent_layers") or [
        il < n_trunk and (il + 1) % meta["full_attention_interval"] != 0 for il in range(case.n_layer)]
    w = {}
    for il in range(case.n_layer):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"], w[p + "post_attention_norm.weight"] = vec(e, 1.0), vec(e, 1.0)
        if il >= n_trunk:  # a prediction block: the previous hidden state and the next token's embedding
            w[p + "nextn.eh_proj.weight"] = mat(e, 2 * e)
            w[p + "nextn.enorm.weight"], w[p + "nextn.hnorm.weight"] = vec(e, 1.0), vec(e, 1.0)
        if recurrent[il]:
            if "legacy_qkvz" in case.features:  # one ssm_in: [q | k | v | z] per key head
                w[p + "ssm_in.weight"] = mat(conv + value_dim, e)
            else:
                w[p + "attn_qkv.weight"] = mat(conv, e)
                w[p + "attn_gate.weight"] = mat(value_dim, e)
            w[p + "ssm_conv1d.weight"] = mat(conv, d_conv)
            w[p + "ssm_dt.bias"] = vec(hv, 1.0, 0.5)
            w[p + "ssm_a"] = -torch.exp(torch.rand(hv, generator=gen) * 2.0 - 1.0)
            if case.arch == "qwen3next":
                w[p + "ssm_ba.weight"] = mat(2 * hv, e)
            else:
                w[p + "ssm_beta.weight"], w[p + "ssm_alpha.weight"] = mat(hv, e), mat(hv, e)
            w[p + "ssm_norm.weight"] = vec(dk, 1.0)
            w[p + "ssm_out.weight"] = mat(e, value_dim)
        else:
            w[p + "attn_q.weight"] = mat(2 * hd * case.n_head, e)
            w[p + "attn_k.weight"], w[p + "attn_v.weight"] = mat(hd * case.n_head_kv, e), mat(hd * case.n_head_kv, e)
            w[p + "attn_q_norm.weight"], w[p + "attn_k_norm.weight"] = vec(hd, 1.0), vec(hd, 1.0)
            w[p + "attn_output.weight"] = mat(e, hd * case.n_head)
        if case.arch == "qwen35":
            w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"] = mat(case.n_ff, e), mat(case.n_ff, e)
            w[p + "ffn_down.weight"] = mat(e, case.n_ff)
            continue
        w[p + "ffn_gate_inp.weight"] = mat(n_exp, e) * 4.0
        w[p + "ffn_gate_exps.weight"], w[p + "ffn_up_exps.weight"] = mat(n_exp, ff, e), mat(n_exp, ff, e)
        w[p + "ffn_down_exps.weight"] = mat(n_exp, e, ff)
        w[p + "ffn_gate_inp_shexp.weight"] = vec(e, 0.0, 0.5)
        w[p + "ffn_gate_shexp.weight"], w[p + "ffn_up_shexp.weight"] = mat(sh, e), mat(sh, e)
        w[p + "ffn_down_shexp.weight"] = mat(e, sh)
    w["output_norm.weight"] = vec(e, 1.0)
    w["output.weight"] = mat(case.n_vocab, e)
    return w


def _kimi_linear(case, meta, mat, vec, gen):
    """KDA layers (head_count_kv 0) and MLA layers (no query compression), a dense first layer, then
    sigmoid-routed experts with the selection bias and one shared expert."""
    e, nh, n_exp = case.n_embd, case.n_head, case.n_expert
    hd, d_conv = meta["kda.head_dim"], meta["ssm.conv_kernel"]
    d = hd * nh
    lora, rot = meta["attention.kv_lora_rank"], meta["rope.dimension_count"]
    k_mla, v_mla = meta["attention.key_length_mla"], meta["attention.value_length_mla"]
    ff = meta["expert_feed_forward_length"]
    w = {}
    for il in range(case.n_layer):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"], w[p + "ffn_norm.weight"] = vec(e, 1.0), vec(e, 1.0)
        if meta["attention.head_count_kv"][il] == 0:
            for x in "qkv":
                w[p + f"ssm_conv1d_{x}.weight"] = mat(1, d, 1, d_conv)  # ggml ne [d_conv, 1, d, 1]
                w[p + f"attn_{x}.weight"] = mat(d, e)
            w[p + "ssm_f_a.weight"], w[p + "ssm_f_b.weight"] = mat(hd, e), mat(d, hd)
            w[p + "ssm_beta.weight"] = mat(nh, e)
            w[p + "ssm_a"] = -torch.exp(torch.rand(1, 1, nh, 1, generator=gen) * 2.0 - 1.0)
            w[p + "ssm_dt.bias"] = vec(d, 1.0, 0.5)
            w[p + "ssm_g_a.weight"], w[p + "ssm_g_b.weight"] = mat(hd, e), mat(d, hd)
            w[p + "ssm_norm.weight"] = vec(hd, 1.0)
            w[p + "attn_output.weight"] = mat(e, d)
        else:
            w[p + "attn_q.weight"] = mat(nh * k_mla, e)
            w[p + "attn_kv_a_norm.weight"] = vec(lora, 1.0)
            w[p + "attn_kv_a_mqa.weight"] = mat(lora + rot, e)
            w[p + "attn_k_b.weight"] = mat(nh, lora, k_mla - rot)
            w[p + "attn_v_b.weight"] = mat(nh, v_mla, lora)
            w[p + "attn_output.weight"] = mat(e, nh * v_mla)
        if il < meta["leading_dense_block_count"]:
            w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"] = mat(case.n_ff, e), mat(case.n_ff, e)
            w[p + "ffn_down.weight"] = mat(e, case.n_ff)
            continue
        w[p + "ffn_gate_inp.weight"] = mat(n_exp, e) * 4.0
        w[p + "exp_probs_b.bias"] = vec(n_exp, 0.0, 0.05)
        w[p + "ffn_gate_exps.weight"], w[p + "ffn_up_exps.weight"] = mat(n_exp, ff, e), mat(n_exp, ff, e)
        w[p + "ffn_down_exps.weight"] = mat(n_exp, e, ff)
        w[p + "ffn_gate_shexp.weight"], w[p + "ffn_up_shexp.weight"] = mat(ff, e), mat(ff, e)
        w[p + "ffn_down_shexp.weight"] = mat(e, ff)
    w["output_norm.weight"] = vec(e, 1.0)
    w["output.weight"] = mat(case.n_vocab, e)
    return w
