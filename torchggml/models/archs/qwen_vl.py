"""The text side of Qwen's vision-language models: qwen2vl (qwen2's layer: q/k/v biases),
qwen3vl (qwen3's: per-head q/k RMS norms) and qwen3vlmoe (qwen3moe's), with multi-axis rotary
embedding over rope.dimension_sections (MROPE; qwen3vl's interleaved, IMROPE). For text tokens the three axes
carry the token's position and the fourth 0, as llama.cpp feeds them (an image's rows their own
(time, row, column) positions: Model.eval_embeddings with grid). qwen3vl's input embedding rows
carry n_deepstack_layers more slices, added to the first layers' outputs (Arch.build's
b.deepstack); token ids carry none.
"""
from __future__ import annotations

from ...enums import RopeType
from ...gguf.loader import GGUFError
from ...ops.rope import ROPE_TYPE_IMROPE
from .qwen import Qwen2, Qwen3, Qwen3Moe


def read_sections(hp, keys):
    sections = keys.get_list("rope.dimension_sections")
    if not isinstance(sections, list) or len(sections) < 3:
        raise GGUFError(f"{keys.f.path}: metadata key '{keys.arch}.rope.dimension_sections' is missing")
    hp.rope_sections = tuple(int(s) for s in (list(sections) + [0])[:4])


class Qwen2VL(Qwen2):
    names = ("qwen2vl",)
    rope_type = RopeType.MROPE
    biases = {"attn_q": False, "attn_k": False, "attn_v": False, "attn_qkv": False, "output": False}
    fused_qkv = True

    def read_hparams(self, hp, keys):
        read_sections(hp, keys)


class Qwen3VLText:
    """qwen3vl's and qwen3vlmoe's: interleaved multi-axis RoPE, fused q/k/v, deepstack slices."""
    rope_type = ROPE_TYPE_IMROPE
    biases = {"attn_q": False, "attn_k": False, "attn_v": False, "attn_qkv": False}
    fused_qkv = True

    def read_hparams(self, hp, keys):
        read_sections(hp, keys)
        hp.n_deepstack = int(keys.get("n_deepstack_layers", 0))


class Qwen3VL(Qwen3VLText, Qwen3):
    names = ("qwen3vl",)


class Qwen3VLMoe(Qwen3VLText, Qwen3Moe):
    names = ("qwen3vlmoe",)


ARCHS = [Qwen2VL(), Qwen3VL(), Qwen3VLMoe()]
