"""Google's Gemma 3n (gemma3n), the text model: gemma3's layer (embeddings scaled by sqrt(n_embd),
RMS q/k norms, V RMS-normed without a weight, unscaled attention, post-norms, GELU-gated FFN,
four of five layers sliding) with
- AltUp: the hidden state is N_ALTUP streams (the embeddings and altup_proj's projections of
  them, rescaled to their magnitude); each layer predicts every stream from all of them with
  coefficients routed by the active stream (altup_predict_coef), runs the active stream's
  prediction through attention and FFN, then corrects every stream by the innovation
  (altup_correct_coef) and adds the per-layer embedding's gated projection to the other streams;
  the output averages the active stream with the others' altup_unembd_proj projections;
- LAuReL: a low-rank (laurel_l, laurel_r) normed residual beside attention;
- activation sparsity: the first N_LAYER_SPARSITY layers keep only the FFN gate values above
  mean + 1.645 std of each token's (a Gaussian top 5%);
- per-layer token embeddings as gemma4's, N_EMBD_ALTUP wide;
- layers from N_LAYER_KV on reuse the KV cache of the last earlier layer of their kind;
- logits soft-capped at 30.
The constants are llama.cpp's (fixed there, not read from the file).
"""
from __future__ import annotations

import math

from ... import ops
from ...enums import RopeType
from ..builder import Arch, load_attention, load_ffn
from ..hparams import read_swa_pattern
from .gemma4 import kv_source, load_per_layer_inputs, per_layer_inputs, per_layer_slice

N_ALTUP, ALTUP_ACTIVE, LAUREL_RANK, N_EMBD_ALTUP = 4, 0, 64, 256
N_LAYER_KV, N_LAYER_SPARSITY, SPARSITY_STD_MUL = 20, 10, 1.6448533535003662
FINAL_SOFTCAP = 30.0


def stream(ctx, x, i: int):
    """Stream i [n_embd, n_tokens] of x [n_embd, n_tokens, n_streams]."""
    return ops.view_2d(ctx, x, x.ne[0], x.ne[1], x.nb[1], i * x.nb[2])


def magnitude(ctx, x):
    return ops.sqrt(ctx, ops.sum_rows(ctx, ops.sqr(ctx, x)))


def rescaled(ctx, x, target):
    """x with each row's magnitude set to target's."""
    return ops.div(ctx, ops.mul(ctx, x, magnitude(ctx, target)), magnitude(ctx, x))


