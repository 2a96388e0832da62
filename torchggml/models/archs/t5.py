"""T5 (t5: encoder-decoder) and its encoder alone (t5encoder: embeddings).

Both are pre-norm layers with RMS norms, unscaled attention (scale 1) biased by T5's relative
positions: each pair's distance falls in one of attention.relative_buckets_count buckets (half
per direction in the encoder, looking back only in the decoder), whose bias per head is a row of
attn_rel_b (layer 0's in the layers without their own). The FFN is GELU-gated where the layer has
ffn_gate (flan-T5), a ReLU MLP otherwise (T5).
- Encoder (enc.*): attention over the whole input, then enc.output_norm. Model.encode runs it
  once over the prompt; t5encoder's Model.embed pools its output.
- Decoder (dec.*): causal self-attention over its KV cache, then cross-attention (no position
  bias) over the encoder's output, then the FFN, dec.output_norm and the head (tied to
  token_embd when the file has no output.weight). Its first token is decoder_start_token_id.
"""
from __future__ import annotations

from ... import ops
from ...gguf.loader import GGUFError
from ..builder import Arch, Layer


def _load_block(w, hp, il: int, prefix: str, parts: tuple[str, ...]) -> dict:
    """One T5 layer's tensors under prefix ("enc" or "dec"): norms, projections of each attention
    part ("attn", "cross_attn"), the optional relative bias, the FFN (ffn_gate optional)."""
    e, q, kv, layer = hp.n_embd, hp.head_dim_k * hp.n_head, hp.n_embd_k_gqa, w.layers[il]

    def add(name, ne, required=True):
        return w.add(f"{prefix}_{name}", f"{prefix}.blk.{il}.{name}.weight", ne, required, layer)
    for part in parts:
        add(f"{part}_norm", [e])
        add(f"{part}_q", [e, q])
        add(f"{part}_k", [e, kv])
        add(f"{part}_v", [e, hp.n_embd_v_gqa])
        add(f"{part}_o", [hp.head_dim_v * hp.n_head, e])
    add("attn_rel_b", [hp.n_head, hp.n_rel_buckets], required=False)
    add("ffn_norm", [e])
    add("ffn_gate", [e, hp.n_ff], required=False)
    add("ffn_up", [e, hp.n_ff])
    add("ffn_down", [hp.n_ff, e])
    return layer


