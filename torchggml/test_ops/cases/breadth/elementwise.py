"""Breadth: unary ops, GLU, element-wise math, clamp, leaky_relu, rounding, scale, binary ops with
broadcast (upstream's add_test_bin_bcast shapes), add_id."""
from __future__ import annotations

import torch

import torchggml as ggml
from ..glu import ACTIVATIONS, _fused_ref
from ..unary import REFERENCES
from ..values import rounded, uniform, randint
from .common import T, maybe_view, viewed, new_table

U = ggml.UnaryOp
SHAPES = ([128, 2, 2, 2], [5, 7, 11, 13])
MATH = {"sqr": (lambda x: x * x, None), "sqrt": (torch.sqrt, uniform(0, 2)), "log": (torch.log, uniform(0.05, 3)),
        "sin": (torch.sin, None), "cos": (torch.cos, None)}
ROUNDING = {"floor": torch.floor, "ceil": torch.ceil, "trunc": torch.trunc,
            "round": lambda x: torch.sign(x) * torch.floor(x.abs() + 0.5)}


def _unary(table, op, ref, exact, type, ne, v):
    fn = getattr(ggml, op.name.lower())

    def build(ctx):
        root, a = maybe_view(ctx, type, ne, v)
        return fn(ctx, a), [root]
    table.case(op.name.lower(), f"type={type.name},ne={ne},v={int(v)}", build,
               lambda x: rounded(type, ref(viewed(x, ne[0], v))), max_nmse=0 if exact else 1e-7)


def _glu(table, name, act, type, ne, v, swapped, split):
    fn = getattr(ggml, name + ("_split" if split else "_swapped" if swapped else ""))

    def build(ctx):
        if split:
            ra, a = maybe_view(ctx, type, ne, v)
            rb, b = maybe_view(ctx, type, ne, v)
            return fn(ctx, a, b), [ra, rb]
        root, a = maybe_view(ctx, type, ne, v)
        return fn(ctx, a), [root]
    if split:
        ref = lambda a, b: rounded(type, act(viewed(a, ne[0], v)) * viewed(b, ne[0], v))
    else:
        ref = lambda a: rounded(type, _fused_ref(act, swapped)(viewed(a, ne[0], v)))
    table.case(name, f"type={type.name},ne={ne},v={int(v)},swapped={int(swapped)}{',split' if split else ''}",
               build, ref)


def _math(table, name, ref, init, type, ne, fn=None):
    fn = fn or getattr(ggml, name)

    def build(ctx):
        a = ggml.new_tensor(ctx, type, list(ne))
        return fn(ctx, a), [a]
    table.case(name, f"type={type.name},ne={ne}", build, lambda x: rounded(type, ref(x)),
               init={0: init} if init else {})


def _bin(table, name, type, ne, nr, perm1=False, inplace=False):
    """a = b tiled nr times (upstream's bin_bcast: b [ne], a [ne * nr]); perm1: b stored permuted."""
    fn = getattr(ggml, name + ("_inplace" if inplace else ""))
    ne_a = [n * r for n, r in zip(ne, nr)]

    def build(ctx):
        a = ggml.new_tensor(ctx, type, ne_a)
        if perm1:
            b0 = ggml.new_tensor_4d(ctx, type, ne[0], ne[2], ne[1], ne[3])
            b = ggml.permute(ctx, b0, 0, 2, 1, 3)
        else:
            b0 = b = ggml.new_tensor(ctx, type, list(ne))
        x = ggml.scale(ctx, a, 1.0) if inplace else a
        return fn(ctx, x, b), [a, b0]

    op = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}[name]

    def ref(a, b):
        if perm1:
            b = b.permute(0, 2, 1, 3)
        return rounded(type, op(a, b.repeat(*reversed(nr))))
    init = {1: uniform(0.5, 1.5)} if name == "div" else {}
    table.case(name, f"type={type.name},ne={ne},nr={nr}{',perm1' if perm1 else ''}{',inplace' if inplace else ''}",
               build, ref, max_nmse=1e-7 if type == T.F32 else 1e-6, init=init)


BCAST = [([1, 1, 8, 1], [1, 1, 1, 1]), ([1, 1, 1, 1], [32, 1, 1, 1]), ([1, 1, 320, 320], [1, 1, 1, 1]),
         ([10, 5, 1, 1], [1, 1, 1, 1]), ([10, 5, 4, 1], [1, 1, 1, 1]), ([10, 5, 4, 3], [1, 1, 1, 1]),
         ([10, 5, 4, 3], [2, 1, 1, 1]), ([10, 5, 4, 3], [1, 2, 1, 1]), ([10, 5, 4, 3], [1, 1, 2, 1]),
         ([10, 5, 4, 3], [1, 1, 1, 2]), ([10, 5, 4, 3], [1, 1, 2, 2]), ([10, 5, 4, 3], [1, 2, 2, 2]),
         ([10, 5, 4, 3], [2, 2, 2, 2])]
