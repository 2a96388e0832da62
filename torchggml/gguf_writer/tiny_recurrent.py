"""The tensors of the tiny recurrent and hybrid models (tiny.py's cases whose architecture is in
RECURRENT_ARCHS): seeded random weights with the shapes llama.cpp loads, scaled so activations
stay O(1) and the recurrences decay (A < 0, decays in (0, 1)).

Layer kinds (case.metadata "layer_kinds", one letter per layer): "m" a Mamba/Mamba-2 mixer, "a"
attention, "f" both in parallel (falcon-h1); hybrids without that key take the architecture's own
rule from the keys llama.cpp reads (head_count_kv 0 marks a recurrent layer).
"""
from __future__ import annotations

import numpy as np
import torch

RECURRENT_ARCHS = ("mamba", "mamba2")

# written as F32 whatever the weight type (the ops read them as F32; llama.cpp's quantizer keeps
# them too): convolutions, decays, skip weights, norms
F32_SUFFIXES = ("ssm_conv1d.weight", ".ssm_a", ".ssm_d", "norm.weight")


def keep_f32(name: str, data: np.ndarray) -> bool:
    """Recurrent tensors that stay F32, and rows no 32-value block divides."""
    return name.endswith(F32_SUFFIXES) or data.shape[-1] % 32 != 0


def recurrent_tensors(case, gen: torch.Generator) -> dict[str, torch.Tensor]:
    meta = dict(case.metadata)
    e, v = case.n_embd, case.n_vocab

    def mat(*shape):
        return torch.randn(*shape, generator=gen) / shape[-1] ** 0.5

    def vec(n, mean=0.0, std=0.1):
        return mean + std * torch.randn(n, generator=gen)

    w = {"token_embd.weight": torch.randn(v, e, generator=gen)}
    for il in range(case.n_layer):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"] = vec(e, 1.0)
        if case.arch == "mamba":
            w.update(_mamba(p, meta, e, mat, vec, gen))
        elif case.arch == "mamba2":
            w.update(_mamba2(p, meta, e, mat, vec, gen))
    w["output_norm.weight"] = vec(e, 1.0)
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
