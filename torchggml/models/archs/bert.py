"""BERT-style encoders: attention over the whole sequence (the file's attention.causal is false).
The result is the last layer's hidden states, pooled by Model.embed (none, mean, cls, last, or
rank through the classifier head cls / cls.output); an encoder has no logits.

`Bert`: token + token-type (+ learned position) embeddings under a LayerNorm, and post-norm
layers: x = norm(x + attention(x)), x = norm(x + ffn(x)).
- bert: learned position embeddings, optional biases, an ungated GELU FFN.
- nomic-bert: rotary positions (NeoX), one fused attn_qkv, a SwiGLU FFN without biases.
- jina-bert-v3: bert's layer with NeoX rotary positions instead of learned ones.
- nomic-bert-moe: nomic-bert's attention, bert's FFN, every n-th layer's FFN a mixture of experts.
- jina-bert-v2: ALiBi instead of positions (symmetric: -|p - p0|), optional LayerNorms on q and
  k over all the heads, an optional second attention norm, a GEGLU FFN when ffn_up holds
  [up | gate] (twice n_ff wide), an ungated GELU one otherwise.

`PreNormEncoder`: x += attention(norm(x)), x += ffn(norm(x)), a final norm (modern-bert,
neo-bert, eurobert; see their classes).
"""
from __future__ import annotations

import torch

from ... import ops
from ...interop import to_torch
from ...quants import dequantize
from ...types import type_traits
from ...enums import RopeType
from ...gguf.loader import GGUFError
from ..builder import Arch, LayerLoader
from ..hparams import read_swa_pattern


