"""Tiny seeded multimodal projector files (mmproj GGUF, the `clip.*` keys and `v.*`/`mm.*` tensors
llama.cpp's clip.cpp loads) and a tiny text model with a vocabulary to pair them with, so libmtmd
and torchggml can encode the same image and their embeddings can be compared
(tests/test_mtmd.py, scripts/gen_mtmd_golden.py).

One case per projector type (MMPROJ_CASES): a 2-layer ViT (width 32, 4 heads) over a small image,
with the projector of that type, whose output width is the text model's (64). The text model is
the tiny gemma3 of tiny.py's recipe with a trained byte-level BPE vocabulary and the media
markers the projectors need as control tokens."""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch

from .demo import train_vocab, write_tensors
from .tiny import CASES_BY_NAME, TINY_SEED, _add_key, _tensors

MMPROJ_SEED = 20261127

# control tokens the projectors' prompts use around (or inside) an image
MEDIA_TOKENS = ("<start_of_image>", "<end_of_image>", "<fake_token_around_image>", "<global-img>",
                "<image>", "</image>")


@dataclass(frozen=True)
class MMProjCase:
    name: str
    projector: str               # clip.projector_type
    image_size: int = 64
    patch_size: int = 8
    n_embd: int = 32
    n_head: int = 4
    n_ff: int = 96
    n_layer: int = 2
    n_embd_text: int = 64
    merge: int = 0               # clip.vision.projector.scale_factor (audio: clip.audio.projector.stack_factor)
    longest_edge: int = 0        # clip.vision.preproc_image_size (0: not written)
    act: str = "gelu"            # clip.use_gelu / use_silu / neither (gelu_quick)
    eps: float = 1e-6
    mean: tuple = (0.5, 0.5, 0.5)
    std: tuple = (0.5, 0.5, 0.5)
    n_mel: int = 0               # an audio encoder (whisper's) with this many mel bins instead of a ViT
    pinpoints: tuple = ()        # clip.vision.image_grid_pinpoints (LLaVA 1.6's slicing), flat (w, h) pairs


MMPROJ_CASES = [
    MMProjCase("gemma3", "gemma3", merge=2),
    MMProjCase("idefics3", "idefics3", merge=2, longest_edge=128),
    MMProjCase("qwen2vl", "qwen2vl_merger", act="quick", eps=1e-6, mean=(0.48145466, 0.4578275, 0.40821073),
               std=(0.26862954, 0.26130258, 0.27577711)),
    # patch 28: windows of 112 / 28 / 2 = 2 x 2 merged blocks, so the tiny image has several
    MMProjCase("qwen25vl", "qwen2.5vl_merger", image_size=56, patch_size=28, act="silu", mean=(0.48145466, 0.4578275, 0.40821073),
               std=(0.26862954, 0.26130258, 0.27577711)),
    MMProjCase("pixtral", "pixtral", act="silu", eps=1e-5, merge=2),
    MMProjCase("qwen2a", "qwen2a", n_mel=16, eps=1e-5),
    # stack factors dividing the 1500 (ultravox) and 750 (voxtral) encoder frames of a 30 s chunk:
    # libmtmd's token count assumes so (it stops on "Invalid number of output tokens" otherwise)
    MMProjCase("ultravox", "ultravox", n_mel=16, eps=1e-5, merge=4),
    MMProjCase("voxtral", "voxtral", n_mel=16, eps=1e-5, merge=5),
    MMProjCase("mlp", "mlp", act="quick", mean=(0.48145466, 0.4578275, 0.40821073),
               std=(0.26862954, 0.26130258, 0.27577711), eps=1e-5),
    # LLaVA 1.6: the LLaVA 1.5 encoder with pinpoints (a 2 x 2 grid of 64-pixel slices for the golden image)
    MMProjCase("llava16", "mlp", act="quick", mean=(0.48145466, 0.4578275, 0.40821073),
               std=(0.26862954, 0.26130258, 0.27577711), eps=1e-5, pinpoints=(64, 128, 128, 64, 128, 128, 192, 64)),
    MMProjCase("internvl", "internvl", merge=2, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)),
    MMProjCase("lfm2", "lfm2", merge=2),
    MMProjCase("qwen3vl", "qwen3vl_merger", mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)),
    # MobileVLM (V2): the LLaVA 1.5 encoder; clip.cpp's LDP graphs take a 24 x 24 patch grid only
    MMProjCase("ldp", "ldp", image_size=48, patch_size=2, act="quick", mean=(0.48145466, 0.4578275, 0.40821073),
               std=(0.26862954, 0.26130258, 0.27577711), eps=1e-5),
    MMProjCase("ldpv2", "ldpv2", image_size=48, patch_size=2, act="quick", mean=(0.48145466, 0.4578275, 0.40821073),
               std=(0.26862954, 0.26130258, 0.27577711), eps=1e-5),
]
CLIP_PROJECTORS = ("mlp", "ldp", "ldpv2")  # LLaVA's CLIP ViT: a class token and a pre-norm
MMPROJ_BY_NAME = {c.name: c for c in MMPROJ_CASES}