class Gemma3n(Arch):
    names = ("gemma3n",)
    rope_type = RopeType.NEOX
    biases = {}
    rope_freqs = False

    def read_hparams(self, hp, keys):
        read_swa_pattern(hp, keys, 5)
        hp.n_swa = int(keys.get("attention.sliding_window"))
        hp.rope_freq_base_swa = float(keys.get("rope.freq_base_swa", 10000.0))
        hp.rope_freq_scale_swa = 1.0
        hp.attention_scale = 1.0
        hp.n_layer_kv = N_LAYER_KV if hp.n_layer > N_LAYER_KV else 0
        hp.n_embd_per_layer = N_EMBD_ALTUP
        hp.final_softcap = FINAL_SOFTCAP
        hp.nodes_per_layer = 160

    def load_weights(self, w, hp):
        e = hp.n_embd
        w.add("altup_proj", "altup_proj.weight", [e, e, N_ALTUP - 1])
        w.add("altup_unembd_proj", "altup_unembd_proj.weight", [e, e, N_ALTUP - 1])
        load_per_layer_inputs(w, hp)
        super().load_weights(w, hp)

    def load_layer(self, L, hp):
        e = hp.n_embd
        load_attention(L, hp, qk_norm=True)
        L.weight("post_attention_norm", [e])
        load_ffn(L, hp)
        L.weight("post_ffw_norm", [e])
        for name, ne in (("inp_gate", [e, N_EMBD_ALTUP]), ("proj", [N_EMBD_ALTUP, e]), ("post_norm", [e]),
                         ("altup_correct_coef", [N_ALTUP, N_ALTUP]), ("altup_correct_scale", [e]),
                         ("altup_predict_coef", [N_ALTUP, N_ALTUP * N_ALTUP]), ("altup_router", [e, N_ALTUP]),
                         ("altup_router_norm", [e]), ("laurel_l", [e, LAUREL_RANK]), ("laurel_r", [LAUREL_RANK, e]),
                         ("laurel_post_norm", [e])):
            L.weight(name, ne)

    @staticmethod
    def modalities(b, layer, x):
        """The router's [N_ALTUP, n_tokens] from the active stream x."""
        h = ops.scale(b.ctx, b.norm(x, layer.altup_router_norm), 1.0 / b.hp.n_embd)
        return ops.tanh(b.ctx, b.linear(h, layer.altup_router))

    def predict(self, b, layer, x):
        """Every stream predicted from all of them: x [n_embd, n, N_ALTUP] -> the same shape."""
        ctx, n = b.ctx, x.ne[1]
        coefs = b.linear(self.modalities(b, layer, stream(ctx, x, ALTUP_ACTIVE)), layer.altup_predict_coef)
        coefs = ops.reshape_3d(ctx, coefs, N_ALTUP, N_ALTUP, n)
        mixed = ops.mul_mat(ctx, ops.cont(ctx, ops.permute(ctx, x, 1, 2, 0, 3)), coefs)  # [n_embd, N_ALTUP, n]
        return ops.add(ctx, ops.cont(ctx, ops.permute(ctx, mixed, 0, 2, 1, 3)), x)

    def correct(self, b, layer, predictions, activated):
        """Every stream corrected by the innovation activated - its active prediction."""
        ctx, (e, n) = b.ctx, activated.ne[:2]
        innovation = ops.sub(ctx, activated, stream(ctx, predictions, ALTUP_ACTIVE))
        coefs = ops.scale_bias(ctx, b.linear(self.modalities(b, layer, activated), layer.altup_correct_coef), 1.0, 1.0)
        coefs = ops.cont_3d(ctx, ops.transpose(ctx, coefs), 1, n, N_ALTUP)                 # [1, n, N_ALTUP]
        return ops.add(ctx, ops.mul(ctx, ops.repeat_4d(ctx, innovation, e, n, N_ALTUP, 1), coefs), predictions)

    @staticmethod
    def sparse_gate(b, x):
        """x's values above mean + SPARSITY_STD_MUL std (per token) minus that cutoff, others 0."""
        ctx = b.ctx
        mean = ops.mean(ctx, x)
        var = ops.scale(ctx, ops.sum_rows(ctx, ops.sqr(ctx, ops.sub(ctx, x, mean))), 1.0 / (x.ne[0] - 1))
        cutoff = ops.add(ctx, mean, ops.scale(ctx, ops.sqrt(ctx, var), SPARSITY_STD_MUL))
        return ops.relu(ctx, ops.sub(ctx, x, cutoff))

    def attention(self, b, il, h, layer):
        hp, ctx = b.hp, b.ctx
        if hp.has_kv(il):
            q, k, v = b.qkv(h, layer)
            v = ops.rms_norm(ctx, v, hp.norm_eps)
            q, k = b.rope(q, il), b.rope(k, il)
            return b.attention(il, q, k, v, layer.attn_output, kq_scale=1.0)
        q = ops.reshape_3d(ctx, b.linear(h, layer.attn_q), hp.head_dim_k, hp.n_head, h.ne[1])
        q = b.rope(b.norm(q, layer.attn_q_norm), il)
        return b.attention(il, q, None, None, layer.attn_output, kq_scale=1.0, kv_from=kv_source(hp, il))

    def layer(self, b, il, layer, x, inputs):
        ctx = b.ctx
        predictions = self.predict(b, layer, x)
        active = stream(ctx, predictions, ALTUP_ACTIVE)
        h = b.norm(active, layer.attn_norm)
        laurel = b.norm(b.linear(b.linear(h, layer.laurel_l), layer.laurel_r), layer.laurel_post_norm)
        laurel = b.add(laurel, h)
        attn = b.add(b.norm(self.attention(b, il, h, layer), layer.post_attention_norm), active)
        attn = ops.scale(ctx, b.add(attn, laurel), 1.0 / math.sqrt(2.0))
        h = b.norm(attn, layer.ffn_norm)
        up, gate = b.linear(h, layer.ffn_up), b.linear(h, layer.ffn_gate)
        if il < N_LAYER_SPARSITY:
            gate = self.sparse_gate(b, gate)
        h = b.linear(ops.mul(ctx, up, ops.gelu(ctx, gate)), layer.ffn_down)
        out = b.add(b.norm(h, layer.post_ffw_norm), attn)
        corrected = self.correct(b, layer, predictions, out)
        first = ops.mul(ctx, stream(ctx, corrected, ALTUP_ACTIVE), layer.altup_correct_scale)
        first = ops.gelu(ctx, b.linear(first, layer.inp_gate))
        first = b.norm(b.linear(ops.mul(ctx, first, per_layer_slice(b, inputs, il, rows=False)), layer.proj),
                       layer.post_norm)
        rest = ops.view_3d(ctx, corrected, x.ne[0], x.ne[1], N_ALTUP - 1, corrected.nb[1], corrected.nb[2],
                           corrected.nb[2])
        return ops.concat(ctx, stream(ctx, corrected, 0), ops.add(ctx, rest, first), 2)

    def build(self, b, w):
        hp, ctx = b.hp, b.ctx
        x = b.embed(w.token_embd, math.sqrt(hp.n_embd))
        inputs = per_layer_inputs(b, w, x)
        others = ops.mul_mat(ctx, w.altup_proj, ops.repeat_4d(ctx, x, hp.n_embd, x.ne[1], N_ALTUP - 1, 1))
        x = ops.concat(ctx, x, rescaled(ctx, others, x), 2)                  # [n_embd, n_tokens, N_ALTUP]
        for il, layer in enumerate(w.layers):
            x = self.layer(b, il, layer, x, inputs)
        active = stream(ctx, x, ALTUP_ACTIVE)
        rest = ops.view_3d(ctx, x, x.ne[0], x.ne[1], N_ALTUP - 1, x.nb[1], x.nb[2], x.nb[2])
        unembedded = rescaled(ctx, ops.mul_mat(ctx, w.altup_unembd_proj, rest), active)
        merged = stream(ctx, x, 0)
        for i in range(N_ALTUP - 1):
            merged = ops.add(ctx, merged, stream(ctx, unembedded, i))
        merged = b.output_rows(hp.n_layer - 1, ops.scale(ctx, merged, 1.0 / N_ALTUP))[0]
        return b.output(merged, w, softcap=hp.final_softcap)


ARCHS = [Gemma3n()]