class Bert(Arch):
    names = ("bert",)
    encoder = True
    fused_qkv = True
    biases = {"attn_q": False, "attn_k": False, "attn_v": False, "attn_qkv": False, "attn_output": False,
              "ffn_up": False, "ffn_down": False}  # each optional, as llama.cpp loads them
    pos_embd = True      # learned position embeddings (position_embd.weight)
    rotary = False
    ffn_act = "gelu"
    type_embd_required = False
    cls_width = None     # the classifier's dense layer: [n_embd, n_embd] (None), or this many outputs

    def read_hparams(self, hp, keys):
        hp.n_token_types = int(keys.f.get("tokenizer.ggml.token_type_count", 0) or 0)

    def load_weights(self, w, hp):
        e = hp.n_embd
        w.add("token_embd", "token_embd.weight", [e, hp.n_vocab])
        if hp.n_token_types == 0 and not self.type_embd_required:
            raise GGUFError(f"{w.path}: {hp.arch} needs tokenizer.ggml.token_type_count (the token types)")
        w.add("type_embd", "token_types.weight", [e, hp.n_token_types], required=self.type_embd_required)
        if self.pos_embd:
            w.add("pos_embd", "position_embd.weight", [e, hp.n_ctx_train])
        w.add("tok_norm", "token_embd_norm.weight", [e])
        w.add("tok_norm_b", "token_embd_norm.bias", [e])
        # the classifier head of rerankers (pooling rank): cls (dense + tanh), then cls.output
        n_cls = self.cls_width or e
        w.add("cls", "cls.weight", [e, n_cls], required=False)
        w.add("cls_b", "cls.bias", [n_cls], required=False)
        w.add("cls_out", "cls.output.weight", [n_cls, hp.n_cls_out], required=False)
        w.add("cls_out_b", "cls.output.bias", [hp.n_cls_out], required=False)
        for il in range(hp.n_layer):
            L = LayerLoader(w, il)
            self.load_layer(L, hp)
            w.layers.append(L.layer)

    def load_layer(self, L: LayerLoader, hp):
        e, kv = hp.n_embd, hp.n_embd_k_gqa
        if L.has("attn_qkv"):
            L.weight("attn_qkv", [e, e + 2 * kv])
            L.bias("attn_qkv", [e + 2 * kv])
        else:
            for name, n in (("attn_q", e), ("attn_k", kv), ("attn_v", kv)):
                L.weight(name, [e, n])
                L.bias(name, [n])
        L.weight("attn_output", [e, e])
        L.bias("attn_output", [e])
        for norm in ("attn_output_norm", "layer_output_norm"):
            L.weight(norm, [e])
            L.bias(norm, [e], required=True)
        self.load_ffn(L, hp)

    def load_ffn(self, L, hp):
        L.weight("ffn_up", [hp.n_embd, hp.n_ff])
        L.bias("ffn_up", [hp.n_ff])
        L.weight("ffn_down", [hp.n_ff, hp.n_embd])
        L.bias("ffn_down", [hp.n_embd])

    def embed(self, b, w):
        x = b.embed(w.token_embd, pos_embd=w.pos_embd if self.pos_embd else None)
        if w.type_embd is not None:  # every token of type 0 ("sentence A"), as llama.cpp
            x = ops.add(b.ctx, x, ops.view_1d(b.ctx, w.type_embd, b.hp.n_embd, 0))
        return b.norm(x, w.tok_norm, w.tok_norm_b, rms=False)

    def qkv(self, b, il, h, layer):
        q, k, v = b.qkv(h, layer, qk_norms=False)
        q, k = self.full_norm(b, q, layer.attn_q_norm, layer.attn_q_norm_b), \
            self.full_norm(b, k, layer.attn_k_norm, layer.attn_k_norm_b)
        if self.rotary:
            q, k = b.rope(q, il), b.rope(k, il)
        return q, k, v

    def ffn(self, b, h, layer):
        return b.ffn(h, layer, act=self.ffn_act)

    @staticmethod
    def full_norm(b, x, weight, bias):
        """A LayerNorm over all the heads of x [head_dim, n_heads, n_tokens] together (jina's q/k norms)."""
        if weight is None:
            return x
        flat = ops.cont_2d(b.ctx, x, x.ne[0] * x.ne[1], x.ne[2])
        return ops.reshape_3d(b.ctx, b.norm(flat, weight, bias, rms=False), x.ne[0], x.ne[1], x.ne[2])

    def build(self, b, w):
        if not b.embeddings:
            raise ValueError(f"{b.hp.arch} is an encoder: it has no logits; use Model.embed")
        x = self.embed(b, w)
        for il, layer in enumerate(w.layers):
            q, k, v = self.qkv(b, il, x, layer)
            attn = b.attention(il, q, k, v, layer.attn_output, layer.attn_output_b)
            attn, x = b.output_rows(il, attn, x)
            h = b.norm(b.add(attn, x), layer.attn_output_norm, layer.attn_output_norm_b, rms=False)
            if layer.attn_norm_2 is not None:
                h = b.norm(b.add(h, x), layer.attn_norm_2, layer.attn_norm_2_b, rms=False)
            y = b.add(self.ffn(b, h, layer), h)
            x = b.norm(y, layer.layer_output_norm, layer.layer_output_norm_b, rms=False)
        return x

    head_act = staticmethod(torch.tanh)  # the dense classifier layer's activation

    def rank(self, w, hp, hidden: torch.Tensor) -> torch.Tensor:
        """The classifier head (llama.cpp's LLAMA_POOLING_TYPE_RANK) over hidden [n_tokens, n_embd]
        pooled by classifier.pooling_type (mean, or the first token): the dense cls layer and its
        activation, the head norm cls.norm, then the cls.output projection, each where the file
        has it."""
        if w.cls is None and w.cls_out is None:
            raise ValueError(f"{w.path}: pooling 'rank' needs a classifier head (cls / cls.output tensors)")
        x = (hidden.mean(dim=0) if hp.pooling_type_cls == 1 else hidden[0]).float()
        if w.cls is not None:
            x = self.head_act(float_weight(w.cls) @ x + (0 if w.cls_b is None else float_weight(w.cls_b)))
            if w.cls_norm is not None:
                x = torch.nn.functional.layer_norm(x, x.shape, float_weight(w.cls_norm), eps=hp.norm_eps)
        if w.cls_out is not None:
            x = float_weight(w.cls_out) @ x + (0 if w.cls_out_b is None else float_weight(w.cls_out_b))
        return x


def float_weight(t) -> torch.Tensor:
    """A weight's values as float32 on the CPU [rows, cols] (dequantized when it is a block type)."""
    raw = type_traits(t.type).is_quantized
    return dequantize(t.type, to_torch(t, raw=raw).cpu()).float()


class NomicBert(Bert):
    names = ("nomic-bert",)
    rope_type = RopeType.NEOX
    biases = {"attn_output": False}  # llama.cpp reads ffn biases of nomic-bert but never adds them: refused
    pos_embd = False
    rotary = True
    ffn_act = "silu"

    def load_ffn(self, L, hp):
        super().load_ffn(L, hp)
        L.weight("ffn_gate", [hp.n_embd, hp.n_ff])


class JinaBertV3(Bert):
    """jina-bert-v3 (XLM-RoBERTa with rotary positions): bert's layer, NeoX rotary positions
    instead of learned ones."""
    names = ("jina-bert-v3",)
    rope_type = RopeType.NEOX
    pos_embd = False
    rotary = True


