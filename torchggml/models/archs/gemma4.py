"""Google's Gemma 4 (gemma4): gemma3's layer (embeddings scaled by sqrt(n_embd), RMS q/k norms,
post-attention and post-FFN norms, GELU-gated FFN, NeoX rotary) with layers of two shapes.
- Attention: the file lists which layers slide (attention.sliding_window_pattern); those have
  their own head size (key_length_swa), rotary dimensions and base; the dense layers rotate with
  rope_freqs (proportional RoPE). V is RMS-normed without a weight; a layer without attn_v uses
  K as V. Scores are not scaled (attention scale 1). The last attention.shared_kv_layers layers
  keep no cache: they attend over the cache of the last earlier layer of their kind.
- FFN: per-layer widths; a layer with a router adds experts beside the dense FFN, each branch
  normed on its own, the router reading the RMS-normed residual / sqrt(n_embd) times its scale,
  the experts' outputs times their per-expert scale.
- Per-layer embeddings: every layer adds a gated projection of its slice of the per-layer token
  embeddings (plus a projection of the input embeddings), and its output may be scaled.
- Logits soft-capped when the file says so.
"""
from __future__ import annotations

import math

from ... import ops
from ...enums import RopeType
from ...gguf.loader import GGUFError
from ..builder import Arch
from ..hparams import read_swa_pattern


def read_layer_shapes(hp, keys) -> None:
    """The keys of gemma4's and gemma3n's layers of several shapes: the sliding layers (a per-layer
    array), their head size and rotary dimensions, KV heads and FFN width per layer, the layers
    sharing an earlier one's KV cache, the per-layer embeddings' width."""
    if not isinstance(keys.get_list("attention.sliding_window_pattern"), list):
        raise GGUFError(f"{keys.f.path}: {keys.arch} needs {keys.arch}.attention.sliding_window_pattern "
                        f"(one flag per layer)")
    read_swa_pattern(hp, keys, 0)
    hp.n_swa = int(keys.get("attention.sliding_window"))
    hp.head_dim_k_swa = int(keys.get("attention.key_length_swa", hp.head_dim_k))
    hp.head_dim_v_swa = int(keys.get("attention.value_length_swa", hp.head_dim_v))
    hp.n_rot_swa = int(keys.get("rope.dimension_count_swa", hp.n_rot))
    hp.rope_freq_base_swa = float(keys.get("rope.freq_base_swa", 10000.0))
    hp.rope_freq_scale_swa = 1.0
    hp.n_embd_per_layer = int(keys.get("embedding_length_per_layer_input"))
    for key, attr in (("attention.head_count_kv", "n_head_kv_layers"), ("feed_forward_length", "n_ff_layers")):
        value = keys.get_list(key)
        setattr(hp, attr, [int(v) for v in value] if isinstance(value, list) else [int(value)] * hp.n_layer)
    if len(hp.n_head_kv_layers) != hp.n_layer or len(hp.n_ff_layers) != hp.n_layer:
        raise GGUFError(f"{keys.f.path}: {keys.arch}'s per-layer head_count_kv / feed_forward_length need "
                        f"{hp.n_layer} entries")
    shared = int(keys.get("attention.shared_kv_layers", 0))
    hp.n_layer_kv = hp.n_layer - shared
    if shared and hp.n_layer_kv < 2:
        raise GGUFError(f"{keys.f.path}: {keys.arch}.attention.shared_kv_layers {shared} leaves fewer than 2 "
                        f"layers with a KV cache")


def kv_source(hp, il: int) -> int:
    """The layer whose KV cache layer il (one without its own) reads: the last windowed or the last
    dense layer with a cache, as llama.cpp's reuse rule; checked to be of layer il's kind."""
    src = hp.n_layer_kv - (2 if hp.is_swa(il) else 1)
    if hp.is_swa(src) != hp.is_swa(il) or hp.kv_dims(src) != hp.kv_dims(il):
        raise GGUFError(f"{hp.arch}: layer {il} shares the KV cache of layer {src}, whose attention differs")
    return src


