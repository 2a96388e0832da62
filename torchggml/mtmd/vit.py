"""The pieces every vision encoder is built from, as ggml graphs (clip.cpp's clip_graph helpers):
the patch embedding (a strided conv_2d, i.e. im2col + mul_mat), the pre-norm ViT block (LayerNorm,
multi-head self-attention over all patches, MLP), and the pixel-shuffle merge.

Shapes are ggml's (ne, innermost first): the image is [W, H, 3, 1], patch rows [n_embd, n_patches].
Attention is the non-flash path clip.cpp takes with flash attention off (mul_mat, soft_max_ext,
mul_mat, all F32)."""
from __future__ import annotations

import math

from .. import ops
from ..tensor import Tensor
from .loader import MMProj


def linear(ctx, x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    y = ops.mul_mat(ctx, w, x)
    return y if b is None else ops.add(ctx, y, b)


def layer_norm(ctx, x: Tensor, w: Tensor | None, b: Tensor | None, eps: float, rms: bool = False) -> Tensor:
    x = (ops.rms_norm if rms else ops.norm)(ctx, x, eps)
    if w is not None:
        x = ops.mul(ctx, x, w)
    return x if b is None else ops.add(ctx, x, b)


ACTIVATIONS = {"gelu": ops.gelu, "silu": ops.silu, "gelu_quick": ops.gelu_quick, "gelu_erf": ops.gelu_erf}


def patch_embed(ctx, mm: MMProj, image: Tensor) -> Tensor:
    """[W, H, 3, 1] pixels -> [n_embd, n_patches] rows (row-major patches), plus the patch bias."""
    p, n_embd = mm.vision.patch_size, mm.vision.n_embd
    x = ops.conv_2d(ctx, mm.tensor("v.patch_embd.weight"), image, p, p, 0, 0, 1, 1)  # [W/p, H/p, n_embd, 1]
    n_patches = x.ne[0] * x.ne[1]
    x = ops.cont(ctx, ops.transpose(ctx, ops.reshape_2d(ctx, x, n_patches, n_embd)))
    bias = mm.tensor("v.patch_embd.bias", required=False)
    return x if bias is None else ops.add(ctx, x, bias)


def attention(ctx, mm: MMProj, il: int, x: Tensor, mask: Tensor | None = None, rope=None, prefix: str = "v") -> Tensor:
    """Self-attention of layer il over every row of x [n_embd, n_pos] (non-causal); rope(q or k
    [d_head, n_head, n_pos]) rotates the queries and keys where the encoder uses positions.
    prefix: the encoder's tensors, "v" (vision) or "a" (audio)."""
    hp, pre = mm.hparams(prefix), f"{prefix}.blk.{il}."
    t = lambda name: mm.tensor(pre + name, required=False)  # noqa: E731
    n_pos, d = x.ne[1], hp.d_head
    qkv_w = t("attn_qkv.weight")
    if qkv_w is not None:  # one fused projection (Qwen3-VL): q, k and v as views of its rows
        qkv = linear(ctx, x, qkv_w, t("attn_qkv.bias"))
        part = lambda i: ops.view_3d(ctx, qkv, d, hp.n_head, n_pos, d * qkv.nb[0], qkv.nb[1],  # noqa: E731
                                     i * hp.n_head * d * qkv.nb[0])
        q, k, v = part(0), part(1), part(2)
    else:
        q = ops.reshape_3d(ctx, linear(ctx, x, t("attn_q.weight"), t("attn_q.bias")), d, hp.n_head, n_pos)
        k = ops.reshape_3d(ctx, linear(ctx, x, t("attn_k.weight"), t("attn_k.bias")), d, hp.n_head_kv, n_pos)
        v = ops.reshape_3d(ctx, linear(ctx, x, t("attn_v.weight"), t("attn_v.bias")), d, hp.n_head_kv, n_pos)
    if rope is not None:
        q, k = rope(q), rope(k)
    q = ops.permute(ctx, q, 0, 2, 1, 3)                        # [d, n_pos, n_head]
    k = ops.permute(ctx, k, 0, 2, 1, 3)
    v = ops.cont(ctx, ops.permute(ctx, v, 1, 2, 0, 3))         # [n_pos, d, n_head]
    kq = ops.soft_max_ext(ctx, ops.mul_mat(ctx, k, q), mask, d ** -0.5, 0.0)  # [n_pos_k, n_pos_q, n_head]
    out = ops.permute(ctx, ops.mul_mat(ctx, v, kq), 0, 2, 1, 3)  # [d, n_head, n_pos]
    out = ops.cont_2d(ctx, out, d * hp.n_head, n_pos)
    return linear(ctx, out, t("attn_out.weight"), t("attn_out.bias"))


def ffn(ctx, mm: MMProj, il: int, x: Tensor, prefix: str = "v") -> Tensor:
    hp, pre = mm.hparams(prefix), f"{prefix}.blk.{il}."
    t = lambda name: mm.tensor(pre + name, required=False)  # noqa: E731
    up, down = t("ffn_up.weight"), t("ffn_down.weight")
    up_b, down_b = t("ffn_up.bias"), t("ffn_down.bias")
    if prefix == "v" and down.ne[0] == hp.n_embd:  # old files hold up and down swapped (clip.cpp's check)
        up, down, up_b, down_b = down, up, down_b, up_b
    gate = t("ffn_gate.weight")
    h = linear(ctx, x, up, up_b)
    if gate is not None:
        g = linear(ctx, x, gate, t("ffn_gate.bias"))
        h = {"silu": ops.swiglu_split, "gelu": ops.geglu_split, "gelu_quick": ops.geglu_quick_split,
             "gelu_erf": ops.geglu_erf_split}[hp.act](ctx, g, h)
    else:
        h = ACTIVATIONS[hp.act](ctx, h)
    return linear(ctx, h, down, down_b)


def vit(ctx, mm: MMProj, x: Tensor, n_layer: int | None = None, post_norm: bool = True, rms: bool = False,
        rope=None, mask=None, after_pre_norm=None, prefix: str = "v", before_post_norm=None,
        layer_out=None) -> Tensor:
    """The pre-norm ViT over patch rows x [n_embd, n_pos] (position embeddings already added):
    the optional pre-norm, n_layer blocks (default all, each with optional layer scales), the optional post-norm; LayerNorms, or
    RMS norms with `rms`; `rope` as for attention; mask(il): layer il's attention mask or None;
    after_pre_norm(x): a reordering of the rows before the first block; before_post_norm(x): a step
    after the last block (audio's pooling); layer_out(il, x): sees each block's output (Qwen3-VL's
    deepstack); prefix as for attention."""
    hp = mm.hparams(prefix)
    opt = lambda name: mm.tensor(name, required=False)  # noqa: E731
    norm = lambda x, name: layer_norm(ctx, x, opt(name + ".weight"), opt(name + ".bias"), hp.eps, rms)  # noqa: E731
    def scale(x, name):  # the optional layer scale (InternViT's ls1 / ls2)
        w = opt(name + ".weight")
        return x if w is None else ops.mul(ctx, x, w)
    if opt(f"{prefix}.pre_ln.weight") is not None:
        x = norm(x, f"{prefix}.pre_ln")
    if after_pre_norm is not None:
        x = after_pre_norm(x)
    for il in range(hp.n_layer if n_layer is None else n_layer):
        pre = f"{prefix}.blk.{il}."
        m = None if mask is None else mask(il)
        x = ops.add(ctx, scale(attention(ctx, mm, il, norm(x, pre + "ln1"), m, rope=rope, prefix=prefix), pre + "ls1"), x)
        x = ops.add(ctx, x, scale(ffn(ctx, mm, il, norm(x, pre + "ln2"), prefix=prefix), pre + "ls2"))
        if layer_out is not None:
            layer_out(il, x)
    if before_post_norm is not None:
        x = before_post_norm(x)
    if post_norm and opt(f"{prefix}.post_ln.weight") is not None:
        x = norm(x, f"{prefix}.post_ln")
    return x


def embed_image(ctx, mm: MMProj, image: Tensor) -> Tensor:
    """Patch embedding plus the learned position embedding (v.position_embd.weight)."""
    x = patch_embed(ctx, mm, image)
    pos = mm.tensor("v.position_embd.weight", required=False)
    return x if pos is None else ops.add(ctx, x, pos)


def pixel_shuffle(ctx, x: Tensor, width: int, height: int, factor: int) -> Tensor:
    """[n_embd, width*height] patch rows -> [n_embd*factor^2, (width/factor)*(height/factor)]:
    each factor x factor block of patches as one row (idefics3's pixel shuffle, clip.cpp's
    build_patch_merge_permute), the grid padded with zeros up to multiples of factor."""
    n_embd = x.ne[0]
    x = ops.reshape_3d(ctx, x, n_embd, width, height)
    pw, ph = -width % factor, -height % factor
    if pw or ph:
        x = ops.pad(ctx, x, 0, pw, ph, 0)
        width, height = width + pw, height + ph
    x = ops.reshape_3d(ctx, x, n_embd * factor, width // factor, height)
    x = ops.permute(ctx, x, 0, 2, 1, 3)
    x = ops.cont_3d(ctx, x, n_embd * factor * factor, height // factor, width // factor)
    x = ops.permute(ctx, x, 0, 2, 1, 3)
    return ops.cont_2d(ctx, x, x.ne[0], x.ne[1] * x.ne[2])


def resized_positions(ctx, pos: Tensor, width: int, height: int, mode: int) -> Tensor:
    """The square grid of learned position rows [n_embd, side^2] resampled to [n_embd, width * height]
    by interpolate `mode` (clip.cpp's resize_position_embeddings); unchanged when the sizes agree."""
    n_embd, side = pos.ne[0], math.isqrt(pos.ne[1])
    if width == side and height == side:
        return pos
    x = ops.permute(ctx, ops.reshape_3d(ctx, pos, n_embd, side, side), 2, 0, 1, 3)   # [side, side, n_embd]
    x = ops.interpolate(ctx, x, width, height, n_embd, 1, mode)
    return ops.cont_2d(ctx, ops.permute(ctx, x, 1, 2, 0, 3), n_embd, width * height)
