"""The tensors of the tiny encoders (bert, nomic-bert, jina-bert-v2): seeded random weights with
the shapes llama.cpp loads, scaled so activations stay O(1). Features: pos_embd (learned
positions), qkv_bias, fused_qkv, moe (experts on the layers il % moe_every_n_layers == 1), gated (ffn_gate: nomic-bert's SwiGLU), fused_up (jina's
[up | gate]), ffn_bias, cls (the dense classifier layer), cls_out (the score projection),
norm_2 (jina's second attention norm), qk_norm (jina's LayerNorms on q and k)."""
from __future__ import annotations

import torch

ENCODER_ARCHS = ("bert", "jina-bert-v3", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "modern-bert", "neo-bert", "eurobert")
PRENORM_ARCHS = ("modern-bert", "neo-bert", "eurobert")
N_TOKEN_TYPES = 2


def encoder_tensors(case, gen: torch.Generator) -> dict[str, torch.Tensor]:
    f, e, ff, v = case.features, case.n_embd, case.n_ff, case.n_vocab
    kv = case.head_dim * case.n_head_kv

    def mat(*shape):
        return torch.randn(*shape, generator=gen) / shape[-1] ** 0.5

    def vec(n, mean=0.0, std=0.1):
        return mean + std * torch.randn(n, generator=gen)

    if case.arch in PRENORM_ARCHS:
        return prenorm_tensors(case, mat, vec)
    w = {"token_embd.weight": torch.randn(v, e, generator=gen),
         "token_types.weight": torch.randn(N_TOKEN_TYPES, e, generator=gen) * 0.5,
         "token_embd_norm.weight": vec(e, 1.0), "token_embd_norm.bias": vec(e)}
    if "pos_embd" in f:
        w["position_embd.weight"] = torch.randn(case.n_ctx, e, generator=gen) * 0.5
    if "cls" in f:  # jina's head has one output and no cls.output
        n_cls = e if "cls_out" in f else 1
        w["cls.weight"], w["cls.bias"] = mat(n_cls, e) * 2.0, vec(n_cls)
    if "cls_out" in f:
        w["cls.output.weight"], w["cls.output.bias"] = mat(1, e), vec(1)
    for il in range(case.n_layer):
        p = f"blk.{il}."
        if "fused_qkv" in f:
            w[p + "attn_qkv.weight"] = mat(e + 2 * kv, e)
        else:
            w[p + "attn_q.weight"], w[p + "attn_k.weight"], w[p + "attn_v.weight"] = mat(e, e), mat(kv, e), mat(kv, e)
        if "qkv_bias" in f:
            w[p + "attn_q.bias"], w[p + "attn_k.bias"], w[p + "attn_v.bias"] = vec(e), vec(kv), vec(kv)
        if "qk_norm" in f:
            w[p + "attn_q_norm.weight"], w[p + "attn_q_norm.bias"] = vec(e, 1.0), vec(e)
            w[p + "attn_k_norm.weight"], w[p + "attn_k_norm.bias"] = vec(kv, 1.0), vec(kv)
        w[p + "attn_output.weight"] = mat(e, e)
        if "ffn_bias" in f:
            w[p + "attn_output.bias"] = vec(e)
        w[p + "attn_output_norm.weight"], w[p + "attn_output_norm.bias"] = vec(e, 1.0), vec(e)
        if "norm_2" in f:
            w[p + "attn_norm_2.weight"], w[p + "attn_norm_2.bias"] = vec(e, 1.0), vec(e)
        if "moe" in f and il % int(dict(case.metadata)["moe_every_n_layers"]) == 1:
            n = case.n_expert
            w[p + "ffn_up_exps.weight"], w[p + "ffn_down_exps.weight"] = mat(n, ff, e), mat(n, e, ff)
            w[p + "ffn_gate_inp.weight"] = mat(n, e) * 4.0  # a router with clear preferences
            w[p + "layer_output_norm.weight"], w[p + "layer_output_norm.bias"] = vec(e, 1.0), vec(e)
            continue
        w[p + "ffn_up.weight"] = mat(2 * ff if "fused_up" in f else ff, e)
        if "gated" in f:
            w[p + "ffn_gate.weight"] = mat(ff, e)
        w[p + "ffn_down.weight"] = mat(e, ff)
        if "ffn_bias" in f:
            w[p + "ffn_up.bias"], w[p + "ffn_down.bias"] = vec(w[p + "ffn_up.weight"].shape[0]), vec(e)
        w[p + "layer_output_norm.weight"], w[p + "layer_output_norm.bias"] = vec(e, 1.0), vec(e)
    return w


def prenorm_tensors(case, mat, vec) -> dict[str, torch.Tensor]:
    """The pre-norm encoders (modern-bert, neo-bert, eurobert): no biases, no token types; a
    fused qkv (or q/k/v apart: eurobert) and [gate | up] (or ffn_gate apart: eurobert), a final
    norm; modern-bert's token-embedding norm, no attention norm before its layer 0, and its
    reranker head cls, cls.norm, cls.output; neo-bert's cls (+ bias), cls.output."""
    e, ff, f, kv = case.n_embd, case.n_ff, case.features, case.head_dim * case.n_head_kv
    modern = case.arch == "modern-bert"
    w = {"token_embd.weight": mat(case.n_vocab, e) * e ** 0.5}
    if modern:
        w["token_embd_norm.weight"] = vec(e, 1.0)
    w["enc.output_norm.weight" if case.arch == "neo-bert" else "output_norm.weight"] = vec(e, 1.0)
    for il in range(case.n_layer):
        p = f"blk.{il}."
        if il or not modern:
            w[p + "attn_norm.weight"] = vec(e, 1.0)
        if "fused_qkv" in f:
            w[p + "attn_qkv.weight"] = mat(e + 2 * kv, e)
        else:
            w[p + "attn_q.weight"], w[p + "attn_k.weight"], w[p + "attn_v.weight"] = mat(e, e), mat(kv, e), mat(kv, e)
        w[p + "attn_output.weight"] = mat(e, e)
        w[p + "ffn_norm.weight"] = vec(e, 1.0)
        w[p + "ffn_up.weight"] = mat(2 * ff if "fused_up" in f else ff, e)
        if "fused_up" not in f:
            w[p + "ffn_gate.weight"] = mat(ff, e)
        w[p + "ffn_down.weight"] = mat(e, ff)
    if "cls" in f:
        w["cls.weight"] = mat(e, e) * 2.0
        w["cls.norm.weight" if modern else "cls.bias"] = vec(e, 1.0 if modern else 0.0)
    if "cls_out" in f:
        w["cls.output.weight"], w["cls.output.bias"] = mat(1, e), vec(1)
    return w
