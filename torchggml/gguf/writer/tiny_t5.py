"""The tensors of the tiny T5 models (tiny.py's cases whose architecture is in T5_ARCHS): seeded
random weights with the shapes llama.cpp loads for t5 (encoder enc.* and decoder dec.* layers,
cross-attention) and t5encoder (the encoder only). The relative position bias is in layer 0 only,
as in T5 checkpoints (the other layers use it); feature "gated": flan-T5's GELU-gated FFN, else
T5's ReLU MLP.
"""
from __future__ import annotations

import torch

T5_ARCHS = ("t5", "t5encoder")


def t5_tensors(case, gen: torch.Generator) -> dict[str, torch.Tensor]:
    meta, e, f = dict(case.metadata), case.n_embd, case.features
    q, kv, n_buckets = case.head_dim * case.n_head, case.head_dim * case.n_head_kv, int(meta["attention.relative_buckets_count"])

    def mat(*shape):
        return torch.randn(*shape, generator=gen) / shape[-1] ** 0.5

    def vec(n, mean=0.0, std=0.1):
        return mean + std * torch.randn(n, generator=gen)

    w = {"token_embd.weight": torch.randn(case.n_vocab, e, generator=gen)}
    stacks = [("enc", ("attn",))] + ([("dec", ("attn", "cross_attn"))] if case.arch == "t5" else [])
    for prefix, parts in stacks:
        for il in range(case.n_layer):
            p = f"{prefix}.blk.{il}."
            for part in parts:
                w[p + part + "_norm.weight"] = vec(e, 1.0)
                w[p + part + "_q.weight"], w[p + part + "_k.weight"] = mat(q, e), mat(kv, e)
                w[p + part + "_v.weight"], w[p + part + "_o.weight"] = mat(kv, e), mat(e, q)
            if il == 0:
                w[p + "attn_rel_b.weight"] = vec(case.n_head * n_buckets, 0.0, 0.3).reshape(n_buckets, case.n_head)
            w[p + "ffn_norm.weight"] = vec(e, 1.0)
            if "gated" in f:
                w[p + "ffn_gate.weight"] = mat(case.n_ff, e)
            w[p + "ffn_up.weight"], w[p + "ffn_down.weight"] = mat(case.n_ff, e), mat(e, case.n_ff)
        w[f"{prefix}.output_norm.weight"] = vec(e, 1.0)
    if "tied" not in f:
        w["output.weight"] = mat(case.n_vocab, e)
    return w
