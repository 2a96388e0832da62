"""GLM-4.5 / 4.6 (glm4moe): attention with optional per-head q/k RMS norms and partial NeoX
rotary embedding (multi-axis with rope.dimension_sections); post_attention_norm is the FFN's input
norm; after leading_dense_block_count dense SwiGLU layers, a mixture of experts routed by the
sigmoid of the router's logits (expert_gating_func; its selection biased by exp_probs_b),
renormalised over the chosen experts when expert_weights_norm, times expert_weights_scale, plus
expert_shared_count shared experts as one SwiGLU; grouped top-k when expert_group_count is set.
The multi-token-prediction blocks (the last nextn_predict_layers) are skipped, as llama.cpp does.
"""
from __future__ import annotations

from ...enums import RopeType
from ...gguf.loader import GGUFError
from ..builder import Arch, load_attention, load_ffn, load_moe, load_shared_expert
from .dense import Dense

# llama.cpp's llama_expert_gating_func_type
GATING_FUNCS = {1: "softmax", 2: "sigmoid", 3: "softmax_weight"}


def read_routing(hp, keys, default_gating: int | None, shared: bool = True) -> None:
    """The keys of DeepSeek-style routing: dense layers first, shared experts (when `shared`),
    gating (the key required when default_gating is None), weights."""
    hp.n_layer_dense_lead = int(keys.get("leading_dense_block_count", 0))
    hp.n_expert_shared = int(keys.get("expert_shared_count")) if shared else 0
    hp.expert_weights_scale = float(keys.get("expert_weights_scale", 0.0))
    hp.expert_weights_norm = bool(keys.get("expert_weights_norm", False))
    gating = int(keys.get("expert_gating_func", 0)) or default_gating
    if gating is None:
        raise GGUFError(f"{keys.f.path}: metadata key '{keys.arch}.expert_gating_func' is missing")
    if gating not in GATING_FUNCS:
        raise GGUFError(f"{keys.f.path}: {keys.arch}.expert_gating_func {gating} is not supported "
                        f"({', '.join(f'{k}: {v}' for k, v in GATING_FUNCS.items())})")
    hp.expert_gating = GATING_FUNCS[gating]


def load_routed_ffn(L, hp, norm="ffn_norm", probs_bias=False, n_ff_shexp=0) -> None:
    """A dense SwiGLU in the leading layers, else the experts (with their selection bias,
    required when probs_bias) and the shared experts (n_expert_shared experts of n_ff_shexp,
    or of the routed experts' width, wide)."""
    if L.il < hp.n_layer_dense_lead:
        L.weight(norm, [hp.n_embd])
        return load_ffn(L, hp, norm=False)
    n_ff_exp = hp.n_ff_exp or hp.n_ff // hp.n_expert_used
    load_moe(L, hp, n_ff_exp, norm=norm, probs_bias=probs_bias)
    if hp.n_expert_shared:
        load_shared_expert(L, hp, (n_ff_shexp or n_ff_exp) * hp.n_expert_shared, gate_inp=False)


def skip_nextn_layers(hp, keys) -> None:
    """The last nextn_predict_layers blocks predict further tokens (speculative decoding): as
    llama.cpp by default, the model is the blocks before them."""
    hp.n_layer_nextn = int(keys.get("nextn_predict_layers", 0))
    if not 0 <= hp.n_layer_nextn < hp.n_layer:
        raise GGUFError(f"{keys.f.path}: {keys.arch}.nextn_predict_layers {hp.n_layer_nextn} must be below "
                        f"block_count {hp.n_layer}")
    hp.n_layer -= hp.n_layer_nextn


class RoutedDense(Dense):
    """A pre-norm layer whose FFN is `load_routed_ffn` / `routed_ffn` (dots1, bailingmoe)."""

    def load_layer(self, L, hp):
        load_attention(L, hp, qk_norm=self.qk_norm)
        load_routed_ffn(L, hp)

    def build(self, b, w):
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            x = b.add_attention(il, x, b.self_attention(il, b.norm(x, layer.attn_norm), layer))
            x = b.add(x, routed_ffn(b, b.norm(x, layer.ffn_norm), layer))
        return b.output(x, w)


def routed_ffn(b, h, layer):
    hp = b.hp
    if layer.ffn_gate_inp is None:
        return b.ffn(h, layer)
    out = b.moe(h, layer, norm_weights=hp.expert_weights_norm, gating=hp.expert_gating, w_scale=hp.expert_weights_scale)
    return out if layer.ffn_up_shexp is None else b.add(out, b.ffn(h, layer, suffix="_shexp"))


class Glm4Moe(Arch):
    names = ("glm4moe",)
    rope_type = RopeType.NEOX
    biases = {"attn_q": False, "attn_k": False, "attn_v": False, "attn_qkv": False}
    fused_qkv = True

    def read_hparams(self, hp, keys):
        read_routing(hp, keys, default_gating=2)
        sections = keys.get_list("rope.dimension_sections")
        if sections and sections[0] > 0 and sections[1] > 0:
            hp.rope_sections, hp.rope_type = tuple(int(s) for s in sections[:4]), int(RopeType.MROPE)
        skip_nextn_layers(hp, keys)

    def load_layer(self, L, hp):
        load_attention(L, hp)
        for name in ("attn_q_norm", "attn_k_norm"):  # optional, shared by the heads
            L.weight(name, [hp.head_dim_k], required=False)
        load_routed_ffn(L, hp, norm="post_attention_norm", probs_bias=True)

    def build(self, b, w):
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            x = b.add_attention(il, x, b.self_attention(il, b.norm(x, layer.attn_norm), layer))
            x = b.add(x, routed_ffn(b, b.norm(x, layer.post_attention_norm), layer))
        return b.output(x, w)


ARCHS = [Glm4Moe()]
