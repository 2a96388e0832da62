"""Qwen3.5 (qwen35: dense FFNs; qwen35moe: experts and a sigmoid-gated shared expert): Qwen3-Next's
hybrid of gated delta-net linear attention and gated full attention, with three differences.

beta and alpha have their own projections (ssm_beta, ssm_alpha: one value per value head, in
order) instead of one ssm_ba grouped by key head; with fewer key heads than value heads, value head
h reads key head h % n_key_heads (tiled, as ggml_repeat and the fused op broadcast) where
Qwen3-Next repeats each key head over consecutive value heads; the full-attention layers rotate
q and k by interleaved multi-axis RoPE over rope.dimension_sections (text tokens: every axis at
the token's position). The multi-token-prediction blocks (nextn_predict_layers) are skipped.
"""
from __future__ import annotations

from ... import ops
from ...ops.rope import ROPE_TYPE_IMROPE
from ..builder import load_ffn
from .qwen3next import Qwen3Next
from .qwen_vl import read_sections


class Qwen35(Qwen3Next):
    names = ("qwen35",)
    rope_type = ROPE_TYPE_IMROPE
    tiled_heads = True

    def read_hparams(self, hp, keys):
        super().read_hparams(hp, keys)
        read_sections(hp, keys)

    def load_gates(self, L, hp):
        L.weight("ssm_beta", [hp.n_embd, hp.ssm.dt_rank])
        L.weight("ssm_alpha", [hp.n_embd, hp.ssm.dt_rank])

    def gates(self, b, h, layer):
        ctx, hv, nt, ns = b.ctx, b.hp.ssm.dt_rank, b.n_seq_tokens, b.n_seqs
        beta = ops.reshape_4d(ctx, ops.sigmoid(ctx, b.linear(h, layer.ssm_beta)), 1, hv, nt, ns)
        return beta, ops.reshape_3d(ctx, b.linear(h, layer.ssm_alpha), hv, nt, ns)

    def load_ffn(self, L, hp):
        load_ffn(L, hp, norm=False)

    def ffn(self, b, h, layer):
        return b.ffn(h, layer)


class Qwen35Moe(Qwen35):
    names = ("qwen35moe",)
    load_ffn = Qwen3Next.load_ffn
    ffn = Qwen3Next.ffn


ARCHS = [Qwen35(), Qwen35Moe()]