def load_per_layer_inputs(w, hp) -> None:
    if hp.n_embd_per_layer:
        n = hp.n_embd_per_layer * hp.n_layer
        w.add("per_layer_token_embd", "per_layer_token_embd.weight", [n, hp.n_vocab])
        w.add("per_layer_model_proj", "per_layer_model_proj.weight", [hp.n_embd, n])
        w.add("per_layer_proj_norm", "per_layer_proj_norm.weight", [hp.n_embd_per_layer])


def per_layer_inputs(b, w, x):
    """[n_embd_per_layer, n_tokens, n_layer]: each layer's slice of the tokens' per-layer
    embeddings (times sqrt(n_embd_per_layer)) plus the RMS-normed projection of the input
    embeddings x (over sqrt(n_embd)), over sqrt(2)."""
    hp, ctx, n = b.hp, b.ctx, x.ne[1]
    npl = hp.n_embd_per_layer
    if b.tokens is None:
        raise ValueError(f"{hp.arch}: input embeddings (an image's) are not supported with per-layer embeddings")
    rows = ops.get_rows(ctx, w.per_layer_token_embd, b.tokens)
    rows = ops.scale(ctx, ops.reshape_3d(ctx, rows, npl, hp.n_layer, n), math.sqrt(npl))
    proj = ops.scale(ctx, b.linear(x, w.per_layer_model_proj), 1.0 / math.sqrt(hp.n_embd))
    proj = b.norm(ops.reshape_3d(ctx, proj, npl, hp.n_layer, n), w.per_layer_proj_norm)
    out = ops.scale(ctx, ops.add(ctx, proj, rows), 1.0 / math.sqrt(2.0))
    return ops.cont(ctx, ops.permute(ctx, out, 0, 2, 1, 3))


def per_layer_slice(b, inputs, il: int, rows: bool = True):
    """Layer il's [n_embd_per_layer, n_tokens] of per_layer_inputs (with rows, only the output
    rows in the last layer: gemma4 selects them there, gemma3n after its last layer)."""
    view = ops.view_2d(b.ctx, inputs, inputs.ne[0], inputs.ne[1], inputs.nb[1], il * inputs.nb[2])
    return b.output_rows(il, view)[0] if rows else view