class NomicBertMoe(Bert):
    """nomic-bert-moe: nomic-bert's rotary attention with bert's ungated GELU FFN (biases), and
    every moe_every_n_layers-th layer (il % n == 1) a mixture of ungated GELU experts: softmax
    router, weights not renormalised (llama.cpp reads no expert_weights_scale for it)."""
    names = ("nomic-bert-moe",)
    rope_type = RopeType.NEOX
    biases = {"attn_qkv": False, "attn_output": False, "ffn_up": False, "ffn_down": False}
    pos_embd = False
    rotary = True

    def read_hparams(self, hp, keys):
        super().read_hparams(hp, keys)
        hp.moe_every_n_layers = int(keys.get("moe_every_n_layers", 0))

    @staticmethod
    def is_moe(hp, il: int) -> bool:
        return hp.moe_every_n_layers > 0 and il % hp.moe_every_n_layers == 1

    def load_ffn(self, L, hp):
        if not self.is_moe(hp, L.il):
            return super().load_ffn(L, hp)
        e, ff, n = hp.n_embd, hp.n_ff, hp.n_expert
        L.weight("ffn_up_exps", [e, ff, n])
        L.weight("ffn_down_exps", [ff, e, n])
        L.weight("ffn_gate_inp", [e, n])

    def ffn(self, b, h, layer):
        if layer.ffn_gate_inp is None:
            return super().ffn(b, h, layer)
        return b.moe(h, layer, act="gelu", norm_weights=False)


class JinaBertV2(Bert):
    names = ("jina-bert-v2",)
    biases = {"attn_q": False, "attn_k": False, "attn_v": False, "attn_output": True, "ffn_up": False,
              "ffn_down": True}
    pos_embd = False
    type_embd_required = True
    cls_width = 1        # jina's reranker head: one dense output under tanh, no cls.output

    def read_hparams(self, hp, keys):
        super().read_hparams(hp, keys)
        hp.max_alibi_bias = 8.0

    def load_layer(self, L, hp):
        super().load_layer(L, hp)
        e, kv = hp.n_embd, hp.n_embd_k_gqa
        for name, n in (("attn_q_norm", e), ("attn_k_norm", kv)):
            L.weight(name, [n], required=False)
            L.w.add(name + "_b", f"blk.{L.il}.{name}.bias", [n], False, L.layer)
        L.weight("attn_norm_2", [e], required=False)
        L.w.add("attn_norm_2_b", f"blk.{L.il}.attn_norm_2.bias", [e], False, L.layer)

    def load_ffn(self, L, hp):
        """ffn_up [up | gate] twice n_ff wide (GEGLU), or n_ff wide with an optional ffn_gate."""
        up = L.w.tensors.get(f"blk.{L.il}.ffn_up.weight")
        n_up = up.ne[1] if up is not None and up.ne[1] == 2 * hp.n_ff else hp.n_ff
        L.weight("ffn_up", [hp.n_embd, n_up])
        L.bias("ffn_up", [n_up])
        L.weight("ffn_gate", [hp.n_embd, hp.n_ff], required=False)
        L.weight("ffn_down", [hp.n_ff, hp.n_embd])
        L.bias("ffn_down", [hp.n_embd])


class PreNormEncoder(Bert):
    """The pre-norm encoders (modern-bert, neo-bert, eurobert): x += attention(norm(x)),
    x += ffn(norm(x)), a final norm; rotary positions, no biases, no token types. The FFN is a
    fused [gate | up] (GEGLU or SwiGLU) or separate gate and up projections."""
    biases = {}
    rms = True               # RMS norms (LayerNorms without bias when False)
    tok_norm = None          # a norm on the token embeddings (its tensor's name)
    out_norm = "output_norm"
    first_attn_norm = True   # layer 0 has an attention norm (modern-bert's is optional)
    fused_up = True          # ffn_up holds [gate | up]; else ffn_gate and ffn_up apart
    ffn_act = "silu"

    def read_hparams(self, hp, keys):
        hp.ffn_act = self.ffn_act

    def load_weights(self, w, hp):
        e = hp.n_embd
        w.add("token_embd", "token_embd.weight", [e, hp.n_vocab])
        if self.tok_norm:
            w.add("tok_norm", f"{self.tok_norm}.weight", [e])
        w.add("output_norm", f"{self.out_norm}.weight", [e])
        self.load_head(w, hp)
        for il in range(hp.n_layer):
            L = LayerLoader(w, il)
            L.weight("attn_norm", [e], required=self.first_attn_norm or il != 0)
            if L.has("attn_qkv") or not self.fused_qkv_optional:
                L.weight("attn_qkv", [e, e + 2 * hp.n_embd_k_gqa])
            else:
                for name, n in (("attn_q", e), ("attn_k", hp.n_embd_k_gqa), ("attn_v", hp.n_embd_v_gqa)):
                    L.weight(name, [e, n])
            L.weight("attn_output", [e, e])
            L.weight("ffn_norm", [e])
            L.weight("ffn_up", [e, 2 * hp.n_ff if self.fused_up else hp.n_ff])
            if not self.fused_up:
                L.weight("ffn_gate", [e, hp.n_ff])
            L.weight("ffn_down", [hp.n_ff, e])
            w.layers.append(L.layer)

    fused_qkv_optional = False  # attn_q/k/v apart are accepted too (eurobert)

    def load_head(self, w, hp):
        e = hp.n_embd
        w.add("cls", "cls.weight", [e, e], required=False)
        w.add("cls_b", "cls.bias", [e], required=False)
        w.add("cls_out", "cls.output.weight", [e, hp.n_cls_out], required=False)
        w.add("cls_out_b", "cls.output.bias", [hp.n_cls_out], required=False)

    def build(self, b, w):
        if not b.embeddings:
            raise ValueError(f"{b.hp.arch} is an encoder: it has no logits; use Model.embed")
        x = b.embed(w.token_embd)
        if w.tok_norm is not None:
            x = b.norm(x, w.tok_norm, rms=self.rms)
        for il, layer in enumerate(w.layers):
            h = x if layer.attn_norm is None else b.norm(x, layer.attn_norm, rms=self.rms)
            q, k, v = b.qkv(h, layer, qk_norms=False)
            q, k = b.rope(q, il), b.rope(k, il)
            attn = b.add_attention(il, x, b.attention(il, q, k, v, layer.attn_output))
            x = b.add(b.ffn(b.norm(attn, layer.ffn_norm, rms=self.rms), layer, act=b.hp.ffn_act), attn)
        return b.norm(x, w.output_norm, rms=self.rms)