def _vision_tensors(case: MMProjCase, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """The ViT's weights (torch order: ggml ne reversed) with scales that keep activations O(1)."""
    e, p = case.n_embd, case.patch_size
    n_patches = (case.image_size // p) ** 2

    def mat(rows, cols):
        return torch.randn(rows, cols, generator=gen) / cols ** 0.5

    def vec(n, mean=0.0, std=0.1):
        return mean + std * torch.randn(n, generator=gen)

    w = {"v.patch_embd.weight": torch.randn(e, 3, p, p, generator=gen) / (3 * p * p) ** 0.5}
    if case.projector in ("qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger"):  # a second frame's conv, M-RoPE
        w["v.patch_embd.weight.1"] = torch.randn(e, 3, p, p, generator=gen) / (3 * p * p) ** 0.5
        if case.projector == "qwen3vl_merger":  # a patch bias, learned positions on a square grid
            w["v.patch_embd.bias"] = vec(e)
            w["v.position_embd.weight"] = 0.5 * torch.randn(n_patches, e, generator=gen)
    elif case.projector == "pixtral":  # 2-D RoPE, RMS norms without biases, gated FFN
        w["v.pre_ln.weight"] = vec(e, 1.0)
    else:
        w["v.patch_embd.bias"] = vec(e)
        with_cls = case.projector in (*CLIP_PROJECTORS, "internvl")
        w["v.position_embd.weight"] = 0.5 * torch.randn(n_patches + with_cls, e, generator=gen)
    if case.projector in (*CLIP_PROJECTORS, "internvl"):  # CLIP and InternViT: a class token
        w["v.class_embd"] = torch.randn(e, generator=gen)
    if case.projector in CLIP_PROJECTORS:  # CLIP's pre-norm
        w["v.pre_ln.weight"], w["v.pre_ln.bias"] = vec(e, 1.0), vec(e)
    for il in range(case.n_layer):
        b = f"v.blk.{il}."
        if case.projector in ("pixtral", "qwen2.5vl_merger"):  # RMS norms, a gated FFN
            biased = case.projector == "qwen2.5vl_merger"
            for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
                w[b + name + ".weight"] = mat(e, e)
                if biased:
                    w[b + name + ".bias"] = vec(e)
            w[b + "ln1.weight"], w[b + "ln2.weight"] = vec(e, 1.0), vec(e, 1.0)
            w[b + "ffn_gate.weight"], w[b + "ffn_up.weight"] = mat(case.n_ff, e), mat(case.n_ff, e)
            w[b + "ffn_down.weight"] = mat(e, case.n_ff)
            if biased:
                w[b + "ffn_gate.bias"], w[b + "ffn_up.bias"], w[b + "ffn_down.bias"] = vec(case.n_ff), vec(case.n_ff), vec(e)
            continue
        names = ("attn_qkv", "attn_out") if case.projector == "qwen3vl_merger" else ("attn_q", "attn_k", "attn_v", "attn_out")
        for name in names:  # Qwen3-VL: one fused q/k/v projection
            rows = 3 * e if name == "attn_qkv" else e
            w[b + name + ".weight"], w[b + name + ".bias"] = mat(rows, e), vec(rows)
        for name in ("ln1", "ln2"):
            w[b + name + ".weight"], w[b + name + ".bias"] = vec(e, 1.0), vec(e)
        w[b + "ffn_up.weight"], w[b + "ffn_up.bias"] = mat(case.n_ff, e), vec(case.n_ff)
        w[b + "ffn_down.weight"], w[b + "ffn_down.bias"] = mat(e, case.n_ff), vec(e)
        if case.projector == "internvl":  # InternViT's layer scales
            w[b + "ls1.weight"], w[b + "ls2.weight"] = vec(e, 0.5), vec(e, 0.5)
    return w


def _projector_tensors(case: MMProjCase, gen: torch.Generator) -> dict[str, torch.Tensor]:
    e, t = case.n_embd, case.n_embd_text
    if case.projector == "gemma3":
        return {"v.post_ln.weight": 1.0 + 0.1 * torch.randn(e, generator=gen),
                "v.post_ln.bias": 0.1 * torch.randn(e, generator=gen),
                "mm.soft_emb_norm.weight": 1.0 + 0.1 * torch.randn(e, generator=gen),
                # stored [n_embd_vision][n_embd_text]: llama.cpp transposes it in the graph
                "mm.input_projection.weight": torch.randn(e, t, generator=gen) / e ** 0.5}
    if case.projector == "idefics3":
        k = e * case.merge ** 2
        return {"v.post_ln.weight": 1.0 + 0.1 * torch.randn(e, generator=gen),
                "v.post_ln.bias": 0.1 * torch.randn(e, generator=gen),
                "mm.model.fc.weight": torch.randn(t, k, generator=gen) / k ** 0.5}
    if case.projector in ("qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger"):  # post-norm, 2 x 2 -> mm.0 -> gelu -> mm.2
        k = 4 * e
        norm = {"v.post_ln.weight": 1.0 + 0.1 * torch.randn(e, generator=gen)}
        if case.projector != "qwen2.5vl_merger":  # LayerNorm; Qwen2.5-VL's RMS norm has no bias
            norm["v.post_ln.bias"] = 0.1 * torch.randn(e, generator=gen)
        if case.projector == "qwen3vl_merger":  # layer 0's deepstack merger: LayerNorm -> fc1 -> gelu -> fc2
            norm.update({"v.deepstack.0.norm.weight": 1.0 + 0.1 * torch.randn(k, generator=gen),
                         "v.deepstack.0.norm.bias": 0.1 * torch.randn(k, generator=gen),
                         "v.deepstack.0.fc1.weight": torch.randn(k, k, generator=gen) / k ** 0.5,
                         "v.deepstack.0.fc1.bias": 0.1 * torch.randn(k, generator=gen),
                         "v.deepstack.0.fc2.weight": torch.randn(t, k, generator=gen) / k ** 0.5,
                         "v.deepstack.0.fc2.bias": 0.1 * torch.randn(t, generator=gen)})
        return {**norm,
                "mm.0.weight": torch.randn(k, k, generator=gen) / k ** 0.5,
                "mm.0.bias": 0.1 * torch.randn(k, generator=gen),
                "mm.2.weight": torch.randn(t, k, generator=gen) / k ** 0.5,
                "mm.2.bias": 0.1 * torch.randn(t, generator=gen)}
    if case.projector == "pixtral":  # Mistral Small 3.1's patch merger, mm.1 -> gelu -> mm.2, [IMG_BREAK]
        k = e * case.merge ** 2
        return {"mm.input_norm.weight": 1.0 + 0.1 * torch.randn(e, generator=gen),
                "mm.patch_merger.weight": torch.randn(e, k, generator=gen) / k ** 0.5,
                "mm.1.weight": torch.randn(t, e, generator=gen) / e ** 0.5,
                "mm.1.bias": 0.1 * torch.randn(t, generator=gen),
                "mm.2.weight": torch.randn(t, t, generator=gen) / t ** 0.5,
                "mm.2.bias": 0.1 * torch.randn(t, generator=gen),
                "v.token_embd.img_break": torch.randn(t, generator=gen)}
    if case.projector == "internvl":  # mlp1: LayerNorm -> Linear -> GELU -> Linear
        k = e * case.merge ** 2
        return {"mm.model.mlp.0.weight": 1.0 + 0.1 * torch.randn(k, generator=gen),
                "mm.model.mlp.0.bias": 0.1 * torch.randn(k, generator=gen),
                "mm.model.mlp.1.weight": torch.randn(t, k, generator=gen) / k ** 0.5,
                "mm.model.mlp.1.bias": 0.1 * torch.randn(t, generator=gen),
                "mm.model.mlp.3.weight": torch.randn(t, t, generator=gen) / t ** 0.5,
                "mm.model.mlp.3.bias": 0.1 * torch.randn(t, generator=gen)}
    if case.projector == "lfm2":  # post-norm, pixel unshuffle, input LayerNorm, mm.1 -> gelu -> mm.2
        k = e * case.merge ** 2
        return {"v.post_ln.weight": 1.0 + 0.1 * torch.randn(e, generator=gen),
                "v.post_ln.bias": 0.1 * torch.randn(e, generator=gen),
                "mm.input_norm.weight": 1.0 + 0.1 * torch.randn(k, generator=gen),
                "mm.input_norm.bias": 0.1 * torch.randn(k, generator=gen),
                "mm.1.weight": torch.randn(t, k, generator=gen) / k ** 0.5,
                "mm.1.bias": 0.1 * torch.randn(t, generator=gen),
                "mm.2.weight": torch.randn(t, t, generator=gen) / t ** 0.5,
                "mm.2.bias": 0.1 * torch.randn(t, generator=gen)}
    if case.projector == "mlp":  # LLaVA 1.5: mm.0 -> gelu -> mm.2, no post-norm
        return {"mm.0.weight": torch.randn(t, e, generator=gen) / e ** 0.5,
                "mm.0.bias": 0.1 * torch.randn(t, generator=gen),
                "mm.2.weight": torch.randn(t, t, generator=gen) / t ** 0.5,
                "mm.2.bias": 0.1 * torch.randn(t, generator=gen)}
    if case.projector in ("ldp", "ldpv2"):
        return _ldp_tensors(case, gen)
    raise ValueError(f"tiny mmproj: no recipe for projector {case.projector!r}")


def _ldp_tensors(case: MMProjCase, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """MobileVLM's projectors at the text width t: an MLP, then LDP's two blocks (depthwise 3x3
    conv, LayerNorm, a squeeze-excite gate of width t / 2, a Q8_0 block, pointwise conv, LayerNorm) or LDPv2's
    positional depthwise conv (PEG)."""
    e, t = case.n_embd, case.n_embd_text

    def mat(rows, cols):
        return torch.randn(rows, cols, generator=gen) / cols ** 0.5

    def vec(n, mean=0.0):
        return mean + 0.1 * torch.randn(n, generator=gen)

    def depthwise():  # [C, 1, 3, 3], F16: ggml_conv_2d_dw multiplies the kernel with F16 im2col columns
        return (torch.randn(t, 1, 3, 3, generator=gen) / 3.0).half()
    first, second = (1, 3) if case.projector == "ldp" else (0, 2)
    w = {f"mm.model.mlp.{first}.weight": mat(t, e), f"mm.model.mlp.{first}.bias": vec(t),
         f"mm.model.mlp.{second}.weight": mat(t, t), f"mm.model.mlp.{second}.bias": vec(t)}
    if case.projector == "ldpv2":
        return {**w, "mm.model.peg.0.weight": depthwise(), "mm.model.peg.0.bias": vec(t)}
    for i in (1, 2):
        b = f"mm.model.mb_block.{i}.block."
        w.update({b + "0.0.weight": depthwise(), b + "0.1.weight": vec(t, 1.0), b + "0.1.bias": vec(t),
                  b + "1.fc1.weight": mat(t // 2, t), b + "1.fc1.bias": vec(t // 2),
                  b + "1.fc2.weight": mat(t, t // 2), b + "1.fc2.bias": vec(t),
                  b + "2.0.weight": mat(t, t), b + "2.1.weight": vec(t, 1.0), b + "2.1.bias": vec(t)})
    return w


def _audio_tensors(case: MMProjCase, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Whisper's encoder (conv biases stored [n_embd][1], as llama.cpp's converter writes them)
    and Qwen2-Audio's projection."""
    e, t, n_ff = case.n_embd, case.n_embd_text, case.n_ff

    def mat(rows, cols):
        return torch.randn(rows, cols, generator=gen) / cols ** 0.5

    def vec(n, mean=0.0, std=0.1):
        return mean + std * torch.randn(n, generator=gen)

    w = {"a.conv1d.1.weight": torch.randn(e, case.n_mel, 3, generator=gen) / (3 * case.n_mel) ** 0.5,
         "a.conv1d.1.bias": vec(e).reshape(e, 1),
         "a.conv1d.2.weight": torch.randn(e, e, 3, generator=gen) / (3 * e) ** 0.5,
         "a.conv1d.2.bias": vec(e).reshape(e, 1),
         "a.position_embd.weight": 0.5 * torch.randn(1500, e, generator=gen)}
    for il in range(case.n_layer):
        b = f"a.blk.{il}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            w[b + name + ".weight"] = mat(e, e)
            if name != "attn_k":  # whisper's key projection has no bias
                w[b + name + ".bias"] = vec(e)
        for name in ("ln1", "ln2"):
            w[b + name + ".weight"], w[b + name + ".bias"] = vec(e, 1.0), vec(e)
        w[b + "ffn_up.weight"], w[b + "ffn_up.bias"] = mat(n_ff, e), vec(n_ff)
        w[b + "ffn_down.weight"], w[b + "ffn_down.bias"] = mat(e, n_ff), vec(e)
    w["a.post_ln.weight"], w["a.post_ln.bias"] = vec(e, 1.0), vec(e)
    k = e * case.merge  # stacked frames
    if case.projector == "qwen2a":
        w["mm.a.fc.weight"], w["mm.a.fc.bias"] = mat(t, e), vec(t)
    elif case.projector == "ultravox":  # RMS norm, mlp.1 -> SwiGLU (halves of 2 * hidden) -> RMS norm -> mlp.2
        w["mm.a.norm_pre.weight"], w["mm.a.mlp.1.weight"] = vec(k, 1.0), mat(2 * n_ff, k)
        w["mm.a.norm_mid.weight"], w["mm.a.mlp.2.weight"] = vec(n_ff, 1.0), mat(t, n_ff)
    elif case.projector == "voxtral":  # mlp.1 -> erf GELU -> mlp.2, no biases
        w["mm.a.mlp.1.weight"], w["mm.a.mlp.2.weight"] = mat(t, k), mat(t, t)
    return w


def write_tiny_mmproj(path, case: MMProjCase | str, weight_type: str = "F32") -> str:
    """Write `case` as an mmproj GGUF; matrices as weight_type (F32, F16 or Q8_0...), the patch
    embedding, position embedding, norms and biases F32."""
    import gguf
    case = MMPROJ_BY_NAME[case] if isinstance(case, str) else case
    qtype = gguf.GGMLQuantizationType[weight_type.upper()]
    gen = torch.Generator().manual_seed(MMPROJ_SEED + sum(map(ord, case.name)))
    path = os.fspath(path)
    w = gguf.GGUFWriter(path, "clip")
    if case.n_mel:
        _write_audio(w, case, gen, qtype)
        return path
    keys = {"clip.projector_type": case.projector, "clip.has_vision_encoder": True,
            "clip.vision.image_size": case.image_size, "clip.vision.patch_size": case.patch_size,
            "clip.vision.embedding_length": case.n_embd, "clip.vision.feed_forward_length": case.n_ff,
            "clip.vision.block_count": case.n_layer, "clip.vision.projection_dim": case.n_embd_text,
            "clip.vision.attention.head_count": case.n_head,
            "clip.vision.attention.layer_norm_epsilon": case.eps,
            "clip.vision.image_mean": [float(x) for x in case.mean],
            "clip.vision.image_std": [float(x) for x in case.std]}
    if case.merge:  # pixtral and qwen2vl name it spatial_merge_size
        spatial = case.projector in ("pixtral", "qwen2vl_merger")
        keys["clip.vision.spatial_merge_size" if spatial else "clip.vision.projector.scale_factor"] = case.merge
    if case.longest_edge:
        keys["clip.vision.preproc_image_size"] = case.longest_edge
    if case.projector == "qwen2.5vl_merger":  # window attention in layer 0, full in layer 1
        keys["clip.vision.n_wa_pattern"] = 2
    if case.pinpoints:
        keys["clip.vision.image_grid_pinpoints"] = [int(v) for v in case.pinpoints]
    if case.projector == "internvl":  # at most 6 tiles (a 2 x 2 grid for the golden image)
        keys["clip.vision.preproc_max_tiles"] = 6
    if case.act in ("gelu", "silu"):
        keys[f"clip.use_{case.act}"] = True
    for key, value in keys.items():
        _add_key(w, key, value)
    tensors = {**_vision_tensors(case, gen), **_projector_tensors(case, gen)}
    # gemma3's projection is transposed in the graph: a block type cannot be (llama.cpp's files keep it F32)
    keep = ("v.patch_embd.weight", "v.patch_embd.weight.1", "v.position_embd.weight", "v.class_embd",
            "mm.input_projection.weight")
    # F16 tensors (LDP's depthwise kernels) are written as they are
    write_tensors(w, {k: t.numpy() if t.dtype == torch.float16 else t.float().numpy() for k, t in tensors.items()},
                  qtype, keep_f32=lambda name, data: name in keep or name.endswith(".bias") or data.dtype.itemsize == 2)
    return path


def _write_audio(w, case: MMProjCase, gen: torch.Generator, qtype) -> None:
    keys = {"clip.projector_type": case.projector, "clip.has_audio_encoder": True,
            "clip.audio.embedding_length": case.n_embd, "clip.audio.feed_forward_length": case.n_ff,
            "clip.audio.block_count": case.n_layer, "clip.audio.projection_dim": case.n_embd_text,
            "clip.audio.attention.head_count": case.n_head, "clip.audio.attention.layer_norm_epsilon": case.eps,
            "clip.audio.num_mel_bins": case.n_mel}
    if case.merge:
        keys["clip.audio.projector.stack_factor"] = case.merge
    for key, value in keys.items():
        _add_key(w, key, value)
    tensors = _audio_tensors(case, gen)
    write_tensors(w, {k: t.float().numpy() for k, t in tensors.items()}, qtype,
                  keep_f32=lambda name, data: name.startswith(("a.conv1d", "a.position_embd")) or name.endswith(".bias"))


# the text models the projectors' cases pair with: gemma3 (no M-RoPE) unless named here
TEXT_ARCH = {"qwen2vl": "qwen2vl", "qwen25vl": "qwen2vl", "qwen3vl": "qwen3vl"}
# extra text-model metadata by architecture: Qwen3-VL's input rows carry one deepstack slice
TEXT_METADATA = {"qwen3vl": {"n_deepstack_layers": 1}}


def write_tiny_text_model(path, n_embd: int = 64, arch: str = "gemma3") -> str:
    """The tiny text model of tiny.py's recipe for `arch` (width n_embd) with a byte-level BPE
    vocabulary ending in the MEDIA_TOKENS (control tokens), which libmtmd needs to tokenize."""
    import gguf
    vocab = train_vocab(320)
    # "\n\n" as one token (GPT-2's bytes): idefics3's layout looks it up by its text
    tokens = vocab.tokens + ["\u010a\u010a"] + list(MEDIA_TOKENS)
    types = vocab.types + [1] + [3] * len(MEDIA_TOKENS)
    base = CASES_BY_NAME[arch]
    case = replace(base, name=f"{arch}-mtmd", n_vocab=len(tokens), n_embd=n_embd, n_ctx=1024,
                   metadata=tuple(base.metadata) + tuple(TEXT_METADATA.get(arch, {}).items()))
    gen = torch.Generator().manual_seed(TINY_SEED + sum(map(ord, case.name)))
    path = os.fspath(path)
    w = gguf.GGUFWriter(path, case.arch)
    keys = {"context_length": case.n_ctx, "embedding_length": case.n_embd, "block_count": case.n_layer,
            "feed_forward_length": case.n_ff, "attention.head_count": case.n_head,
            "attention.head_count_kv": case.n_head_kv, "attention.key_length": case.head_dim,
            "attention.value_length": case.head_dim, "attention.layer_norm_rms_epsilon": 1e-6,
            "vocab_size": case.n_vocab, **dict(case.metadata)}
    for key, value in keys.items():
        _add_key(w, f"{case.arch}.{key}", value)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(vocab.merges)
    w.add_bos_token_id(vocab.bos_id)
    w.add_eos_token_id(vocab.eos_id)
    w.add_add_bos_token(True)
    write_tensors(w, _tensors(case, gen), gguf.GGMLQuantizationType.F32)
    return path


__all__ = ["MMProjCase", "MMPROJ_CASES", "MMPROJ_BY_NAME", "MEDIA_TOKENS", "write_tiny_mmproj",
           "write_tiny_text_model"]


def _demo():  # pragma: no cover - manual check: python -m torchggml.gguf.writer.tiny_mmproj DIR
    import sys
    d = sys.argv[1]
    for c in MMPROJ_CASES:
        print(write_tiny_mmproj(os.path.join(d, f"mmproj-{c.name}.gguf"), c))
    print(write_tiny_text_model(os.path.join(d, "text-gemma3.gguf")))


if __name__ == "__main__":  # pragma: no cover
    _demo()