class T5Encoder(Arch):
    names = ("t5encoder",)
    biases = {}
    encoder = True
    prefixes = ("enc",)

    def read_hparams(self, hp, keys):
        hp.n_rel_buckets = int(keys.get("attention.relative_buckets_count"))
        if hp.head_dim_k != hp.head_dim_v:
            raise GGUFError(f"{keys.f.path}: {keys.arch} needs key_length == value_length")
        hp.attention_scale = 1.0
        if self.encoder:
            hp.causal_attn = False

    def load_weights(self, w, hp):
        e = hp.n_embd
        w.add("token_embd", "token_embd.weight", [e, hp.n_vocab])
        w.add("enc_output_norm", "enc.output_norm.weight", [e])
        if "dec" in self.prefixes:
            w.add("output_norm", "dec.output_norm.weight", [e])
        w.globals["output"] = w.add("output", "output.weight", [e, hp.n_vocab], required=False) or w.token_embd
        w.layers = [Layer() for _ in range(hp.n_layer)]
        for il in range(hp.n_layer):
            _load_block(w, hp, il, "enc", ("attn",))
            if "dec" in self.prefixes:
                _load_block(w, hp, il, "dec", ("attn", "cross_attn"))

    @staticmethod
    def ffn(b, x, layer, prefix: str):
        gate = layer[f"{prefix}_ffn_gate"]
        h = b.norm(x, layer[f"{prefix}_ffn_norm"])
        up = b.linear(h, layer[f"{prefix}_ffn_up"])
        h = ops.relu(b.ctx, up) if gate is None else b.activate(b.linear(h, gate), up, "gelu")
        return b.linear(h, layer[f"{prefix}_ffn_down"])

    def block(self, b, w, x, il, prefix: str, bidirectional: bool, cross=None):
        """One layer: self-attention with the relative bias, cross-attention over `cross` (the
        encoder's output, decoder only), FFN; residuals around each."""
        hp, ctx, n = b.hp, b.ctx, x.ne[1]
        layer, first = w.layers[il], w.layers[0]
        d, nh, nkv = hp.head_dim_k, hp.n_head, hp.n_head_kv
        h = b.norm(x, layer[f"{prefix}_attn_norm"])
        q = ops.reshape_3d(ctx, b.linear(h, layer[f"{prefix}_attn_q"]), d, nh, n)
        k = ops.reshape_3d(ctx, b.linear(h, layer[f"{prefix}_attn_k"]), d, nkv, n)
        v = ops.reshape_3d(ctx, b.linear(h, layer[f"{prefix}_attn_v"]), d, nkv, n)
        rel_b = layer[f"{prefix}_attn_rel_b"] if layer[f"{prefix}_attn_rel_b"] is not None else first[f"{prefix}_attn_rel_b"]
        if rel_b is None:
            raise GGUFError(f"{hp.arch}: {prefix}.blk.0.attn_rel_b.weight is missing (the relative position bias)")
        if prefix == "enc":  # the whole input at once, no cache (as llama.cpp's encoder): one sequence
            kq_b = b.relative_bias(rel_b, hp.n_rel_buckets, bidirectional, cached=False)
            k, v = ops.permute(ctx, k, 0, 2, 1, 3), ops.permute(ctx, v, 0, 2, 1, 3)
            h = b.linear(b.attend(q, k, v, None, 1.0, kq_b=kq_b), layer["enc_attn_o"])
        else:
            kq_b = b.relative_bias(rel_b, hp.n_rel_buckets, bidirectional)
            h = b.attention(il, q, k, v, layer["dec_attn_o"], kq_b=kq_b)
        if cross is None:
            h, x = b.output_rows(il, h, x)
        x = b.add(h, x)
        if cross is not None:
            h = b.norm(x, layer["dec_cross_attn_norm"])
            q = ops.reshape_3d(ctx, b.linear(h, layer["dec_cross_attn_q"]), d, nh, n)
            n_enc = cross.ne[1]
            k = ops.permute(ctx, ops.reshape_3d(ctx, b.linear(cross, layer["dec_cross_attn_k"]), d, nkv, n_enc), 0, 2, 1, 3)
            v = ops.permute(ctx, ops.reshape_3d(ctx, b.linear(cross, layer["dec_cross_attn_v"]), d, nkv, n_enc), 0, 2, 1, 3)
            h = b.linear(b.attend(q, k, v, None, 1.0), layer["dec_cross_attn_o"])
            h, x = b.output_rows(il, h, x)
            x = b.add(h, x)
        return b.add(self.ffn(b, x, layer, prefix), x)

    def build(self, b, w):
        if not b.embeddings:
            raise ValueError(f"{b.hp.arch} is an encoder: it has no logits; use Model.embed")
        return self.encode(b, w)

    def encode(self, b, w):
        x = b.embed(w.token_embd)
        for il in range(b.hp.n_layer):
            x = self.block(b, w, x, il, "enc", bidirectional=True)
        return b.norm(x, w.enc_output_norm)


class T5(T5Encoder):
    names = ("t5",)
    encoder = False
    encoder_decoder = True
    prefixes = ("enc", "dec")

    def read_hparams(self, hp, keys):
        super().read_hparams(hp, keys)
        hp.dec_start_token_id = int(keys.get("decoder_start_token_id", -1))
        n_dec = int(keys.get("decoder_block_count", hp.n_layer))
        if n_dec != hp.n_layer:
            raise GGUFError(f"{keys.f.path}: t5 with {n_dec} decoder layers and {hp.n_layer} encoder layers is not "
                            f"supported (only as many of each)")

    def build(self, b, w):
        """The encoder's graph with `embeddings` (Model.encode, non-causal), else the decoder's."""
        if b.embeddings:
            return self.encode(b, w)
        if b.cross is None:
            raise ValueError(f"{b.hp.arch}: the decoder needs the encoder's output: call Model.encode first")
        x = b.embed(w.token_embd)
        for il in range(b.hp.n_layer):
            x = self.block(b, w, x, il, "dec", bidirectional=False, cross=b.cross)
        return b.output(x, w)


ARCHS = [T5Encoder(), T5()]