class ModernBert(PreNormEncoder):
    """modern-bert: LayerNorms without biases (on the token embeddings too; none before layer 0's
    attention), NeoX rotary positions, symmetric sliding windows on two layers of three (the
    first dense; their own rope base), GEGLU (SwiGLU when hidden_activation says silu); its
    reranker head pools the mean by default and applies GELU and the head norm cls.norm."""
    names = ("modern-bert",)
    rope_type = RopeType.NEOX
    rms = False
    tok_norm = "token_embd_norm"
    first_attn_norm = False
    head_act = staticmethod(torch.nn.functional.gelu)

    def read_hparams(self, hp, keys):
        hp.n_swa = int(keys.get("attention.sliding_window", 0))
        if hp.n_swa > 0:
            hp.swa_symmetric = True
            hp.rope_freq_base_swa = float(keys.get("rope.freq_base_swa", hp.rope_freq_base))
            hp.rope_freq_scale_swa = hp.rope_freq_scale
            pattern = keys.get_list("attention.sliding_window_pattern")
            if isinstance(pattern, list):
                read_swa_pattern(hp, keys, 3)
            else:  # a period whose first layer is dense (llama.cpp's dense_first)
                n = int(pattern) if pattern is not None else 3
                hp.swa_layers = [n == 0 or il % n != 0 for il in range(hp.n_layer)]
        act = str(keys.get("hidden_activation", "gelu")).lower()
        hp.ffn_act = "silu" if act in ("silu", "swiglu") else "gelu"
        if hp.pooling_type_cls == -1:  # files without a classifier pooling type pool the mean
            hp.pooling_type_cls = 1

    def load_weights(self, w, hp):
        if hp.n_embd_k_gqa != hp.n_embd:
            raise GGUFError(f"{w.path}: modern-bert needs as many K/V heads as heads ({hp.n_head_kv} of {hp.n_head})")
        super().load_weights(w, hp)

    def load_head(self, w, hp):
        e = hp.n_embd
        w.add("cls", "cls.weight", [e, e], required=False)
        w.add("cls_norm", "cls.norm.weight", [e], required=False)
        w.add("cls_out", "cls.output.weight", [e, hp.n_cls_out], required=False)
        w.add("cls_out_b", "cls.output.bias", [hp.n_cls_out], required=False)


class NeoBert(PreNormEncoder):
    """neo-bert: RMS pre-norms, normal rotary positions, one fused attn_qkv, SwiGLU from a fused
    [gate | up], the final norm enc.output_norm; a tanh reranker head (cls, cls.output)."""
    names = ("neo-bert",)
    rope_type = RopeType.NORMAL
    out_norm = "enc.output_norm"


class EuroBert(PreNormEncoder):
    """eurobert: llama's layer without the causal mask: RMS pre-norms, NeoX rotary positions,
    q/k/v apart (or fused), a SwiGLU FFN with its own gate; no classifier head."""
    names = ("eurobert",)
    rope_type = RopeType.NEOX
    fused_up = False
    fused_qkv_optional = True

    def load_head(self, w, hp):
        pass


ARCHS = [Bert(), JinaBertV3(), NomicBert(), NomicBertMoe(), JinaBertV2(), ModernBert(), NeoBert(), EuroBert()]
