"""qwen3next (Qwen3-Next): gated delta-net linear attention in most layers, gated full attention
in every full_attention_interval-th layer (hybrid memory); every layer's FFN is a mixture of
experts with a sigmoid-gated shared expert.

Per layer: x += mixer(rms_norm(x)); x += moe(rms_norm_post(x)). Linear attention: q, k, v
through a causal convolution (r state) and silu, q and k L2-normed and repeated to the value
heads, beta = sigmoid(b), decay g = softplus(a + dt_bias) * ssm_a, gated_delta_net over the
per-head state (s state), an RMS norm gated by silu(z), ssm_out. Full attention: the query
projection holds [query | gate] per head; q/k RMS norms, NeoX rotary, output * sigmoid(gate).
"""
from __future__ import annotations

from ... import ops
from ...enums import RopeType
from ...gguf.loader import GGUFError
from ..builder import load_moe, load_shared_expert
from ..recurrent_layers import HybridArch, causal_conv, delta_rule, read_ssm
from .glm4moe import skip_nextn_layers


def read_gdn_layers(hp, keys) -> None:
    """Which layers are linear attention: attention.recurrent_layers (one flag per block, the
    prediction blocks' included), else all but every full_attention_interval-th; the last
    nextn_predict_layers blocks (multi-token prediction) are skipped, as llama.cpp does."""
    n_all = hp.n_layer
    skip_nextn_layers(hp, keys)
    flags = keys.get_list("attention.recurrent_layers")
    if isinstance(flags, list):
        if len(flags) != n_all:
            raise GGUFError(f"{keys.f.path}: {keys.arch}.attention.recurrent_layers has {len(flags)} entries "
                            f"for {n_all} blocks")
        hp.recurrent_layers = [bool(f) for f in flags[:hp.n_layer]]
    else:
        interval = int(keys.get("full_attention_interval", 4))
        hp.recurrent_layers = [(il + 1) % interval != 0 for il in range(hp.n_layer)]