BCAST_SD = [([1, 1, 65536, 1], [256, 1, 1, 1]), ([1280, 1, 1, 1], [1, 1, 1, 1]), ([1280, 1, 1, 1], [1, 16, 16, 1]),
            ([1280, 16, 16, 1], [1, 1, 1, 1]), ([1280, 1, 1, 1], [1, 256, 1, 1]), ([1, 1, 1280, 1], [16, 16, 1, 1]),
            ([16, 16, 1280, 1], [1, 1, 1, 1]), ([1, 1, 1920, 1], [16, 16, 1, 1]), ([1, 1, 2560, 1], [16, 16, 1, 1]),
            ([1, 1, 1280, 1], [32, 32, 1, 1]), ([1, 1, 1920, 1], [32, 32, 1, 1]), ([1, 1, 640, 1], [32, 32, 1, 1]),
            ([5120, 1, 1, 1], [1, 256, 1, 1]), ([640, 1, 1, 1], [1, 1, 1, 1]), ([64, 262144, 1, 1], [1, 1, 1, 1]),
            ([10, 5, 4, 6], [1, 1, 1, 1]), ([10, 5, 4, 5], [1, 1, 1, 1]), ([1, 1, 120, 120], [1, 1, 1, 1]),
            ([1, 1, 4, 320], [1, 1, 1, 1])]


def _add_id(table, n_embd, n_mats, n_used, n_tokens):
    def build(ctx):
        a = ggml.new_tensor_3d(ctx, T.F32, n_embd, n_used, n_tokens)
        b = ggml.new_tensor_2d(ctx, T.F32, n_embd, n_mats)
        ids = ggml.new_tensor_2d(ctx, T.I32, n_used, n_tokens)
        return ggml.add_id(ctx, a, b, ids), [a, b, ids]
    table.case("add_id", f"n_embd={n_embd},n_mats={n_mats},n_used={n_used},n_tokens={n_tokens}", build,
               lambda a, b, ids: a + b[0, 0][ids[0, 0]], init={2: randint(0, n_mats)})


def _scale(table, ne, s, b, inplace):
    def build(ctx):
        a = ggml.new_tensor(ctx, T.F32, ne)
        x = ggml.scale(ctx, a, 1.0) if inplace else a
        return (ggml.scale_bias_inplace if inplace else ggml.scale_bias)(ctx, x, s, b), [a]
    table.case("scale", f"ne={ne},s={s},b={b}{',inplace' if inplace else ''}", build, lambda a: a * s + b)


def cases():
    table = new_table()
    for type in (T.F16, T.F32):
        for v in (False, True):
            for op in U:
                if op == U.XIELU or op not in REFERENCES:
                    continue
                ref, exact = REFERENCES[op]
                for ne in SHAPES:
                    _unary(table, op, ref, exact, type, ne, v)
    for type in (T.F16, T.F32):
        for v in (False, True):
            for name, act in ACTIVATIONS.items():
                for swapped in (False, True):
                    for ne in SHAPES:
                        _glu(table, name, act, type, [ne[0] * 2, *ne[1:]], v, swapped, False)
                for ne in SHAPES:
                    _glu(table, name, act, type, ne, v, False, True)
    for type in (T.F16, T.F32):
        for ne in ([10, 5, 4, 3], [7, 1, 5, 3], [1024, 1024, 1, 1]):
            for name, (ref, init) in MATH.items():
                _math(table, name, ref, init, type, ne)
            # clamp writes into its source (a view of it in ggml): clamp a copy
            _math(table, "clamp", lambda x: x.clamp(-0.5, 0.5), None, type, ne,
                  lambda ctx, a: ggml.clamp(ctx, ggml.dup(ctx, a), -0.5, 0.5))
            _math(table, "leaky_relu", lambda x: torch.where(x > 0, x, 0.1 * x), None, type, ne,
                  lambda ctx, a: ggml.leaky_relu(ctx, a, 0.1, False))
            for name, ref in ROUNDING.items():
                _math(table, name, ref, None, type, ne)
                table[-1].max_nmse = 0
    for type in (T.F16, T.F32):
        for perm1 in (False, True):
            for ne, nr in BCAST:
                for name in ("add", "sub", "mul", "div"):
                    _bin(table, name, type, ne, nr, perm1)
        for ne, nr in BCAST_SD:
            for name in ("add", "sub", "mul", "div"):
                _bin(table, name, type, ne, nr)
    for name in ("add", "mul", "sub", "div"):
        _bin(table, name, T.F32, [16, 5, 4, 3], [1, 1, 1, 1], inplace=True)
    for n_mats in (4, 8):
        for n_used in (1, 2, 4):
            for n_embd in (32, 129):
                for n_tokens in (1, 32, 129):
                    if n_used <= n_mats:
                        _add_id(table, n_embd, n_mats, n_used, n_tokens)
    _scale(table, [10, 10, 10, 10], 2.0, 0.0, False)
    _scale(table, [10, 10, 10, 10], 2.0, 1.0, False)
    _scale(table, [10, 10, 10, 10], 2.0, 1.0, True)
    _scale(table, [100, 10, 10, 10], 2.0, 1.0, False)
    return table
