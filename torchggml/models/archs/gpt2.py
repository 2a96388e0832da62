"""GPT-2 and StarCoder (gpt2, starcoder): starcoder2's sequential LayerNorm layer (biases, an
ungated GELU FFN) with learned position embeddings added to the token embeddings instead of a
rotary embedding, and one fused attn_qkv with its bias (starcoder: multi-query, one K/V head).
"""
from __future__ import annotations

from .parallel import Starcoder2


class GPT2(Starcoder2):
    names = ("gpt2", "starcoder")
    biases = {"attn_norm": True, "attn_qkv": True, "attn_output": True, "ffn_norm": True, "ffn_up": True,
              "ffn_down": True, "output_norm": True}
    fused_qkv = True
    rotary = False
    pos_embd = True  # position_embd.weight: required (True), optional (False) or none (None)

    def load_weights(self, w, hp):
        super().load_weights(w, hp)
        if self.pos_embd is not None:
            w.add("pos_embd", "position_embd.weight", [hp.n_embd, hp.n_ctx_train], required=self.pos_embd)

    def embed(self, b, w):
        return b.embed(w.token_embd, pos_embd=w.pos_embd)


ARCHS = [GPT2()]