class Gemma4(Arch):
    names = ("gemma4",)
    rope_type = RopeType.NEOX
    biases = {}
    rope_freqs = False  # read in load_weights: the dense layers' size
    per_layer_keys = ("attention.head_count_kv", "feed_forward_length")  # read_layer_shapes

    def read_hparams(self, hp, keys):
        read_layer_shapes(hp, keys)
        hp.attention_scale = 1.0
        hp.final_softcap = float(keys.get("final_logit_softcapping", 0.0))
        dims = {hp.head_dims(il) for il in range(hp.n_layer)}
        if any(k != v for k, v in dims):
            raise GGUFError(f"{keys.f.path}: gemma4 needs key_length == value_length (and for the windowed layers)")

    def load_weights(self, w, hp):
        dense = [il for il in range(hp.n_layer) if not hp.is_swa(il)]
        if dense:  # proportional RoPE of the dense layers (llama.cpp requires it)
            w.add("rope_freqs", "rope_freqs.weight", [hp.head_dims(dense[0])[0] // 2])
        load_per_layer_inputs(w, hp)
        super().load_weights(w, hp)

    def load_layer(self, L, hp):
        il, e = L.il, hp.n_embd
        hd, nh, nkv, kv = hp.head_dims(il)[0], hp.n_head, hp.layer_n_head_kv(il), hp.has_kv(il)
        L.weight("attn_norm", [e])
        L.weight("attn_q", [e, hd * nh])
        L.weight("attn_k", [e, hd * nkv], required=kv)
        L.weight("attn_v", [e, hd * nkv], required=False)
        L.weight("attn_output", [hd * nh, e])
        L.weight("attn_q_norm", [hd])
        L.weight("attn_k_norm", [hd], required=kv)
        L.weight("post_attention_norm", [e])
        L.weight("layer_output_scale", [1], required=False)
        ff = hp.n_ff_layers[il]
        for name, ne in (("ffn_norm", [e]), ("ffn_gate", [e, ff]), ("ffn_up", [e, ff]), ("ffn_down", [ff, e]),
                         ("post_ffw_norm", [e])):
            L.weight(name, ne)
        if L.has("ffn_gate_inp"):
            n, ffe = hp.n_expert, hp.n_ff_exp
            L.weight("ffn_gate_inp", [e, n])
            L.w.add("ffn_gate_inp_s", f"blk.{il}.ffn_gate_inp.scale", [e], layer=L.layer)
            for name in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
                L.weight(name, [e])
            L.weight("ffn_gate_exps", [e, ffe, n])
            L.weight("ffn_up_exps", [e, ffe, n])
            L.weight("ffn_down_exps", [ffe, e, n])
            L.w.add("ffn_down_exps_s", f"blk.{il}.ffn_down_exps.scale", [n], required=False, layer=L.layer)
        if hp.n_embd_per_layer:
            L.weight("inp_gate", [e, hp.n_embd_per_layer])
            L.weight("proj", [hp.n_embd_per_layer, e])
            L.weight("post_norm", [e])

    def attention(self, b, il, h, layer, factors):
        hp, ctx, n = b.hp, b.ctx, h.ne[1]
        hd, nkv = hp.head_dims(il)[0], hp.layer_n_head_kv(il)
        q = b.norm(ops.reshape_3d(ctx, b.linear(h, layer.attn_q), hd, hp.n_head, n), layer.attn_q_norm)
        q = b.rope(q, il, factors)
        if not hp.has_kv(il):
            return b.attention(il, q, None, None, layer.attn_output, kq_scale=1.0, kv_from=kv_source(hp, il))
        k = ops.reshape_3d(ctx, b.linear(h, layer.attn_k), hd, nkv, n)
        v = k if layer.attn_v is None else ops.reshape_3d(ctx, b.linear(h, layer.attn_v), hd, nkv, n)
        k = b.rope(b.norm(k, layer.attn_k_norm), il, factors)
        v = ops.rms_norm(ctx, v, hp.norm_eps)
        return b.attention(il, q, k, v, layer.attn_output, kq_scale=1.0)

    def ffn(self, b, x, layer):
        hp, ctx = b.hp, b.ctx
        if layer.ffn_gate_inp is None:
            return b.ffn(b.norm(x, layer.ffn_norm), layer, act="gelu")
        dense = b.norm(b.ffn(b.norm(x, layer.ffn_norm), layer, act="gelu"), layer.post_ffw_norm_1)
        router = ops.scale(ctx, ops.rms_norm(ctx, x, hp.norm_eps), 1.0 / math.sqrt(hp.n_embd))
        logits = b.linear(ops.mul(ctx, router, layer.ffn_gate_inp_s), layer.ffn_gate_inp)
        experts = b.moe(b.norm(x, layer.pre_ffw_norm_2), layer, act="gelu", logits=logits)
        return b.add(dense, b.norm(experts, layer.post_ffw_norm_2))

    def build(self, b, w):
        hp, ctx = b.hp, b.ctx
        x = b.embed(w.token_embd, math.sqrt(hp.n_embd))
        inputs = per_layer_inputs(b, w, x) if w.per_layer_token_embd is not None else None
        for il, layer in enumerate(w.layers):
            factors = None if hp.is_swa(il) else w.rope_freqs
            h = self.attention(b, il, b.norm(x, layer.attn_norm), layer, factors)
            h, x = b.output_rows(il, h, x)
            x = b.add(b.norm(h, layer.post_attention_norm), x)
            x = b.add(b.norm(self.ffn(b, x, layer), layer.post_ffw_norm), x)
            if inputs is not None:
                g = ops.gelu(ctx, b.linear(x, layer.inp_gate))
                g = b.linear(ops.mul(ctx, g, per_layer_slice(b, inputs, il)), layer.proj)
                x = b.add(x, b.norm(g, layer.post_norm))
            if layer.layer_output_scale is not None:
                x = ops.mul(ctx, x, layer.layer_output_scale)
        return b.output(x, w, softcap=hp.final_softcap)


ARCHS = [Gemma4()]
