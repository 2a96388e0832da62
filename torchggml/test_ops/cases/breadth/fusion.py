"""Graph cases: the op chains backends fuse, as upstream tests them (rms_norm+mul(+add),
norm+mul+add, add+rms_norm, rms_norm+mul+rope(+set_rows), rope+set_rows, softcap, top-k MoE
gating) and a llama block (attention and SwiGLU FFN). A case's op is the chain's name
(FUSIONS); the whole graph's output is compared with a float64 torch reference."""
from __future__ import annotations

import math

import torch

import torchggml as ggml
from ..norm import norm_ref, rms_norm_ref
from ..rope import rope_ref
from ..rows import distinct_rows
from ..values import uniform, randint, distinct
from .common import T, new_table

R = ggml.RopeType
FUSIONS = frozenset({"rms_norm_mul_add", "norm_mul_add", "add_rms_norm", "rms_norm_mul_rope", "rope_set_rows",
                     "softcap", "topk_moe", "llama_block"})


def _norm_mul_add(table, name, ne, eps, broadcast, multi_add=False):
    ne_a = [ne[0] * 2, ne[1] * 3, ne[2] * 3, ne[3] * 4] if broadcast else list(ne)
    norm, ref_norm = (ggml.rms_norm, rms_norm_ref) if name == "rms_norm_mul_add" else (ggml.norm, norm_ref)

    def build(ctx):
        a0 = ggml.new_tensor(ctx, T.F32, ne_a)
        b, c = ggml.new_tensor(ctx, T.F32, list(ne)), ggml.new_tensor(ctx, T.F32, list(ne))
        a = ggml.add(ctx, ggml.add(ctx, a0, b), c)
        if multi_add:
            a = ggml.add(ctx, ggml.add(ctx, a, b), c)
        return ggml.add(ctx, ggml.mul(ctx, norm(ctx, a, eps), b), c), [a0, b, c]

    def ref(a, b, c):
        reps = [x // y for x, y in zip(a.shape, b.shape)]
        bt, ct = b.repeat(*reps), c.repeat(*reps)
        x = a + bt + ct
        if multi_add:
            x = x + bt + ct
        return ref_norm(x, eps) * bt + ct
    table.case(name, f"ne={list(ne)},eps={eps},broadcast={int(broadcast)},multi_add={int(multi_add)}", build, ref,
               max_nmse=1e-6)


def _add_rms_norm(table, ne, eps, broadcast):
    ne_a = [ne[0] * 2, ne[1] * 3, ne[2] * 3, ne[3] * 4] if broadcast else list(ne)

    def build(ctx):
        a, b = ggml.new_tensor(ctx, T.F32, ne_a), ggml.new_tensor(ctx, T.F32, list(ne))
        return ggml.rms_norm(ctx, ggml.add(ctx, a, b), eps), [a, b]
    table.case("add_rms_norm", f"ne={list(ne)},eps={eps},broadcast={int(broadcast)}", build,
               lambda a, b: rms_norm_ref(a + b.repeat(*[x // y for x, y in zip(a.shape, b.shape)]), eps), max_nmse=1e-6)


def _rms_norm_mul_rope(table, ne, eps, multi_add, set_rows, broadcast, mode):
    def build(ctx):
        a0 = a = ggml.new_tensor_4d(ctx, T.F32, ne[0], ne[1], ne[2], 1)
        b, c = (ggml.new_tensor_4d(ctx, T.F32, ne[0], ne[1], ne[2], 1) for _ in range(2))
        inputs = [a0, b, c]
        if multi_add:
            a = ggml.add(ctx, ggml.add(ctx, a, b), c)
        w = b
        if broadcast:
            w = ggml.new_tensor_1d(ctx, T.F32, ne[0])
            inputs.append(w)
        a = ggml.mul(ctx, ggml.rms_norm(ctx, a, eps), w)
        pos = ggml.new_tensor_1d(ctx, T.I32, ne[2])
        inputs.append(pos)
        out = ggml.rope(ctx, a, pos, ne[0], mode)
        if set_rows:
            view = ggml.view_2d(ctx, out, ne[0] * ne[1], ne[2], out.nb[2], 0)
            dst = ggml.new_tensor_4d(ctx, T.F16, ne[0] * ne[1], ne[2] * ne[3], 1, 1)
            idx = ggml.new_tensor_3d(ctx, T.I64, ne[2], 1, 1)
            inputs += [dst, idx]
            out = ggml.set_rows(ctx, dst, view, idx)
        return out, inputs

    def ref(a, b, c, *rest):
        rest = list(rest)
        w = rest.pop(0) if broadcast else b
        pos = rest.pop(0)
        x = a + b + c if multi_add else a
        y = rope_ref(rms_norm_ref(x, eps) * w, pos, None, ne[0], mode)
        if not set_rows:
            return y
        dst, idx = rest
        out = dst.clone()
        out[0, 0, idx.reshape(-1).long()] = y.reshape(ne[2], -1).half().double()
        return out
    n_in = 3 + broadcast
    init = {n_in: randint(0, 512)}
    if set_rows:
        init[n_in + 2] = distinct_rows(ne[2] * ne[3])
    table.case("rms_norm_mul_rope", f"ne={list(ne)},eps={eps},multi_add={int(multi_add)},set_rows={int(set_rows)},"
               f"broadcast={int(broadcast)},mode={int(mode)}", build, ref, max_nmse=1e-6, init=init)


def _rope_set_rows(table, type, ne, mode):
    multi, vision = bool(mode & R.MROPE), mode == R.VISION
    n_dims = ne[0]
    fs, ef, af = 1.4245, 0.7465, 1.4245
    if vision:
        dims, sections = n_dims // 2, (n_dims // 4, n_dims // 4, 0, 0)
    elif multi:
        dims, sections = n_dims, (n_dims // 3, n_dims // 3, n_dims // 3, 0)
    else:
        dims, sections = n_dims, None

    def build(ctx):
        a = ggml.new_tensor_4d(ctx, T.F32, ne[0], ne[1], ne[2], 1)
        pos = ggml.new_tensor_1d(ctx, T.I32, ne[2] * (4 if multi else 1))
        if multi:
            rope = ggml.rope_multi(ctx, a, pos, None, dims, list(sections), mode, 0, 10000.0, fs, ef, af, 1.0, 1.0)
        else:
            rope = ggml.rope(ctx, a, pos, ne[0], mode)
        view = ggml.view_2d(ctx, rope, ne[0] * ne[1], ne[2], rope.nb[2], 0)
        dst = ggml.new_tensor_4d(ctx, type, ne[0] * ne[1], ne[2] * ne[3], 1, 1)
        idx = ggml.new_tensor_3d(ctx, T.I64, ne[2], 1, 1)
        return ggml.set_rows(ctx, dst, view, idx), [a, pos, dst, idx]

    def ref(a, pos, dst, idx):
        if multi:
            y = rope_ref(a, pos, None, dims, mode, sections, 0, 0, 10000.0, fs, ef, af, 1.0, 1.0)
        else:
            y = rope_ref(a, pos, None, ne[0], mode)
        out = dst.clone()
        rows = y.reshape(ne[2], -1)
        out[0, 0, idx.reshape(-1).long()] = rows.to(ggml.type_to_dtype(type)).double()
        return out
    table.case("rope_set_rows", f"type={type.name},ne={list(ne)},mode={int(mode)}", build, ref, max_nmse=1e-6,
               init={1: randint(0, 512), 3: distinct_rows(ne[2] * ne[3])})


def _topk_moe(table, ne, n_used, with_norm, bias_probs, gate, scale_w):
    n_expert, n_tokens = ne[0], ne[1]

    def build(ctx):
        logits = ggml.new_tensor(ctx, T.F32, list(ne))
        inputs = [logits]
        probs = {"softmax": ggml.soft_max, "sigmoid": ggml.sigmoid, "softmax_weight": lambda c, x: x,
                 "sqrt_softplus": lambda c, x: ggml.sqrt(c, ggml.softplus(c, x))}[gate](ctx, logits)
        selection = probs
        if bias_probs:
            bias = ggml.new_tensor_1d(ctx, T.F32, n_expert)
            inputs.append(bias)
            selection = ggml.add(ctx, probs, bias)
        experts = ggml.argsort_top_k(ctx, selection, n_used)
        weights = ggml.get_rows(ctx, ggml.reshape_3d(ctx, probs, 1, n_expert, n_tokens), experts)
        if gate == "softmax_weight":
            weights = ggml.reshape_3d(ctx, ggml.soft_max(ctx, ggml.reshape_2d(ctx, weights, n_used, n_tokens)),
                                      1, n_used, n_tokens)
        if with_norm:
            w2 = ggml.reshape_2d(ctx, weights, n_used, n_tokens)
            total = ggml.clamp(ctx, ggml.sum_rows(ctx, w2), 6.103515625e-5, math.inf)
            weights = ggml.reshape_3d(ctx, ggml.div(ctx, w2, total), 1, n_used, n_tokens)
        if scale_w:
            weights = ggml.scale(ctx, weights, scale_w)
        return weights, inputs

    def ref(logits, bias=None):
        x = logits[0, 0]
        probs = {"softmax": lambda v: torch.softmax(v, -1), "sigmoid": torch.sigmoid, "softmax_weight": lambda v: v,
                 "sqrt_softplus": lambda v: torch.sqrt(torch.nn.functional.softplus(v))}[gate](x)
        selection = probs + bias.reshape(-1) if bias_probs else probs
        chosen = torch.topk(selection, n_used, dim=-1).indices
        w = torch.gather(probs, -1, chosen)
        if gate == "softmax_weight":
            w = torch.softmax(w, -1)
        if with_norm:
            w = w / w.sum(-1, keepdim=True).clamp_min(6.103515625e-5)
        if scale_w:
            w = w * scale_w
        return w.reshape(1, n_tokens, n_used, 1)
    init = {0: distinct}
    if bias_probs:
        init[1] = uniform(-0.01, 0.01)  # small: keeps the selection away from ties with the unbiased order
    table.case("topk_moe", f"ne={list(ne)},n_used={n_used},with_norm={int(with_norm)},bias_probs={int(bias_probs)},"
               f"gate={gate},scale_w={scale_w}", build, ref, max_nmse=1e-6, init=init)


def _llama_block(table, n_embd, n_head, n_head_kv, n_tokens, n_ff):
    """One pre-norm llama block: attention (rope, GQA, causal flash attention) and a SwiGLU FFN."""
    hd = n_embd // n_head
    eps = 1e-5
    scale = 1.0 / math.sqrt(hd)

    def build(ctx):
        x = ggml.new_tensor_2d(ctx, T.F32, n_embd, n_tokens)
        pos = ggml.new_tensor_1d(ctx, T.I32, n_tokens)
        mask = ggml.new_tensor_2d(ctx, T.F16, n_tokens, n_tokens)
        w = {name: ggml.new_tensor_2d(ctx, T.F32, *shape) for name, shape in
             (("norm", (n_embd, 1)), ("q", (n_embd, n_embd)), ("k", (n_embd, hd * n_head_kv)),
              ("v", (n_embd, hd * n_head_kv)), ("o", (n_embd, n_embd)), ("ffn_norm", (n_embd, 1)),
              ("gate", (n_embd, n_ff)), ("up", (n_embd, n_ff)), ("down", (n_ff, n_embd)))}
        h = ggml.mul(ctx, ggml.rms_norm(ctx, x, eps), w["norm"])
        q = ggml.reshape_3d(ctx, ggml.mul_mat(ctx, w["q"], h), hd, n_head, n_tokens)
        k = ggml.reshape_3d(ctx, ggml.mul_mat(ctx, w["k"], h), hd, n_head_kv, n_tokens)
        v = ggml.reshape_3d(ctx, ggml.mul_mat(ctx, w["v"], h), hd, n_head_kv, n_tokens)
        q = ggml.rope_ext(ctx, q, pos, None, hd, R.NEOX, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)
        k = ggml.rope_ext(ctx, k, pos, None, hd, R.NEOX, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)
        attn = ggml.flash_attn_ext(ctx, ggml.permute(ctx, q, 0, 2, 1, 3), ggml.permute(ctx, k, 0, 2, 1, 3),
                                   ggml.permute(ctx, v, 0, 2, 1, 3), mask, scale, 0.0, 0.0)
        attn = ggml.mul_mat(ctx, w["o"], ggml.reshape_2d(ctx, attn, n_embd, n_tokens))
        x1 = ggml.add(ctx, x, attn)
        f = ggml.mul(ctx, ggml.rms_norm(ctx, x1, eps), w["ffn_norm"])
        f = ggml.swiglu_split(ctx, ggml.mul_mat(ctx, w["gate"], f), ggml.mul_mat(ctx, w["up"], f))
        return ggml.add(ctx, x1, ggml.mul_mat(ctx, w["down"], f)), [x, pos, mask, *w.values()]

    def ref(x, pos, mask, wn, wq, wk, wv, wo, wfn, wg, wu, wd):
        x, mask = x[0, 0], mask[0, 0]
        h = rms_norm_ref(x, eps) * wn[0, 0]
        q = (h @ wq[0, 0].T).view(1, n_tokens, n_head, hd)
        k = (h @ wk[0, 0].T).view(1, n_tokens, n_head_kv, hd)
        v = (h @ wv[0, 0].T).view(1, n_tokens, n_head_kv, hd)
        q, k = (rope_ref(t, pos, None, hd, R.NEOX) for t in (q, k))
        q, k, v = (t[0].transpose(0, 1) for t in (q, k, v))  # [heads, tokens, hd]
        rep = n_head // n_head_kv
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        att = torch.softmax(q @ k.transpose(-1, -2) * scale + mask, -1) @ v  # [heads, tokens, hd]
        x1 = x + att.transpose(0, 1).reshape(n_tokens, n_embd) @ wo[0, 0].T
        f = rms_norm_ref(x1, eps) * wfn[0, 0]
        g, u = f @ wg[0, 0].T, f @ wu[0, 0].T
        return x1 + (g * torch.sigmoid(g) * u) @ wd[0, 0].T

    def causal(t, gen):
        n = t.ne[0]
        return torch.triu(torch.full((n, n), float("-inf"), dtype=torch.float64), 1).reshape(1, 1, n, n)
    table.case("llama_block", f"n_embd={n_embd},n_head={n_head},n_head_kv={n_head_kv},n_tokens={n_tokens},n_ff={n_ff}",
               build, ref, max_nmse=5e-4, init={1: lambda t, g: torch.arange(t.ne[0]), 2: causal,
                                                **{i: uniform(-0.5, 0.5) for i in range(3, 12)}})


def cases():
    table = new_table()
    for eps in (0.0, 1e-6, 1e-4, 1e-1, 1.0):
        for n in (64, 1025):
            for broadcast in (False, True):
                _norm_mul_add(table, "rms_norm_mul_add", (n, 5, 4, 3), eps, broadcast)
                _norm_mul_add(table, "norm_mul_add", (n, 5, 4, 3), eps, broadcast)
                _add_rms_norm(table, (n, 5, 4, 3), eps, broadcast)
    for n in (1, 511, 1025, 8192, 33 * 512):
        for multi_add in (False, True):
            _norm_mul_add(table, "rms_norm_mul_add", (n, 1, 1, 1), 1e-6, False, multi_add)
        _add_rms_norm(table, (n, 1, 1, 1), 1e-6, False)
    for multi_add in (False, True):
        for set_rows in (False, True):
            for broadcast in (False, True):
                for mode in (R.NORMAL, R.NEOX):
                    for ne in ((768, 1, 1, 1), (768, 3, 1, 1), (768, 3, 5, 1), (128, 32, 2, 1), (128, 4, 2, 1),
                               (128, 32, 50, 1), (128, 4, 50, 1), (8192, 2, 2, 1), (8192, 2, 2, 1)):
                        _rms_norm_mul_rope(table, ne, 1e-6, multi_add, set_rows, broadcast, mode)
    for mode in (R.NORMAL, R.NEOX, R.MROPE, R.VISION):
        for type in (T.F16, T.F32):
            for ne2 in (1, 8, 512):
                for ne3 in (1, 3):
                    _rope_set_rows(table, type, (128, 32, ne2, ne3), mode)

    def build_softcap(ctx):
        a = ggml.new_tensor(ctx, T.F32, [10, 10, 10, 10])
        return ggml.scale(ctx, ggml.tanh(ctx, ggml.scale(ctx, a, 1.0 / 50.0)), 50.0), [a]
    table.case("softcap", "ne=[10, 10, 10, 10],softcap=50", build_softcap, lambda a: 50.0 * torch.tanh(a / 50.0),
               init={0: uniform(-200, 200)})
    for gate in ("softmax", "sigmoid", "softmax_weight", "sqrt_softplus"):
        for with_norm in (False, True):
            for bias_probs in (False, True):
                for scale_w in (0.0, 2.0):
                    for ne, n_used in (((8, 22, 1, 1), 4), ((31, 22, 1, 1), 8), ((32, 22, 1, 1), 8), ((40, 22, 1, 1), 8),
                                       ((71, 22, 1, 1), 8), ((128, 1, 1, 1), 128), ((129, 1, 1, 1), 128),
                                       ((160, 4, 1, 1), 160), ((256, 22, 1, 1), 6), ((288, 22, 1, 1), 8)):
                        _topk_moe(table, ne, n_used, with_norm, bias_probs, gate, scale_w)
    for args in ((64, 4, 4, 7, 128), (64, 8, 2, 5, 96), (128, 4, 1, 9, 256)):
        _llama_block(table, *args)
    return table