class Qwen3Next(HybridArch):
    names = ("qwen3next",)
    rope_type = RopeType.NEOX

    tiled_heads = False  # value head h reads key head h // (hv / hk); qwen35: h % hk

    def read_hparams(self, hp, keys):
        read_ssm(hp, keys, mamba2=True)
        read_gdn_layers(hp, keys)

    def is_recurrent(self, hp, il):
        return hp.recurrent_layers[il]

    def has_attention(self, hp, il):
        return not hp.recurrent_layers[il]

    def load_layer(self, L, hp):
        e, s = hp.n_embd, hp.ssm
        L.weight("attn_norm", [e])
        L.weight("post_attention_norm", [e])
        if self.is_recurrent(hp, L.il):
            value_dim = s.d_inner
            if L.has("ssm_in"):  # the first GGUFs: q, k, v and z fused, grouped by key head
                L.weight("ssm_in", [e, s.conv_channels + value_dim])
            else:
                L.weight("attn_qkv", [e, s.conv_channels])
                L.weight("attn_gate", [e, value_dim])
            L.weight("ssm_conv1d", [s.d_conv, s.conv_channels])
            L.bias("ssm_dt", [s.dt_rank], required=True)
            L.w.add("ssm_a", f"blk.{L.il}.ssm_a", [s.dt_rank], True, L.layer)
            self.load_gates(L, hp)
            L.weight("ssm_norm", [s.d_state])
            L.weight("ssm_out", [value_dim, e])
        else:
            q = hp.head_dim_k * hp.n_head
            L.weight("attn_q", [e, 2 * q])
            L.weight("attn_k", [e, hp.n_embd_k_gqa])
            L.weight("attn_v", [e, hp.n_embd_v_gqa])
            L.weight("attn_q_norm", [hp.head_dim_k])
            L.weight("attn_k_norm", [hp.head_dim_k])
            L.weight("attn_output", [q, e])
        self.load_ffn(L, hp)

    def load_gates(self, L, hp):
        """beta and alpha's projection: one [beta | alpha] per key head."""
        L.weight("ssm_ba", [hp.n_embd, 2 * hp.ssm.dt_rank])

    def gates(self, b, h, layer):
        """beta [1, hv, nt, ns] (sigmoid applied) and alpha [hv, nt, ns] (before dt_bias) of the
        micro-batch's tokens."""
        ctx, hk, hv = b.ctx, b.hp.ssm.n_group, b.hp.ssm.dt_rank
        nt, ns = b.n_seq_tokens, b.n_seqs
        ba = ops.reshape_4d(ctx, b.linear(h, layer.ssm_ba), 2 * hv // hk, hk, nt, ns)
        beta = ops.view_4d(ctx, ba, hv // hk, hk, nt, ns, ba.nb[1], ba.nb[2], ba.nb[3], 0)
        alpha = ops.view_4d(ctx, ba, hv // hk, hk, nt, ns, ba.nb[1], ba.nb[2], ba.nb[3], hv // hk * ba.nb[0])
        beta = ops.reshape_4d(ctx, ops.sigmoid(ctx, ops.cont(ctx, beta)), 1, hv, nt, ns)
        return beta, ops.cont_3d(ctx, alpha, hv, nt, ns)

    def load_ffn(self, L, hp):
        """The experts and the sigmoid-gated shared expert (post_attention_norm is their input norm)."""
        load_moe(L, hp, hp.n_ff_exp or hp.n_ff // hp.n_expert_used, norm=None)
        load_shared_expert(L, hp, hp.n_ff_shexp or hp.n_ff)

    def ffn(self, b, h, layer):
        return b.add(b.moe(h, layer), b.shared_expert(h, layer))

    def gated_attention(self, b, il, h, layer):
        ctx, hp, n = b.ctx, b.hp, b.n_tokens
        hd = hp.head_dim_k
        qg = ops.reshape_3d(ctx, b.linear(h, layer.attn_q), 2 * hd, hp.n_head, n)
        q = ops.view_3d(ctx, qg, hd, hp.n_head, n, qg.nb[1], qg.nb[2], 0)
        gate = ops.view_3d(ctx, qg, hd, hp.n_head, n, qg.nb[1], qg.nb[2], hd * qg.nb[0])
        k = ops.reshape_3d(ctx, b.linear(h, layer.attn_k), hd, hp.n_head_kv, n)
        v = ops.reshape_3d(ctx, b.linear(h, layer.attn_v), hd, hp.n_head_kv, n)
        q, k = b.rope(b.norm(q, layer.attn_q_norm), il), b.rope(b.norm(k, layer.attn_k_norm), il)
        out = b.attention(il, q, k, v, None)
        out = ops.mul(ctx, out, ops.sigmoid(ctx, ops.cont_2d(ctx, gate, hd * hp.n_head, n)))
        return b.linear(out, layer.attn_output)

    def qkvz(self, b, h, layer):
        """q, k, v as one [conv_channels, n_seq_tokens, n_seqs] row per token (the convolution's
        input) and the output gate z: two projections, or the first GGUFs' one ssm_in whose rows
        hold [q | k | v | z] per key head, regrouped here as the newer files store them."""
        ctx, s, nt, ns = b.ctx, b.hp.ssm, b.n_seq_tokens, b.n_seqs
        if layer.ssm_in is None:
            return (ops.reshape_3d(ctx, b.linear(h, layer.attn_qkv), s.conv_channels, nt, ns),
                    b.linear(h, layer.attn_gate))
        dk, hk = s.d_state, s.n_group
        dvg = s.d_inner // hk                                       # value (and z) width per key head
        m = ops.reshape_4d(ctx, b.linear(h, layer.ssm_in), 2 * dk + 2 * dvg, hk, nt, ns)

        def part(width, start):
            return ops.view_4d(ctx, m, width, hk, nt, ns, m.nb[1], m.nb[2], m.nb[3], start * m.nb[0])
        q, k, v = (ops.cont_3d(ctx, part(w, o), w * hk, nt, ns) for w, o in ((dk, 0), (dk, dk), (dvg, 2 * dk)))
        return ops.concat(ctx, ops.concat(ctx, q, k, 0), v, 0), ops.cont(ctx, part(dvg, 2 * dk + dvg))

    def linear_attention(self, b, il, h, layer):
        ctx, hp, s = b.ctx, b.hp, b.hp.ssm
        nt, ns = b.n_seq_tokens, b.n_seqs
        dk, hk, hv = s.d_state, s.n_group, s.dt_rank
        dv = s.d_inner // hv
        qkv, z = self.qkvz(b, h, layer)
        z = ops.reshape_4d(ctx, z, dv, hv, nt, ns)
        beta, alpha = self.gates(b, h, layer)
        alpha = ops.add(ctx, alpha, layer.ssm_dt_b)
        decay = ops.reshape_4d(ctx, ops.mul(ctx, ops.softplus(ctx, alpha), layer.ssm_a), 1, hv, nt, ns)
        conv = ops.silu(ctx, causal_conv(b, il, qkv, layer.ssm_conv1d, None))     # [conv_channels, nt, ns]
        row = conv.nb[1]
        q = ops.view_4d(ctx, conv, dk, hk, nt, ns, dk * 4, row, row * nt, 0)
        k = ops.view_4d(ctx, conv, dk, hk, nt, ns, dk * 4, row, row * nt, dk * hk * 4)
        v = ops.view_4d(ctx, conv, dv, hv, nt, ns, dv * 4, row, row * nt, 2 * dk * hk * 4)
        if hk != hv and not self.tiled_heads:  # each key head serves hv / hk consecutive value heads
            # (tiled: the op reads key head h % hk itself)
            def repeated(t):
                t = ops.reshape_4d(ctx, ops.cont(ctx, t), dk, 1, hk, nt * ns)
                return ops.reshape_4d(ctx, ops.repeat_4d(ctx, t, dk, hv // hk, hk, nt * ns), dk, hv, nt, ns)
            q, k = repeated(q), repeated(k)
        y = delta_rule(b, il, q, k, v, decay, beta)
        y = ops.mul(ctx, b.norm(y, layer.ssm_norm), ops.silu(ctx, z))
        y = b.linear(ops.reshape_3d(ctx, y, dv * hv, nt, ns), layer.ssm_out)
        return ops.reshape_2d(ctx, y, hp.n_embd, b.n_tokens)

    def build(self, b, w):
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            h = b.norm(x, layer.attn_norm)
            mixer = self.linear_attention if self.is_recurrent(b.hp, il) else self.gated_attention
            x = b.add_attention(il, x, mixer(b, il, h, layer))
            x = b.add(x, self.ffn(b, b.norm(x, layer.post_attention_norm), layer))
        return b.output(x, w)


ARCHS = [Qwen3Next()]
