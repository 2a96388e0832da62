"""jamba and granitehybrid: Mamba layers and attention layers in one stack (hybrid memory).

Per layer: h = rms_norm(x); h = mixer(h) (Mamba where attention.head_count_kv is 0, else
attention); x += h; x += ffn(rms_norm(x)), the FFN dense or (where the layer has ffn_gate_inp)
mixture-of-experts. jamba: Mamba-1 mixers with RMS norms on dt/B/C, attention without rotary
positions, experts not renormalised. granitehybrid (IBM Granite 4.0): Mamba-2 mixers, rotary
attention, Granite's embedding / residual / attention / logit scales, renormalised experts plus a
shared expert.
"""
from __future__ import annotations

from ... import ops
from ...enums import RopeType
from ..builder import load_attention, load_ffn, load_moe, load_shared_expert
from ..recurrent_layers import HybridArch, attention_no_rope, load_mamba, load_mamba2, mamba_mixer, mamba2_mixer


class Jamba(HybridArch):
    names = ("jamba",)
    mamba2 = False
    renorm_experts = False

    def load_layer(self, L, hp):
        if self.is_recurrent(hp, L.il):
            L.weight("attn_norm", [hp.n_embd])
            (load_mamba2 if self.mamba2 else load_mamba)(L, hp)
        else:
            load_attention(L, hp)
        if L.has("ffn_gate_inp"):
            load_moe(L, hp)
            if hp.n_ff_shexp:
                load_shared_expert(L, hp, hp.n_ff_shexp, gate_inp=False)
        else:
            load_ffn(L, hp)

    def mixer(self, b, il, h, layer):
        if self.is_recurrent(b.hp, il):
            return (mamba2_mixer if self.mamba2 else mamba_mixer)(b, il, h, layer)
        return attention_no_rope(b, il, h, layer)

    def ffn(self, b, h, layer):
        if layer.ffn_gate_inp is None:
            return b.ffn(h, layer)
        out = b.moe(h, layer, norm_weights=self.renorm_experts)
        return out if layer.ffn_up_shexp is None else b.add(out, b.shared_expert(h, layer))

    def scaled(self, b, x):
        return x

    def build(self, b, w):
        x = b.embed(w.token_embd, getattr(b.hp, "embedding_scale", 0.0) or 1.0)
        for il, layer in enumerate(w.layers):
            x = b.add_attention(il, x, self.scaled(b, self.mixer(b, il, b.norm(x, layer.attn_norm), layer)))
            x = b.add(x, self.scaled(b, self.ffn(b, b.norm(x, layer.ffn_norm), layer)))
        return b.output(x, w, scale=1.0 / getattr(b.hp, "granite_logit_scale", 1.0))


class GraniteHybrid(Jamba):
    names = ("granitehybrid",)
    rope_type = RopeType.NORMAL
    mamba2 = True
    renorm_experts = True

    def read_hparams(self, hp, keys):
        super().read_hparams(hp, keys)
        hp.embedding_scale = float(keys.get("embedding_scale", 0.0))
        hp.residual_scale = float(keys.get("residual_scale", 0.0))
        hp.granite_logit_scale = float(keys.get("logit_scale", 0.0)) or 1.0
        hp.attention_scale = float(keys.get("attention.scale", 0.0))
        hp.rope_finetuned = bool(keys.get("rope.scaling.finetuned", True))  # Granite's switch for rope

    def mixer(self, b, il, h, layer):
        if self.is_recurrent(b.hp, il):
            return mamba2_mixer(b, il, h, layer)
        if not b.hp.rope_finetuned:
            return attention_no_rope(b, il, h, layer)
        return b.self_attention(il, h, layer)

    def scaled(self, b, x):
        scale = b.hp.residual_scale
        return ops.scale(b.ctx, x, scale) if scale else x


ARCHS = [Jamba(), GraniteHybrid()]
