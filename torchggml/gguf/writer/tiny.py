"""Tiny models of every architecture with seeded random weights, for the golden tests.

Each case (TINY_CASES) is a few-layer model of one architecture (dim 64, vocab 256, no
tokenizer: token ids only) exercising that architecture's features: experts, shared experts,
sliding windows, soft-capping, post-norms, fused projections, rope scaling. `write_tiny_model`
writes it deterministically (same bytes for the same case, weight type and torch version), so a
test can regenerate the file llama.cpp's reference logits came from and check its hash.
scripts/gen_arch_logits.py writes the reference logits; tests/test_archs.py compares.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import numpy as np
import torch

from .demo import add_vocab, write_tensors
from . import tiny_encoders, tiny_gemma, tiny_recurrent, tiny_t5

TINY_SEED = 20241123


@dataclass(frozen=True)
class TinyCase:
    name: str                     # case id, e.g. "llama-moe"
    arch: str                     # general.architecture
    features: frozenset = frozenset()
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 128
    n_vocab: int = 256
    n_ctx: int = 256
    n_expert: int = 0
    n_expert_used: int = 0
    metadata: tuple = ()          # extra (key suffix, value) pairs under "{arch}."
    global_metadata: tuple = ()   # extra (key, value) pairs of no architecture ("xielu.beta")
    weight_types: tuple = ("F32", "Q8_0")
    tokens: tuple = (1, 17, 200, 3, 77, 129, 45, 12, 0, 255, 64, 9, 128, 31, 250, 6, 99, 180, 2, 51)
    n_prompt: int = 14            # decode-step tests: this many in one call, then one at a time
    n_encoder: int = 0            # encoder-decoder (t5): the first n_encoder tokens are the encoder's input


def _case(name, arch, features=(), **kw):
    return TinyCase(name, arch, frozenset(features), **kw)


# features: moe (ffn_gate_inp + *_exps), shexp (shared expert with sigmoid gate), qkv_bias,
# qk_norm, tied (no output.weight), post_norms, fused_qkv, fused_up (phi3's [gate | up]),
# sinks, moe_biases, rope_factors (long/short), out_bias, ffn_post_attn_norm (gpt-oss: no
# ffn_norm, post_attention_norm feeds the FFN), layernorm (LayerNorm eps key), norm_bias,
# ungated and ffn_bias (starcoder2's FFN), parallel (command-r: no ffn_norm). Weight type MXFP4
# applies to the experts only (as in gpt-oss files); the other matrices stay F32.
TINY_CASES = [
    _case("llama-moe", "llama", ["moe"], n_expert=4, n_expert_used=2, weight_types=("F32", "F16", "Q8_0", "Q4_0")),
    _case("llama-yarn", "llama", [], metadata=(("rope.scaling.type", "yarn"), ("rope.scaling.factor", 4.0),
                                              ("rope.scaling.original_context_length", 64))),
    _case("qwen2moe", "qwen2moe", ["moe", "shexp", "qkv_bias"], n_expert=4, n_expert_used=2,
          metadata=(("expert_feed_forward_length", 32), ("expert_shared_feed_forward_length", 96))),
    _case("qwen3moe", "qwen3moe", ["moe", "qk_norm"], n_expert=4, n_expert_used=2,
          metadata=(("expert_feed_forward_length", 64),)),
    _case("gemma", "gemma", ["tied"], head_dim=32),
    _case("gemma2", "gemma2", ["tied", "post_norms"], metadata=(
        ("attention.sliding_window", 4), ("attn_logit_softcapping", 5.0), ("final_logit_softcapping", 3.0))),
    _case("gemma3", "gemma3", ["qk_norm", "post_norms"], n_layer=3, metadata=(
        ("attention.sliding_window", 4), ("attention.sliding_window_pattern", (True, False, True)), ("rope.freq_base", 1000000.0), ("rope.scaling.type", "linear"),
        ("rope.scaling.factor", 2.0)), weight_types=("F32", "F16", "Q8_0", "Q4_0")),
    _case("phi3", "phi3", ["fused_qkv", "fused_up", "rope_factors"], n_head_kv=4, metadata=(
        ("rope.scaling.attn_factor", 1.19), ("rope.scaling.original_context_length", 32))),
    _case("gpt-oss", "gpt-oss", ["moe", "moe_biases", "qkv_bias", "out_bias", "sinks", "ffn_post_attn_norm"],
          n_expert=4, n_expert_used=2, weight_types=("F32", "MXFP4"), metadata=(
              ("expert_feed_forward_length", 64), ("attention.sliding_window", 4),
              ("rope.scaling.type", "yarn"), ("rope.scaling.factor", 4.0),
              ("rope.scaling.original_context_length", 64))),
    _case("mistral3", "mistral3", [], metadata=(
        ("rope.freq_base", 1000000.0), ("rope.scaling.type", "yarn"), ("rope.scaling.factor", 8.0),
        ("rope.scaling.original_context_length", 8), ("rope.scaling.yarn_beta_fast", 16.0),
        ("rope.scaling.yarn_beta_slow", 2.0), ("rope.scaling.yarn_log_multiplier", 0.5),
        ("attention.temperature_scale", 0.2))),
    _case("starcoder2", "starcoder2", ["layernorm", "norm_bias", "qkv_bias", "out_bias", "ungated", "ffn_bias"]),
    _case("command-r", "command-r", ["layernorm", "parallel", "tied"], metadata=(("logit_scale", 0.5),)),
]

# issue 37: dense decoder variants. no_attn_norm / no_ffn_norm: no norm before attention / the
# FFN; qk_norm_full: q/k norms over all the heads together; shexp_ungated: a shared expert
# without ffn_gate_inp_shexp.
TINY_CASES += [
    _case("granite", "granite", [], metadata=(
        ("logit_scale", 4.0), ("residual_scale", 0.5), ("embedding_scale", 2.0), ("attention.scale", 0.2))),
    _case("granitemoe", "granitemoe", ["moe", "shexp", "shexp_ungated"], n_expert=4, n_expert_used=2, metadata=(
        ("logit_scale", 4.0), ("residual_scale", 0.5), ("embedding_scale", 2.0), ("attention.scale", 0.2),
        ("expert_shared_feed_forward_length", 64))),
    _case("olmo2", "olmo2", ["no_attn_norm", "no_ffn_norm", "qk_norm_full", "post_norms"]),
    _case("olmo2-swa", "olmo2", ["no_attn_norm", "no_ffn_norm", "qk_norm_full", "post_norms"], n_layer=4,
          weight_types=("F32",), metadata=(("attention.sliding_window", 4), ("rope.freq_base_swa", 1000.0))),
    _case("smollm3", "smollm3", [], n_layer=4),
    _case("exaone4", "exaone4", ["no_attn_norm", "no_ffn_norm", "qk_norm", "post_norms"]),
    _case("cohere2", "cohere2", ["layernorm", "parallel", "tied"], n_layer=4, metadata=(
        ("logit_scale", 0.5), ("attention.sliding_window", 4))),
]

# LayerNorm families: pos_embd (learned position embeddings), qkv_fused_bias (attn_qkv.bias),
# head_bias (output.bias), qk_norm_per_head ([head_dim, n_head] q/k norms), norm_2 (falcon's
# attn_norm_2); rope.dimension_count 8 of 16: partial rotary embedding
_GPT = ["layernorm", "norm_bias", "out_bias", "ungated", "ffn_bias"]
_PARTIAL = (("rope.dimension_count", 8),)
TINY_CASES += [
    _case("gpt2", "gpt2", _GPT + ["fused_qkv", "qkv_fused_bias", "pos_embd", "tied"], n_head_kv=4),
    _case("starcoder", "starcoder", _GPT + ["fused_qkv", "qkv_fused_bias", "pos_embd"], n_head_kv=1),
    _case("phi2", "phi2", _GPT + ["parallel", "qkv_bias", "head_bias"], n_head_kv=4, metadata=_PARTIAL),
    _case("gptneox", "gptneox", _GPT + ["fused_qkv", "qkv_fused_bias"], n_head_kv=4,
          metadata=_PARTIAL + (("use_parallel_residual", True),)),
    _case("gptneox-seq", "gptneox", _GPT + ["fused_qkv", "qkv_fused_bias"], n_head_kv=4, weight_types=("F32",),
          metadata=_PARTIAL + (("use_parallel_residual", False),)),
    _case("falcon", "falcon", ["layernorm", "norm_bias", "parallel", "fused_qkv", "ungated"], n_head_kv=1),
    _case("falcon-40b", "falcon", ["layernorm", "norm_bias", "parallel", "fused_qkv", "ungated", "norm_2"],
          weight_types=("F32",)),
    _case("stablelm", "stablelm", ["layernorm", "norm_bias", "qkv_bias", "qk_norm_per_head"], metadata=_PARTIAL),
    _case("stablelm-parallel", "stablelm", ["layernorm", "norm_bias", "parallel"], weight_types=("F32",),
          metadata=_PARTIAL),
]

# llama-like layers with their variations (ffn_post_attn_norm: post_attention_norm is the FFN's
# input norm; fused_up + post_norms: glm4; rope.dimension_sections: multi-axis RoPE)
TINY_CASES += [
    _case("internlm2", "internlm2"),
    _case("ernie4_5", "ernie4_5"),
    _case("seed_oss", "seed_oss", ["ffn_post_attn_norm", "qkv_bias"]),
    _case("glm4", "glm4", ["fused_up", "post_norms"], metadata=_PARTIAL),
    _case("apertus", "apertus", ["qk_norm", "ungated"], global_metadata=(
        ("xielu.alpha_n", (0.8, 1.2)), ("xielu.alpha_p", (0.6, 0.9)), ("xielu.beta", 0.5), ("xielu.eps", -1e-6))),
    _case("qwen2vl", "qwen2vl", ["qkv_bias"], metadata=(("rope.dimension_sections", (2, 3, 3, 0)),)),
    _case("qwen3vl", "qwen3vl", ["qk_norm"], metadata=(("rope.dimension_sections", (3, 3, 2, 0)),)),
]

# mixtures of experts (probs_bias: exp_probs_b.bias; leading_dense_block_count: dense FFNs first)
TINY_CASES += [
    _case("olmoe", "olmoe", ["moe", "qk_norm_full"], n_head_kv=4, n_expert=4, n_expert_used=2),  # k norm: n_embd wide
    _case("phimoe", "phimoe", ["moe", "norm_bias", "qkv_bias", "out_bias", "head_bias", "rope_factors"],
          n_expert=4, n_expert_used=2, metadata=(("rope.scaling.original_context_length", 32),)),
    _case("hunyuan-dense", "hunyuan-dense", ["qk_norm"], metadata=(("rope.scaling.alpha", 1.5),)),
    _case("hunyuan-moe", "hunyuan-moe", ["moe", "shexp", "shexp_ungated", "qk_norm"], n_expert=4,
          n_expert_used=2, metadata=(("expert_shared_feed_forward_length", 64), ("expert_feed_forward_length", 128))),
    _case("ernie4_5-moe", "ernie4_5-moe", ["moe", "shexp", "shexp_ungated", "probs_bias"], n_layer=3,
          n_expert=4, n_expert_used=2, metadata=(
              ("leading_dense_block_count", 1), ("interleave_moe_layer_step", 1), ("expert_feed_forward_length", 64),
              ("expert_shared_feed_forward_length", 64))),
    _case("qwen3vlmoe", "qwen3vlmoe", ["moe", "qk_norm"], n_expert=4, n_expert_used=2, metadata=(
        ("expert_feed_forward_length", 64), ("rope.dimension_sections", (3, 3, 2, 0)))),
]

# more llama-like layers (models/archs/dense.py)
TINY_CASES += [
    _case("xverse", "xverse"),
    _case("exaone", "exaone"),
    _case("maincoder", "maincoder", ["qk_norm"]),
    _case("orion", "orion", ["layernorm", "norm_bias"]),
    _case("arcee", "arcee", ["ungated"]),
    _case("nemotron", "nemotron", ["layernorm", "norm_bias", "ungated", "ffn_bias", "out_bias"], metadata=_PARTIAL),
    _case("olmo", "olmo", ["layernorm", "no_norms", "tied"], metadata=(("attention.clamp_kqv", 1.5),)),
    _case("deepseek", "deepseek", ["moe", "shexp", "shexp_ungated"], n_layer=3, n_expert=4, n_expert_used=2,
          metadata=(("leading_dense_block_count", 1), ("expert_feed_forward_length", 32), ("expert_shared_count", 2),
                    ("expert_shared_feed_forward_length", 64), ("expert_weights_scale", 1.5))),
]

# router_f32: the router ffn_gate_inp stays F32 in quantized files, as llama.cpp's quantize leaves
# it; a quantized sigmoid router flips near-tied experts of a token or two (measured: 37% and 27%
# error on one token of deepseek2 and minimax-m2 in Q8_0, every other token near 2%)
# DeepSeek-style routing (expert_shared_feed_forward_length: the width the writer gives the shared
# experts, expert_shared_count x expert_feed_forward_length as the architecture reads them)
_GLM4MOE = (("leading_dense_block_count", 1), ("expert_feed_forward_length", 64), ("expert_shared_count", 1),
            ("expert_shared_feed_forward_length", 64), ("expert_weights_norm", True),
            ("expert_weights_scale", 2.5), ("expert_gating_func", 2)) + _PARTIAL
TINY_CASES += [
    _case("glm4moe", "glm4moe", ["moe", "shexp", "shexp_ungated", "probs_bias", "ffn_post_attn_norm", "qk_norm",
                                 "router_f32"],
          n_layer=3, n_expert=4, n_expert_used=2, metadata=_GLM4MOE),
    _case("glm4moe-groups", "glm4moe", ["moe", "shexp", "shexp_ungated", "probs_bias", "ffn_post_attn_norm"],
          n_layer=3, n_expert=8, n_expert_used=2, weight_types=("F32",),
          metadata=_GLM4MOE + (("expert_group_count", 4), ("expert_group_used_count", 2))),
]

# multi-head latent attention: its cache holds kv_lora_rank 32 + rope 8 values a token (one K/V
# head: key_length 40, value_length 32); the heads' nope part 32 + rope 8 (key_length_mla 40)
_MLA = (("attention.q_lora_rank", 32), ("attention.kv_lora_rank", 32), ("attention.key_length_mla", 40),
        ("attention.value_length_mla", 16), ("rope.dimension_count", 8), ("attention.key_length", 40),
        ("attention.value_length", 32), ("attention.head_count_kv", 1))
_DEEPSEEK = _MLA + (("leading_dense_block_count", 1), ("expert_feed_forward_length", 32),
                    ("expert_shared_count", 1), ("expert_shared_feed_forward_length", 32),
                    ("expert_weights_norm", True), ("expert_weights_scale", 2.5), ("expert_gating_func", 2))
TINY_CASES += [
    _case("deepseek2", "deepseek2", ["mla", "moe", "shexp", "shexp_ungated", "probs_bias", "router_f32"], n_layer=3,
          n_expert=8, n_expert_used=2, metadata=_DEEPSEEK),
    _case("deepseek2-groups", "deepseek2", ["mla", "moe", "shexp", "shexp_ungated", "probs_bias", "router_f32"],
          n_layer=3, n_expert=8, n_expert_used=2, weight_types=("F32",),
          metadata=_DEEPSEEK + (("expert_group_count", 4), ("expert_group_used_count", 2))),
    _case("deepseek2-yarn", "deepseek2", ["mla", "moe", "shexp", "shexp_ungated"], n_layer=3, n_expert=4,
          n_expert_used=2, weight_types=("F32",), metadata=_MLA + (
              ("leading_dense_block_count", 1), ("expert_feed_forward_length", 32), ("expert_shared_count", 1),
              ("expert_shared_feed_forward_length", 32), ("rope.scaling.type", "yarn"), ("rope.scaling.factor", 4.0),
              ("rope.scaling.original_context_length", 64), ("rope.scaling.yarn_log_multiplier", 0.0707))),
]

TINY_CASES += [
    _case("dots1", "dots1", ["moe", "shexp", "shexp_ungated", "probs_bias", "qk_norm", "router_f32"], n_layer=3,
          n_head_kv=4, n_expert=4,
          n_expert_used=2, metadata=(("leading_dense_block_count", 1), ("expert_feed_forward_length", 32),
                                     ("expert_shared_count", 2), ("expert_shared_feed_forward_length", 64),
                                     ("expert_weights_norm", True), ("expert_gating_func", 2))),
    _case("bailingmoe", "bailingmoe", ["moe", "shexp", "shexp_ungated"], n_expert=4, n_expert_used=2, metadata=(
        ("expert_feed_forward_length", 32), ("expert_shared_count", 1), ("expert_shared_feed_forward_length", 32),
        ("expert_weights_norm", True), ("expert_weights_scale", 1.5))),
    _case("minimax-m2", "minimax-m2", ["moe", "probs_bias", "qk_norm_full", "router_f32"], n_expert=4, n_expert_used=2,
          metadata=_PARTIAL + (("expert_gating_func", 2), ("expert_feed_forward_length", 128))),
]

# llama4: experts on every other layer (moe_odd), NoPE in layer 3; its 8192-position chunks are
# wider than the tiny context, so the windowed layers attend as the dense ones do
TINY_CASES += [
    _case("llama4", "llama4", ["moe", "moe_odd", "shexp", "shexp_ungated"], n_layer=4, n_expert=4, n_expert_used=1,
          metadata=(("interleave_moe_layer_step", 2), ("expert_feed_forward_length", 64),
                    ("expert_shared_feed_forward_length", 64))),
]

# ALiBi (tok_norm: bloom's token_embd_norm)
TINY_CASES += [
    _case("bloom", "bloom", _GPT + ["fused_qkv", "qkv_fused_bias", "tok_norm"], n_head_kv=4),
    _case("mpt", "mpt", ["layernorm", "fused_qkv", "ungated"], n_head_kv=4, metadata=(
        ("attention.max_alibi_bias", 8.0), ("attention.clamp_kqv", 2.0))),
]

# recurrent and hybrid architectures (their tensors: tiny_recurrent.py)
_SSM = (("ssm.conv_kernel", 4), ("ssm.inner_size", 128), ("ssm.state_size", 16))
TINY_CASES += [
    _case("mamba", "mamba", n_head=0, n_head_kv=0, metadata=_SSM + (("ssm.time_step_rank", 4),)),
    _case("mamba2", "mamba2", n_head=0, n_head_kv=0, metadata=_SSM + (("ssm.time_step_rank", 8), ("ssm.group_count", 2))),
    _case("jamba", "jamba", [], n_layer=3, n_expert=4, n_expert_used=2, metadata=_SSM + (
        ("ssm.time_step_rank", 8), ("attention.head_count_kv", (0, 2, 0)))),
    # experts on every other layer; F32 only: the tiny model's Q8_0 logits are too sensitive to
    # activation rounding for the golden threshold (llama.cpp's own F32 vs Q8_0 differ by 5.6%)
    _case("jamba-moe", "jamba", ["moe_odd"], n_layer=3, n_expert=4, n_expert_used=2, weight_types=("F32",),
          metadata=_SSM + (("ssm.time_step_rank", 8), ("attention.head_count_kv", (0, 2, 0)))),
    _case("granitehybrid", "granitehybrid", ["moe", "shexp"], n_layer=3, n_expert=4, n_expert_used=2, metadata=_SSM + (
        ("ssm.time_step_rank", 8), ("ssm.group_count", 2), ("attention.head_count_kv", (0, 2, 0)),
        ("expert_shared_feed_forward_length", 64), ("embedding_scale", 2.0), ("residual_scale", 0.5),
        ("logit_scale", 4.0), ("attention.scale", 0.2))),
    _case("nemotron_h", "nemotron_h", n_layer=4, metadata=_SSM + (
        ("ssm.time_step_rank", 8), ("ssm.group_count", 2), ("attention.head_count_kv", (0, 2, 0, 0)),
        ("feed_forward_length", (0, 0, 128, 0)), ("attention.layer_norm_epsilon", 1e-5))),
    _case("falcon-h1", "falcon-h1", metadata=_SSM + (("ssm.time_step_rank", 8), ("ssm.group_count", 1))),
    _case("lfm2", "lfm2", n_layer=3, metadata=(("shortconv.l_cache", 3), ("attention.head_count_kv", (0, 2, 0)))),
    _case("lfm2-swa", "lfm2", n_layer=3, weight_types=("F32",), metadata=(
        ("shortconv.l_cache", 3), ("attention.head_count_kv", (2, 0, 2)), ("attention.sliding_window", 4))),
    _case("rwkv6", "rwkv6", ["layernorm"], n_head=0, n_head_kv=0, metadata=(
        ("wkv.head_size", 16), ("time_mix_extra_dim", 32), ("time_decay_extra_dim", 32),
        ("rescale_every_n_layers", 2), ("token_shift_count", 2))),
    _case("qwen3next", "qwen3next", n_expert=4, n_expert_used=2, metadata=(
        ("ssm.conv_kernel", 4), ("ssm.state_size", 16), ("ssm.group_count", 2), ("ssm.time_step_rank", 4),
        ("ssm.inner_size", 64), ("full_attention_interval", 2), ("expert_feed_forward_length", 64),
        ("expert_shared_feed_forward_length", 64))),
    _case("qwen3next-ssm-in", "qwen3next", ["legacy_qkvz"], n_expert=4, n_expert_used=2, weight_types=("F32",),
          metadata=(("ssm.conv_kernel", 4), ("ssm.state_size", 16), ("ssm.group_count", 2),
                    ("ssm.time_step_rank", 4), ("ssm.inner_size", 64), ("full_attention_interval", 2),
                    ("expert_feed_forward_length", 64), ("expert_shared_feed_forward_length", 64))),
    # head size 64: ggml's vectorized WKV7 reads whole 64-value vectors (AVX512: 16 x 4) of every row, so
    # llama.cpp is only right for head sizes that are multiples of that, as RWKV-7's 64
    _case("rwkv7", "rwkv7", ["layernorm"], n_head=0, n_head_kv=0, n_embd=128, n_ff=256, metadata=(
        ("wkv.head_size", 64), ("attention.decay_lora_rank", 32), ("attention.iclr_lora_rank", 32),
        ("attention.value_residual_mix_lora_rank", 32), ("attention.gate_lora_rank", 32), ("token_shift_count", 2))),
]

# issue 37, second round: Qwen3.5 (tiny_recurrent.py): 2 key heads for 4 value heads (tiled), interleaved
# multi-axis RoPE; qwen35 with a skipped prediction block (nextn), qwen35moe's layers by attention.recurrent_layers
_GDN = (("ssm.conv_kernel", 4), ("ssm.state_size", 16), ("ssm.group_count", 2), ("ssm.time_step_rank", 4),
        ("ssm.inner_size", 64), ("rope.dimension_sections", (3, 3, 2, 0)))
TINY_CASES += [
    _case("qwen35", "qwen35", n_layer=4, metadata=_GDN + (("full_attention_interval", 2), ("nextn_predict_layers", 1))),
    _case("qwen35moe", "qwen35moe", ["router_f32"], n_layer=3, n_expert=4, n_expert_used=2, metadata=_GDN + (
        ("attention.recurrent_layers", (True, False, True)), ("expert_feed_forward_length", 64),
        ("expert_shared_feed_forward_length", 64))),
    # Ling 2: fused q/k/v, q/k norms, partial rotary, a dense first layer, sigmoid routing with the selection bias
    # over 4 groups of 2 experts, 2 kept; one shared expert of its own width; a skipped prediction block
    _case("bailingmoe2", "bailingmoe2", ["fused_qkv", "qk_norm", "moe", "shexp", "shexp_ungated", "probs_bias",
                                         "router_f32"], n_layer=4, n_expert=8, n_expert_used=2, metadata=_PARTIAL + (
        ("leading_dense_block_count", 1), ("expert_feed_forward_length", 64), ("expert_shared_count", 1),
        ("expert_shared_feed_forward_length", 32), ("expert_weights_norm", True), ("expert_weights_scale", 2.5),
        ("expert_gating_func", 2), ("expert_group_count", 4), ("expert_group_used_count", 2),
        ("nextn_predict_layers", 1))),
    # Kimi-Linear: KDA layers (kda.head_dim 16, short convolutions of 4) around an MLA layer without
    # rotary positions (cache: kv_lora_rank 32 + 8 shared key values); a dense first layer, then sigmoid-routed
    # experts with the selection bias and a shared expert, scaled
    _case("kimi-linear", "kimi-linear", ["router_f32"], n_layer=3, n_expert=4, n_expert_used=2, metadata=(
        ("attention.head_count_kv", (0, 1, 0)), ("ssm.conv_kernel", 4), ("kda.head_dim", 16),
        ("attention.kv_lora_rank", 32), ("attention.key_length_mla", 40), ("attention.value_length_mla", 16),
        ("rope.dimension_count", 8), ("attention.key_length", 40), ("attention.value_length", 32),
        ("leading_dense_block_count", 1),
        ("expert_feed_forward_length", 32), ("expert_shared_count", 1), ("expert_weights_scale", 2.5),
        ("expert_gating_func", 2))),
    # LFM2-MoE: a dense first layer, then sigmoid-routed experts with the selection bias
    _case("lfm2moe", "lfm2moe", ["moe", "probs_bias", "router_f32"], n_layer=3, n_expert=4, n_expert_used=2,
          metadata=(("shortconv.l_cache", 3), ("attention.head_count_kv", (0, 2, 0)), ("leading_dense_block_count", 1),
                    ("expert_feed_forward_length", 64), ("expert_gating_func", 2))),
]

# MiniCPM3: low-rank q and kv (kv_lora_rank 32, q_lora_rank 32), keys of 16 nope + 8 rotary values, values of
# 16; LongRoPE factors (the long ones: the tests' context exceeds the original 32)
TINY_CASES += [
    _case("minicpm3", "minicpm3", ["mla_kv_b", "rope_factors"], n_head_kv=4, metadata=(
        ("attention.q_lora_rank", 32), ("attention.kv_lora_rank", 32), ("attention.key_length", 24),
        ("attention.value_length", 16), ("rope.dimension_count", 8), ("rope.scaling.original_context_length", 32))),
]

# encoders (tiny_encoders.py): non-causal attention, no output head; golden data are llama.cpp's
# embeddings per pooling (scripts/gen_encoder_embeddings.py, tests/test_encoders.py)
_ENC = (("attention.causal", False), ("pooling_type", 1))
_ENC_TYPES = (("tokenizer.ggml.token_type_count", tiny_encoders.N_TOKEN_TYPES),)
TINY_CASES += [
    _case("bert", "bert", ["layernorm", "pos_embd", "qkv_bias", "ffn_bias"], n_head_kv=4, metadata=_ENC,
          global_metadata=_ENC_TYPES),
    _case("bert-rerank", "bert", ["layernorm", "pos_embd", "qkv_bias", "ffn_bias", "cls", "cls_out"], n_head_kv=4,
          metadata=(("attention.causal", False), ("pooling_type", 4)), global_metadata=_ENC_TYPES),
    _case("nomic-bert", "nomic-bert", ["layernorm", "fused_qkv", "gated"], n_head_kv=4, metadata=_ENC,
          global_metadata=_ENC_TYPES),
    _case("gemma-embedding", "gemma-embedding", ["qk_norm", "post_norms", "tied", "dense_out"], n_layer=3, metadata=(
        ("attention.sliding_window", 4), ("attention.sliding_window_pattern", (True, False, True)),
        ("rope.freq_base_swa", 1000.0), ("pooling_type", 1), ("dense_2_feat_in", 64), ("dense_2_feat_out", 128),
        ("dense_3_feat_in", 128), ("dense_3_feat_out", 64))),
    _case("jina-bert-v3", "jina-bert-v3", ["layernorm", "qkv_bias", "ffn_bias"], n_head_kv=4, metadata=_ENC,
          global_metadata=_ENC_TYPES),
    _case("nomic-bert-moe", "nomic-bert-moe", ["layernorm", "fused_qkv", "ffn_bias", "moe"], n_head_kv=4,
          n_expert=4, n_expert_used=2, metadata=_ENC + (("moe_every_n_layers", 2),),
          global_metadata=_ENC_TYPES),
    _case("jina-bert-v2", "jina-bert-v2", ["layernorm", "qkv_bias", "ffn_bias", "fused_up", "qk_norm", "norm_2",
                                           "cls"], n_head_kv=4, metadata=_ENC, global_metadata=_ENC_TYPES),
    _case("modern-bert", "modern-bert", ["layernorm", "fused_qkv", "fused_up", "cls", "cls_out"], n_layer=3, n_head_kv=4, metadata=_ENC + (
        ("attention.sliding_window", 4), ("rope.freq_base_swa", 1000.0), ("rope.freq_base", 160000.0))),
    _case("neo-bert", "neo-bert", ["fused_qkv", "fused_up", "cls", "cls_out"],
          metadata=(("attention.causal", False), ("pooling_type", 2))),
    _case("eurobert", "eurobert", [], metadata=_ENC),
]

# Gemma 4 / Gemma 3n (tiny_gemma.py): windowed layers with their own head size, KV heads and FFN
# width per layer, the last two layers reusing the KV cache of the last windowed and dense ones,
# per-layer token embeddings; gemma4's dense layers have experts beside their FFN and V = K
TINY_CASES += [
    _case("gemma4", "gemma4", ["moe", "v_is_k"], n_layer=5, head_dim=32, n_expert=4, n_expert_used=2, metadata=(
        ("attention.sliding_window", 4), ("attention.sliding_window_pattern", (True, True, False, True, False)),
        ("attention.key_length_swa", 16), ("attention.value_length_swa", 16), ("rope.dimension_count_swa", 16),
        ("attention.head_count_kv", (2, 2, 1, 2, 1)), ("feed_forward_length", (128, 128, 96, 256, 256)),
        ("attention.shared_kv_layers", 2), ("embedding_length_per_layer_input", 32),
        ("expert_feed_forward_length", 32), ("rope.freq_base", 1000000.0), ("rope.freq_base_swa", 10000.0),
        ("final_logit_softcapping", 30.0))),
    # 22 layers: llama.cpp's gemma3n keeps a KV cache in the first 20 only (layer 20 reads 18's, 21
    # reads 19's); activation sparsity in the first 10
    _case("gemma3n", "gemma3n", [], n_layer=22, metadata=(
        ("attention.sliding_window", 4), ("attention.sliding_window_pattern", tuple(
            il % 5 != 4 and il != 21 for il in range(22))), ("rope.freq_base_swa", 10000.0),
        ("rope.freq_base", 1000000.0))),
]

# T5 (tiny_t5.py): the encoder reads the first 8 tokens, the decoder the other 12 (the first is
# the decoder start token 0); 16 relative position buckets, so both the exact and the logarithmic
# buckets occur; flan-T5's gated FFN, and T5's ReLU MLP with a tied head. The gated model is F32
# only: its Q8_0 logits differ from llama.cpp's by 2.5% (encoder and decoder compound the
# activation rounding) and two rows whose top two logits are within 0.035 swap their argmax
_T5 = (("attention.relative_buckets_count", 16), ("decoder_start_token_id", 0))
TINY_CASES += [
    _case("t5", "t5", ["gated"], n_head_kv=4, n_encoder=8, weight_types=("F32",), metadata=_T5),
    _case("t5-relu", "t5", ["tied"], n_head_kv=4, n_encoder=8, metadata=_T5),
    _case("t5encoder", "t5encoder", ["gated", "tied"], n_head_kv=4, metadata=(
        ("attention.relative_buckets_count", 16), ("pooling_type", 1))),
]

CASES_BY_NAME = {c.name: c for c in TINY_CASES}


def _tensors(case: TinyCase, gen: torch.Generator) -> dict[str, np.ndarray]:
    """Weights (numpy, torch order) with scales that keep activations O(1)."""
    if case.arch in tiny_recurrent.RECURRENT_ARCHS:
        return {k: t.float().numpy() for k, t in tiny_recurrent.recurrent_tensors(case, gen).items()}
    if case.arch in tiny_encoders.ENCODER_ARCHS:
        return {k: t.float().numpy() for k, t in tiny_encoders.encoder_tensors(case, gen).items()}
    if case.arch in tiny_gemma.GEMMA_ARCHS:
        return {k: t.float().numpy() for k, t in tiny_gemma.gemma_tensors(case, gen).items()}
    if case.arch in tiny_t5.T5_ARCHS:
        return {k: t.float().numpy() for k, t in tiny_t5.t5_tensors(case, gen).items()}
    f = case.features
    e, hd, v = case.n_embd, case.head_dim, case.n_vocab
    q_dim, kv_dim = hd * case.n_head, hd * case.n_head_kv
    meta = dict(case.metadata)

    def mat(*shape):  # rows x cols (ggml ne reversed), leading dims for experts
        return torch.randn(*shape, generator=gen) / shape[-1] ** 0.5

    def vec(n, mean=0.0, std=0.1):
        return mean + std * torch.randn(n, generator=gen)

    w = {"token_embd.weight": torch.randn(v, e, generator=gen)}
    for il in range(case.n_layer):
        p = f"blk.{il}."
        if "no_attn_norm" not in f and "no_norms" not in f:
            w[p + "attn_norm.weight"] = vec(e, 1.0)
            if "norm_bias" in f:
                w[p + "attn_norm.bias"] = vec(e)
        if "norm_2" in f:  # falcon 40B's second attention norm
            w[p + "attn_norm_2.weight"], w[p + "attn_norm_2.bias"] = vec(e, 1.0), vec(e)
        if f & {"mla", "mla_kv_b"}:  # low-rank query and latent: multi-head latent attention (deepseek2), or
            # the latent decompressed by attn_kv_b before the cache (minicpm3)
            n_h, lora_q, lora_kv = case.n_head, int(meta["attention.q_lora_rank"]), int(meta["attention.kv_lora_rank"])
            widths = ("key_length_mla", "value_length_mla") if "mla" in f else ("key_length", "value_length")
            dk, dv = (int(meta["attention." + key]) for key in widths)
            rot = int(meta["rope.dimension_count"])
            w[p + "attn_q_a_norm.weight"], w[p + "attn_kv_a_norm.weight"] = vec(lora_q, 1.0), vec(lora_kv, 1.0)
            w[p + "attn_q_a.weight"], w[p + "attn_q_b.weight"] = mat(lora_q, e), mat(n_h * dk, lora_q)
            w[p + "attn_kv_a_mqa.weight"] = mat(lora_kv + rot, e)
            if "mla" in f:
                w[p + "attn_k_b.weight"] = mat(n_h, lora_kv, dk - rot)
                w[p + "attn_v_b.weight"] = mat(n_h, dv, lora_kv)
            else:
                w[p + "attn_kv_b.weight"] = mat(n_h * (dk - rot + dv), lora_kv)
            w[p + "attn_output.weight"] = mat(e, n_h * dv)
        elif "fused_qkv" in f:
            w[p + "attn_qkv.weight"] = mat(q_dim + 2 * kv_dim, e)
            if "qkv_fused_bias" in f:
                w[p + "attn_qkv.bias"] = vec(q_dim + 2 * kv_dim)
        else:
            w[p + "attn_q.weight"] = mat(q_dim, e)
            w[p + "attn_k.weight"] = mat(kv_dim, e)
            w[p + "attn_v.weight"] = mat(kv_dim, e)
        if "qkv_bias" in f:
            w[p + "attn_q.bias"], w[p + "attn_k.bias"], w[p + "attn_v.bias"] = vec(q_dim), vec(kv_dim), vec(kv_dim)
        if "qk_norm" in f:
            w[p + "attn_q_norm.weight"], w[p + "attn_k_norm.weight"] = vec(hd, 1.0), vec(hd, 1.0)
        if "qk_norm_per_head" in f:  # one norm per head (stablelm)
            w[p + "attn_q_norm.weight"] = vec(hd * case.n_head, 1.0).reshape(case.n_head, hd)
            w[p + "attn_k_norm.weight"] = vec(hd * case.n_head_kv, 1.0).reshape(case.n_head_kv, hd)
        if "qk_norm_full" in f:  # over all the heads together (olmo2)
            w[p + "attn_q_norm.weight"], w[p + "attn_k_norm.weight"] = vec(q_dim, 1.0), vec(kv_dim, 1.0)
        if not f & {"mla", "mla_kv_b"}:
            w[p + "attn_output.weight"] = mat(e, q_dim)
        if "out_bias" in f:
            w[p + "attn_output.bias"] = vec(e)
        if "sinks" in f:
            w[p + "attn_sinks.weight"] = vec(case.n_head, 0.0, 1.0)
        if "post_norms" in f or "ffn_post_attn_norm" in f:
            w[p + "post_attention_norm.weight"] = vec(e, 1.0)
        if not f & {"ffn_post_attn_norm", "parallel", "no_ffn_norm", "no_norms"}:
            w[p + "ffn_norm.weight"] = vec(e, 1.0)
            if "norm_bias" in f:
                w[p + "ffn_norm.bias"] = vec(e)
        if "moe" in f and il >= int(meta.get("leading_dense_block_count", 0)) and not ("moe_odd" in f and il % 2 == 0):
            n, ff = case.n_expert, int(meta.get("expert_feed_forward_length", case.n_ff))
            if "probs_bias" in f:  # the experts' selection bias (DeepSeek V3), small beside the probabilities
                w[p + "exp_probs_b.bias"] = vec(n, 0.0, 0.05)
            w[p + "ffn_gate_inp.weight"] = mat(n, e) * 4.0  # a router with clear preferences
            w[p + "ffn_gate_exps.weight"] = mat(n, ff, e)
            w[p + "ffn_up_exps.weight"] = mat(n, ff, e)
            w[p + "ffn_down_exps.weight"] = mat(n, e, ff)
            if "moe_biases" in f:
                w[p + "ffn_gate_inp.bias"] = vec(n)
                w[p + "ffn_gate_exps.bias"], w[p + "ffn_up_exps.bias"] = vec(n * ff).reshape(n, ff), vec(n * ff).reshape(n, ff)
                w[p + "ffn_down_exps.bias"] = vec(n * e).reshape(n, e)
            if "shexp" in f:
                sh = int(meta.get("expert_shared_feed_forward_length", case.n_ff))
                if "shexp_ungated" not in f:
                    w[p + "ffn_gate_inp_shexp.weight"] = vec(e, 0.0, 0.5)
                w[p + "ffn_gate_shexp.weight"] = mat(sh, e)
                w[p + "ffn_up_shexp.weight"] = mat(sh, e)
                w[p + "ffn_down_shexp.weight"] = mat(e, sh)
        elif "fused_up" in f:
            w[p + "ffn_up.weight"] = mat(2 * case.n_ff, e)
            w[p + "ffn_down.weight"] = mat(e, case.n_ff)
        else:
            if "ungated" not in f:
                w[p + "ffn_gate.weight"] = mat(case.n_ff, e)
            w[p + "ffn_up.weight"] = mat(case.n_ff, e)
            w[p + "ffn_down.weight"] = mat(e, case.n_ff)
            if "ffn_bias" in f:
                w[p + "ffn_up.bias"], w[p + "ffn_down.bias"] = vec(case.n_ff), vec(e)
        if "post_norms" in f:
            w[p + "post_ffw_norm.weight"] = vec(e, 1.0)
        if il >= case.n_layer - int(meta.get("nextn_predict_layers", 0)):  # a prediction block (skipped)
            w[p + "nextn.eh_proj.weight"] = mat(e, 2 * e)
            w[p + "nextn.enorm.weight"], w[p + "nextn.hnorm.weight"] = vec(e, 1.0), vec(e, 1.0)
            w[p + "layer_output_norm.weight"] = vec(e, 1.0)
    if "rope_factors" in f:
        n_rot = int(meta.get("rope.dimension_count", hd))
        w["rope_factors_long.weight"] = 1.0 + torch.rand(n_rot // 2, generator=gen) * 3.0
        w["rope_factors_short.weight"] = 1.0 + torch.rand(n_rot // 2, generator=gen) * 0.5
    if "tok_norm" in f:
        w["token_embd_norm.weight"], w["token_embd_norm.bias"] = vec(e, 1.0), vec(e)
    if "pos_embd" in f:
        w["position_embd.weight"] = torch.randn(case.n_ctx, e, generator=gen) * 0.5
    if "no_norms" not in f:
        w["output_norm.weight"] = vec(e, 1.0)
    if "norm_bias" in f:
        w["output_norm.bias"] = vec(e)
    if "tied" not in f:
        w["output.weight"] = mat(v, e)
    if "head_bias" in f:
        w["output.bias"] = vec(v)
    if "dense_out" in f:  # gemma-embedding's projections of the pooled vectors
        w["dense_2.weight"] = mat(2 * e, e)
        w["dense_3.weight"] = mat(e, 2 * e)
    return {k: t.float().numpy() for k, t in w.items()}


def _add_key(writer, key: str, value) -> None:
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    else:
        writer.add_array(key, list(value))


def write_tiny_model(path, case: TinyCase | str, weight_type: str = "F32", vocab=None) -> str:
    """Write `case` with 2-D and 3-D weights stored as weight_type (F32, F16, or a type
    gguf.quants can quantize); norms (per-head ones too), biases, sinks and rope factors stay F32.
    vocab: a demo.Vocab of case.n_vocab tokens to write as its tokenizer (default: none, ids only)."""
    import gguf
    case = CASES_BY_NAME[case] if isinstance(case, str) else case
    qtype = gguf.GGMLQuantizationType[weight_type.upper()]
    gen = torch.Generator().manual_seed(TINY_SEED + sum(map(ord, case.name)))
    path = os.fspath(path)
    a = case.arch
    w = gguf.GGUFWriter(path, a)
    eps_key = "attention.layer_norm_epsilon" if "layernorm" in case.features else "attention.layer_norm_rms_epsilon"
    keys = {"context_length": case.n_ctx, "embedding_length": case.n_embd, "block_count": case.n_layer,
            "feed_forward_length": case.n_ff, "attention.head_count": case.n_head,
            "attention.head_count_kv": case.n_head_kv, "attention.key_length": case.head_dim,
            "attention.value_length": case.head_dim, "rope.dimension_count": case.head_dim,
            eps_key: 1e-5, "vocab_size": case.n_vocab}
    if case.n_expert:
        keys.update({"expert_count": case.n_expert, "expert_used_count": case.n_expert_used})
    keys.update(dict(case.metadata))
    for key, value in keys.items():
        _add_key(w, f"{a}.{key}", value)
    for key, value in case.global_metadata:
        _add_key(w, key, value)
    if vocab is None:
        w.add_tokenizer_model("none")
    elif len(vocab.tokens) != case.n_vocab:
        raise ValueError(f"write_tiny_model: a vocabulary of {len(vocab.tokens)} tokens for {case.n_vocab}")
    else:
        add_vocab(w, vocab)
    mxfp4 = qtype == gguf.GGMLQuantizationType.MXFP4
    recurrent = case.arch in tiny_recurrent.RECURRENT_ARCHS
    write_tensors(w, _tensors(case, gen), qtype,
                  keep_f32=lambda name, data: name.endswith((".bias", "_norm.weight")) or (mxfp4 and data.ndim != 3)
                  or name == "token_types.weight"  # added as a row to F32 states (converters keep it F32)
                  or name.endswith("attn_rel_b.weight")  # T5's bias rows: one per bucket, n_head wide
                  or name.endswith(("altup_correct_coef.weight", "altup_predict_coef.weight"))  # rows of 4
                  or ("router_f32" in case.features and name.endswith("ffn_gate_inp.weight"))
                  or (recurrent and tiny_recurrent.keep_f32(name, data)))
    return path


def file_sha256(path) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()
