"""Breadth: the training ops' cases (CROSS_ENTROPY_LOSS(_BACK), SILU_BACK, OPT_STEP_ADAMW,
OPT_STEP_SGD, ACC)."""
from __future__ import annotations

import torch

import torchggml as ggml
from ..values import uniform
from .common import T, new_table, has


def _cross_entropy(table, ne, back):
    def build(ctx):
        logits = ggml.new_tensor(ctx, T.F32, list(ne))
        labels0 = ggml.new_tensor(ctx, T.F32, list(ne))
        labels = ggml.soft_max(ctx, labels0)
        if back:
            grad = ggml.new_tensor_1d(ctx, T.F32, 1)
            return ggml.cross_entropy_loss_back(ctx, grad, logits, labels), [logits, labels0, grad]
        return ggml.cross_entropy_loss(ctx, logits, labels), [logits, labels0]

    def ref(logits, labels0, grad=None):
        labels = torch.softmax(labels0, -1)
        n_rows = logits.numel() // logits.shape[-1]
        if back:
            return (torch.softmax(logits, -1) - labels) * grad.reshape(()) / n_rows
        return (-(labels * torch.log_softmax(logits, -1)).sum() / n_rows).reshape(1, 1, 1, 1)
    table.case("cross_entropy_loss_back" if back else "cross_entropy_loss", f"ne={list(ne)}", build, ref)


def _silu_back(table, ne):
    def build(ctx):
        dy, x = ggml.new_tensor(ctx, T.F32, list(ne)), ggml.new_tensor(ctx, T.F32, list(ne))
        return ggml.silu_back(ctx, dy, x), [dy, x]

    def ref(dy, x):
        s = torch.sigmoid(x)
        return dy * s * (1 + x * (1 - s))
    table.case("silu_back", f"ne={list(ne)}", build, ref)


def _adamw(table, ne):
    def build(ctx):
        a, g, m, v = (ggml.new_tensor(ctx, T.F32, list(ne)) for _ in range(4))
        ggml.set_param(a)
        p = ggml.new_tensor_1d(ctx, T.F32, 7)
        return ggml.opt_step_adamw(ctx, a, g, m, v, p), [a, g, m, v, p]

    def ref(w, g, m, v, p):
        alpha, b1, b2, eps, wd, b1h, b2h = p.reshape(-1).tolist()
        m = m * b1 + g * (1 - b1)
        v = v * b2 + g * g * (1 - b2)
        return w * (1 - alpha * wd) - alpha * (m * b1h) / (torch.sqrt(v * b2h) + eps)
    table.case("opt_step_adamw", f"ne={list(ne)}", build, ref, init={i: uniform(0, 1) for i in range(5)})


def _sgd(table, ne):
    def build(ctx):
        a, g = ggml.new_tensor(ctx, T.F32, list(ne)), ggml.new_tensor(ctx, T.F32, list(ne))
        ggml.set_param(a)
        p = ggml.new_tensor_1d(ctx, T.F32, 2)
        return ggml.opt_step_sgd(ctx, a, g, p), [a, g, p]

    def ref(w, g, p):
        alpha, wd = p.reshape(-1).tolist()
        return w * (1 - alpha * wd) - alpha * g
    table.case("opt_step_sgd", f"ne={list(ne)}", build, ref, init={2: uniform(0, 1)})


def _acc(table, ne_a, ne_b, stride_dim):
    def build(ctx):
        a = ggml.new_tensor(ctx, T.F32, list(ne_a))
        if stride_dim in (1, 2, 3):
            pad = list(ne_b)
            pad[stride_dim] += 1
            b0 = ggml.new_tensor(ctx, T.F32, pad)
            b = ggml.view_4d(ctx, b0, *ne_b, b0.nb[1], b0.nb[2], b0.nb[3], b0.nb[1])
        else:
            b0 = b = ggml.new_tensor(ctx, T.F32, list(ne_b))
        return ggml.acc(ctx, a, b, a.nb[1], a.nb[2], a.nb[3], 0), [a, b0]

    def ref(a, b0):
        b = b0
        if stride_dim in (1, 2, 3):  # the view starts one row in, strides of the padded tensor
            flat = b0.flatten()[b0.shape[-1]:]
            strides = [s for s in reversed(b0.stride())]
            b = flat.as_strided(tuple(reversed(ne_b)), tuple(reversed(strides)))
        out = a.clone()
        out[:ne_b[3], :ne_b[2], :ne_b[1], :ne_b[0]] += b
        return out
    table.case("acc", f"ne_a={list(ne_a)},ne_b={list(ne_b)},stride_dim={stride_dim}", build, ref)


def cases():
    table = new_table()
    _silu_back(table, (64, 5, 4, 3))
    for back in (False, True):
        for ne in ((10, 5, 4, 3), (30000, 1, 1, 1)):
            _cross_entropy(table, ne, back)
    _adamw(table, (10, 5, 4, 3))
    _sgd(table, (10, 5, 4, 3))
    if has("acc"):
        for ne_a, ne_b, sd in (((256, 17, 1, 1), (256, 16, 1, 1), -1), ((256, 17, 2, 3), (256, 16, 2, 3), -1),
                               ((256, 17, 2, 3), (128, 16, 2, 3), -1), ((256, 17, 2, 3), (256, 16, 2, 3), 1),
                               ((256, 17, 2, 3), (128, 16, 2, 3), 2), ((256, 17, 2, 3), (64, 16, 2, 3), 3)):
            _acc(table, ne_a, ne_b, sd)
    return table
