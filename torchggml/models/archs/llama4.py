"""Llama 4 (llama4): llama's layer with interleaved attention and interleaved experts.
- Attention: three of every four layers attend within chunks of 8192 positions (a token sees the
  earlier tokens of its own chunk) and rotate (optional rope_freqs); every fourth layer attends
  over everything with no positions (NoPE), its queries scaled by the temperature
  1 + 0.1 log(floor((p + 1) / 8192) + 1). The rotated queries and keys are RMS-normed (no
  weight) except in the 128-expert model. A file with attention.sliding_window 0 (no chunks)
  is refused: llama.cpp's graph for it asserts (its temperature input is then unset).
- FFN: every interleave_moe_layer_step-th layer a mixture of experts chosen by the router's raw
  logits, each chosen expert's input scaled by the sigmoid of its logit, plus a shared expert;
  the other layers a SwiGLU.
"""
from __future__ import annotations

from ... import ops
from ...enums import RopeType
from ...gguf.loader import GGUFError
from ..builder import Arch, load_attention, load_ffn, load_moe, load_shared_expert
from ..hparams import read_swa_pattern
from .dense import LLAMA_BIASES

CHUNK = 8192  # llama.cpp's attention chunk and temperature floor for llama4
NO_ROPE_STEP = 4


class Llama4(Arch):
    names = ("llama4",)
    rope_type = RopeType.NORMAL
    rope_freqs = True
    biases = LLAMA_BIASES
    fused_qkv = True

    def read_hparams(self, hp, keys):
        if not hp.n_expert:
            raise GGUFError(f"{keys.f.path}: {keys.arch} has no experts (expert_count 0)")
        hp.n_moe_layer_step = int(keys.get("interleave_moe_layer_step"))
        window = keys.get("attention.sliding_window", None)
        if window is not None and int(window) == 0:
            raise GGUFError(f"{keys.f.path}: {keys.arch}.attention.sliding_window 0 (no attention chunks) is not "
                            f"supported (llama.cpp cannot run it either)")
        hp.n_swa, hp.swa_chunked, hp.attn_temp_scale = CHUNK, True, 0.1
        read_swa_pattern(hp, keys, 4)
        hp.rope_freq_base_swa = float(keys.get("rope.freq_base_swa", hp.rope_freq_base))
        hp.rope_freq_scale_swa = hp.rope_freq_scale
        hp.kq_norm = hp.n_expert != 128

    def is_moe(self, hp, il):
        return hp.n_moe_layer_step > 0 and (il + 1) % hp.n_moe_layer_step == 0

    def load_layer(self, L, hp):
        load_attention(L, hp)
        if self.is_moe(hp, L.il):
            load_moe(L, hp)
            load_shared_expert(L, hp, hp.n_ff_exp, gate_inp=False)
        else:
            load_ffn(L, hp)

    def build(self, b, w):
        hp, ctx = b.hp, b.ctx
        temp = b.attn_temperature(hp.attn_temp_scale, CHUNK, 1.0) if hp.attn_temp_scale else None
        x = b.embed(w.token_embd)
        for il, layer in enumerate(w.layers):
            q, k, v = b.qkv(b.norm(x, layer.attn_norm), layer)
            if (il + 1) % NO_ROPE_STEP != 0:
                q, k = b.rope(q, il, w.rope_freqs), b.rope(k, il, w.rope_freqs)
                if hp.kq_norm:
                    q, k = ops.rms_norm(ctx, q, hp.norm_eps), ops.rms_norm(ctx, k, hp.norm_eps)
            elif temp is not None:
                q = ops.mul(ctx, q, temp)
            x = b.add_attention(il, x, b.attention(il, q, k, v, layer.attn_output, layer.attn_output_b))
            h = b.norm(x, layer.ffn_norm)
            if layer.ffn_gate_inp is None:
                h = b.ffn(h, layer)
            else:
                h = b.add(b.moe(h, layer, norm_weights=False, gating="sigmoid", weight_inputs=True),
                          b.ffn(h, layer, suffix="_shexp"))
            x = b.add(x, h)
        return b.output(x, w)


ARCHS = [Llama4()]
