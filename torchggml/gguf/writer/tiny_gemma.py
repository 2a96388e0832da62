"""The tensors of the tiny Gemma 4 / Gemma 3n models (tiny.py's cases whose architecture is in
GEMMA_ARCHS): seeded random weights with the shapes llama.cpp loads for them, their layers of
several shapes read from the case's keys (windowed layers' head size, KV heads and FFN width per
layer, layers sharing an earlier layer's KV cache, per-layer token embeddings).

Features: "moe" puts experts (beside the dense FFN) on the dense-attention layers, "v_is_k"
leaves attn_v out of them (V is K, as Gemma 4's full-attention layers with attention_k_eq_v).
"""
from __future__ import annotations

import torch

GEMMA_ARCHS = ("gemma4", "gemma3n")
# gemma3n's sizes that llama.cpp fixes rather than reads (as models/archs/gemma3n.py): AltUp
# streams, LAuReL rank, per-layer embedding width
N_ALTUP, LAUREL_RANK, N_EMBD_ALTUP = 4, 64, 256


def _per_layer(meta: dict, key: str, default, n: int) -> list:
    value = meta.get(key, default)
    return list(value) if isinstance(value, tuple) else [value] * n


def gemma_tensors(case, gen: torch.Generator) -> dict[str, torch.Tensor]:
    if case.arch == "gemma3n":
        return gemma3n_tensors(case, gen)
    meta, n_layer, e, f = dict(case.metadata), case.n_layer, case.n_embd, case.features

    def mat(*shape):
        return torch.randn(*shape, generator=gen) / shape[-1] ** 0.5

    def vec(n, mean=0.0, std=0.1):
        return mean + std * torch.randn(n, generator=gen)

    swa = [bool(v) for v in meta["attention.sliding_window_pattern"]]
    n_kv = _per_layer(meta, "attention.head_count_kv", case.n_head_kv, n_layer)
    n_ff = _per_layer(meta, "feed_forward_length", case.n_ff, n_layer)
    n_layer_kv = n_layer - int(meta.get("attention.shared_kv_layers", 0))
    npl = int(meta.get("embedding_length_per_layer_input", 0))
    w = {"token_embd.weight": torch.randn(case.n_vocab, e, generator=gen)}
    if npl:
        w["per_layer_token_embd.weight"] = torch.randn(case.n_vocab, npl * n_layer, generator=gen)
        w["per_layer_model_proj.weight"] = mat(npl * n_layer, e)
        w["per_layer_proj_norm.weight"] = vec(npl, 1.0)
    w["rope_freqs.weight"] = 1.0 + torch.rand(case.head_dim // 2, generator=gen) * 3.0
    for il in range(n_layer):
        p = f"blk.{il}."
        hd = int(meta["attention.key_length_swa"]) if swa[il] else case.head_dim
        w[p + "attn_norm.weight"] = vec(e, 1.0)
        w[p + "attn_q.weight"] = mat(hd * case.n_head, e)
        w[p + "attn_q_norm.weight"] = vec(hd, 1.0)
        if il < n_layer_kv:
            w[p + "attn_k.weight"] = mat(hd * n_kv[il], e)
            w[p + "attn_k_norm.weight"] = vec(hd, 1.0)
            if swa[il] or "v_is_k" not in f:
                w[p + "attn_v.weight"] = mat(hd * n_kv[il], e)
        w[p + "attn_output.weight"] = mat(e, hd * case.n_head)
        w[p + "post_attention_norm.weight"] = vec(e, 1.0)
        w[p + "layer_output_scale.weight"] = 0.5 + torch.rand(1, generator=gen)
        w[p + "ffn_norm.weight"] = vec(e, 1.0)
        w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"] = mat(n_ff[il], e), mat(n_ff[il], e)
        w[p + "ffn_down.weight"] = mat(e, n_ff[il])
        w[p + "post_ffw_norm.weight"] = vec(e, 1.0)
        if "moe" in f and not swa[il]:
            n, ff = case.n_expert, int(meta["expert_feed_forward_length"])
            w[p + "ffn_gate_inp.weight"] = mat(n, e) * 4.0
            w[p + "ffn_gate_inp.scale"] = vec(e, 1.0)
            for name in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
                w[p + name + ".weight"] = vec(e, 1.0)
            w[p + "ffn_gate_exps.weight"], w[p + "ffn_up_exps.weight"] = mat(n, ff, e), mat(n, ff, e)
            w[p + "ffn_down_exps.weight"] = mat(n, e, ff)
            w[p + "ffn_down_exps.scale"] = 0.5 + torch.rand(n, generator=gen)
        if npl:
            w[p + "inp_gate.weight"], w[p + "proj.weight"] = mat(npl, e), mat(e, npl)
            w[p + "post_norm.weight"] = vec(e, 1.0)
    w["output_norm.weight"] = vec(e, 1.0)
    return w


def gemma3n_tensors(case, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """gemma3n's tensors: llama.cpp fixes 4 AltUp streams, LAuReL rank 64 and per-layer embeddings
    of 256 values; AltUp's coefficients are small, so the streams stay close to the active one."""
    e, n_layer, ff, hd = case.n_embd, case.n_layer, case.n_ff, case.head_dim
    q, kv = hd * case.n_head, hd * case.n_head_kv

    def mat(*shape):
        return torch.randn(*shape, generator=gen) / shape[-1] ** 0.5

    def vec(n, mean=0.0, std=0.1):
        return mean + std * torch.randn(n, generator=gen)

    w = {"token_embd.weight": torch.randn(case.n_vocab, e, generator=gen),
         "altup_proj.weight": mat(N_ALTUP - 1, e, e), "altup_unembd_proj.weight": mat(N_ALTUP - 1, e, e),
         "per_layer_token_embd.weight": torch.randn(case.n_vocab, N_EMBD_ALTUP * n_layer, generator=gen),
         "per_layer_model_proj.weight": mat(N_EMBD_ALTUP * n_layer, e),
         "per_layer_proj_norm.weight": vec(N_EMBD_ALTUP, 1.0), "output_norm.weight": vec(e, 1.0)}
    for il in range(n_layer):
        p = f"blk.{il}."
        for name in ("attn_norm", "ffn_norm", "altup_router_norm", "altup_correct_scale"):
            w[p + name + ".weight"] = vec(e, 1.0)
        for name in ("post_attention_norm", "post_ffw_norm", "post_norm", "laurel_post_norm"):
            w[p + name + ".weight"] = vec(e, 0.3, 0.03)  # small branches: 22 random layers stay tame
        w[p + "attn_q.weight"], w[p + "attn_k.weight"], w[p + "attn_v.weight"] = mat(q, e), mat(kv, e), mat(kv, e)
        w[p + "attn_q_norm.weight"], w[p + "attn_k_norm.weight"] = vec(hd, 1.0), vec(hd, 1.0)
        w[p + "attn_output.weight"] = mat(e, q)
        w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"], w[p + "ffn_down.weight"] = mat(ff, e), mat(ff, e), mat(e, ff)
        w[p + "inp_gate.weight"], w[p + "proj.weight"] = mat(N_EMBD_ALTUP, e), mat(e, N_EMBD_ALTUP)
        w[p + "altup_correct_coef.weight"] = vec(N_ALTUP * N_ALTUP, 0.0, 0.1).reshape(N_ALTUP, N_ALTUP)
        w[p + "altup_predict_coef.weight"] = vec(N_ALTUP ** 3, 0.0, 0.1).reshape(N_ALTUP * N_ALTUP, N_ALTUP)
        w[p + "altup_router.weight"] = mat(N_ALTUP, e)
        w[p + "laurel_l.weight"], w[p + "laurel_r.weight"] = mat(LAUREL_RANK, e), mat(e, LAUREL_RANK)
    return w
