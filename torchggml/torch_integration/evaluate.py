"""A ggml graph evaluated with differentiable torch functions: the backward of graph_function.

Why not ggml's *_BACK ops: upstream's backward graph (build_backward_expand) needs a *_BACK op
and a backend kernel for every forward op, and its gradients would still have to be checked
against torch. Running the forward's ops as torch functions under torch autograd reuses the
reference kernels' math (tile, rope angles, activations, ALiBi slopes), gives every op a
backward at once, and lets torch optimizers and gradcheck work unchanged. The forward still
runs on the ggml backend; the backward recomputes it here (activation checkpointing: no
activations are kept between forward and backward).

Memory semantics are kept functionally: each root tensor (a tensor with no view_src) has a
flat value in ggml element order; views read it through as_strided with ggml's strides, and
ops that write into a view (SET_ROWS, CPY into a view) replace the root's value with
as_strided_scatter, so later views see the write (the KV cache of a model graph).
"""
from __future__ import annotations

import torch

from ..enums import Op, GluOp, RopeType, VIEW_OPS
from ..tensor import Tensor, get_op_params_f32, get_glu_op, get_unary_op, is_empty
from ..types import Type, type_traits
from ..devices.kernels import UnsupportedOpError
from ..devices.kernels.attention import alibi_slopes, tile_reps
from ..devices.kernels.binary import tile
from ..devices.kernels.glu import GLU_ACTIVATIONS, swiglu_oai_torch
from ..devices.kernels.math import MATH_FUNCTIONS
from ..devices.kernels.rope import (rope_params, angle_constants, rope_angles, rotated_span,
                                          pair_halves)
from ..devices.kernels.unary import UNARY_FUNCTIONS

_LOW_PRECISION = {Type.F16: torch.float16, Type.BF16: torch.bfloat16}


def _shape(t: Tensor) -> tuple:
    return tuple(reversed(t.ne))


# ---------------------------------------------------------------- the op table
# each rule: (node, *source values) -> value [ne3, ne2, ne1, ne0]; sources are 4-D values or None

def _binary(fn):
    return lambda node, a, b: fn(a, tile(b, a.shape))


def _mul_mat(node, a, b):
    """a [a3, a2, n, k] x b [b3, b2, m, k] -> [b3, b2, m, n]; a repeat-interleaved over dims 2, 3."""
    for dim in (0, 1):
        if b.shape[dim] != a.shape[dim]:
            a = a.repeat_interleave(b.shape[dim] // a.shape[dim], dim=dim)
    return torch.matmul(b, a.transpose(-1, -2))


def _rms_norm(node, x):
    eps = get_op_params_f32(node, 0)
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)


def _norm(node, x):
    eps = get_op_params_f32(node, 0)
    centered = x - x.mean(-1, keepdim=True)
    return centered * torch.rsqrt((centered * centered).mean(-1, keepdim=True) + eps)


def _soft_max(node, a, mask=None, sinks=None):
    """softmax(a * scale + slope * mask) over rows (sinks join the denominator only); a row
    with no finite score is zeros, as ggml's kernel gives."""
    scale, max_bias = get_op_params_f32(node, 0), get_op_params_f32(node, 1)
    x = a * scale
    if mask is not None:
        m = mask[:, :, :a.shape[2]]
        reps = tile_reps(m, a.shape[0], a.shape[1])
        if reps is not None:
            m = m.repeat(*reps, 1, 1)
        if max_bias > 0.0:
            m = m * alibi_slopes(a.shape[1], max_bias, m.device).to(m.dtype).view(1, -1, 1, 1)
        x = x + m
    peak = x.detach().amax(-1, keepdim=True)
    if sinks is not None:
        sinks = sinks.reshape(1, -1, 1, 1)
        peak = torch.maximum(peak, sinks.detach())
    peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
    e = torch.exp(x - peak)
    total = e.sum(-1, keepdim=True)
    if sinks is not None:
        total = total + torch.exp(sinks - peak)
    return e / torch.where(total == 0, torch.ones_like(total), total)


def _rope(node, x, positions, factors=None):
    """The rotation of the reference kernel: cos/sin from the op params and positions (no
    gradient flows to positions), applied to x's rotary pairs."""
    p = rope_params(node)
    n_tokens = x.shape[1]
    axes, inv_freq, yarn, yarn_mscale = angle_constants(
        p.n_pairs, p.n_dims, p.mode, p.sections, p.freq_base, p.freq_scale, p.ext_factor, p.n_ctx_orig,
        p.beta_fast, p.beta_slow, x.device)
    pos = positions.reshape(-1).detach()
    if axes is None:
        pos = pos[:n_tokens].view(1, n_tokens, 1, 1)
    fac = factors.reshape(-1)[:p.n_pairs].detach() if factors is not None else None
    cos, sin = rope_angles(pos, n_tokens, axes, inv_freq, fac, p.freq_scale, yarn, p.attn_factor * yarn_mscale)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    start, width = rotated_span(p, x.shape[-1])
    interleaved = p.mode == RopeType.NORMAL
    x0, x1 = pair_halves(x, start, width, interleaved)
    r0, r1 = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    rotated = torch.stack((r0, r1), -1).flatten(-2) if interleaved else torch.cat((r0, r1), -1)
    return torch.cat((x[..., :start], rotated, x[..., start + width:]), -1)


def _get_rows(node, a, ids):
    """out[k, j, i, :] = a[k, j, ids[k, j, i], :] (ids [1, b2, b1, n])."""
    idx = ids[0].long()
    k = torch.arange(idx.shape[0], device=idx.device).view(-1, 1, 1)
    j = torch.arange(idx.shape[1], device=idx.device).view(1, -1, 1)
    return a[k, j, idx]


def _set_rows(node, b, c, a):
    """a with rows c replaced by b's rows: a[k, j, c[k % c2, j % c1, i], :] = b[k, j, i, :]."""
    k = torch.arange(b.shape[0], device=b.device).view(-1, 1, 1)
    j = torch.arange(b.shape[1], device=b.device).view(1, -1, 1)
    idx = c[0].long()[k % c.shape[1], j % c.shape[2], torch.arange(b.shape[2], device=b.device)]
    return a.index_put((k, j, idx), b.to(a.dtype))


def _glu(node, a, b=None):
    if b is None:
        n = node.ne[0]
        x, g = a[..., :n], a[..., n:2 * n]
        if node.op_params[1]:
            x, g = g, x
    else:
        x, g = a, b
    op = get_glu_op(node)
    if op == GluOp.SWIGLU_OAI:
        return swiglu_oai_torch(x, g, node)
    return GLU_ACTIVATIONS[op](x) * g


def _reshaped(node, a, *_):
    """CONT/DUP/CPY: a's elements in row-major order, in the node's shape."""
    return a.reshape(_shape(node))


def _custom(node, *srcs):
    """MAP_CUSTOM*/CUSTOM: the user's callable on detached values (no gradient through it)."""
    from ..ops.custom import run_custom
    out = torch.empty(_shape(node), dtype=srcs[0].dtype if srcs else torch.float32,
                      device=srcs[0].device if srcs else None)
    run_custom(node, out, [s.detach() if s is not None else None for s in srcs])
    return out


RULES = {
    Op.ADD: _binary(torch.add), Op.SUB: _binary(torch.sub), Op.MUL: _binary(torch.mul),
    Op.DIV: _binary(torch.div),
    Op.ADD1: lambda node, a, b: a + b.reshape(()),
    Op.SCALE: lambda node, a: a * get_op_params_f32(node, 0) + get_op_params_f32(node, 1),
    Op.MUL_MAT: _mul_mat,
    Op.RMS_NORM: _rms_norm,
    Op.NORM: _norm,
    Op.SOFT_MAX: _soft_max,
    Op.ROPE: _rope,
    Op.GET_ROWS: _get_rows,
    Op.SET_ROWS: _set_rows,
    Op.GLU: _glu,
    Op.UNARY: lambda node, a: UNARY_FUNCTIONS[get_unary_op(node)](a, node),
    Op.CONT: _reshaped, Op.DUP: _reshaped, Op.CPY: _reshaped,
    Op.REPEAT: lambda node, a, *_: tile(a, _shape(node)),
    Op.SUM: lambda node, a: a.sum().reshape(1, 1, 1, 1),
    Op.SUM_ROWS: lambda node, a: a.sum(-1, keepdim=True),
    Op.MEAN: lambda node, a: a.mean(-1, keepdim=True),
    Op.CLAMP: lambda node, a: a.clamp(get_op_params_f32(node, 0), get_op_params_f32(node, 1)),
    Op.MAP_CUSTOM1: _custom, Op.MAP_CUSTOM2: _custom, Op.MAP_CUSTOM3: _custom, Op.CUSTOM: _custom,
    **{op: (lambda fn: lambda node, a: fn(a))(fn) for op, fn in MATH_FUNCTIONS.items()},
}

# how many leading sources each rule takes (the rest of node.src is not passed)
_N_SRC = {Op.SOFT_MAX: 3, Op.ROPE: 3, Op.GLU: 2, Op.SET_ROWS: 3}


def differentiable_ops() -> frozenset:
    """The ops graph_function can differentiate through (plus the view ops)."""
    return frozenset(RULES)


# ---------------------------------------------------------------- the evaluator

class GraphEvaluator:
    """Evaluates the nodes of `graph` that `outputs` depend on, with torch functions.

    `given` maps ggml tensors (contiguous roots: graph inputs and trainable parameters) to
    their torch values; every other leaf is read from its memory (dequantized) as a constant.
    Values are computed in `dtype` (float64 for gradcheck); in float32, F16/BF16 nodes are
    rounded to their type as ggml stores them (the gradient passes the rounding unchanged)."""

    def __init__(self, graph, outputs, read_weight=None):
        needed = _ancestors(outputs)
        self.nodes = [n for n in graph.nodes if id(n) in needed]
        self.outputs = list(outputs)
        # fn(tensor) -> float values, for weights whose memory is not in ggml's layout (repacked)
        self.read_weight = read_weight

    def __call__(self, given: dict, dtype=torch.float32, device=None) -> list[torch.Tensor]:
        self.dtype, self.device = dtype, device
        self.values: dict[int, torch.Tensor] = {}
        self.memory: dict[int, torch.Tensor] = {}  # root id -> flat value in ggml element order
        for t, value in given.items():
            if t.view_src is not None or not _contiguous(t):
                raise ValueError(f"graph_function: {t.describe()} must be a contiguous tensor that is "
                                 f"not a view to be an input or a trainable parameter")
            self.values[id(t)] = value.reshape(_shape(t))
        try:
            for node in self.nodes:
                if node.op in VIEW_OPS or is_empty(node):
                    continue
                self._compute(node)
            return [self.value(t) for t in self.outputs]
        finally:  # autograd keeps what the backward needs; drop the rest now
            self.values, self.memory = {}, {}

    def value(self, t: Tensor) -> torch.Tensor:
        if t.view_src is None and id(t) in self.memory:  # a root written through a view
            return self.memory[id(t)].view(_shape(t))
        v = self.values.get(id(t))
        if v is not None:
            return v
        if t.view_src is not None:
            return self._view(t)
        if t.op != Op.NONE and t.op not in VIEW_OPS:
            raise RuntimeError(f"graph_function: {t.describe()} is used before it is computed")
        v = self.values[id(t)] = self._constant(t)
        return v

    def _constant(self, t: Tensor) -> torch.Tensor:
        from ..devices.kernels.common import as_float
        from ..storage import tensor_view
        buffer = t.buffer if t.view_src is None else t.view_src.buffer
        if not buffer.ggml_layout:
            if self.read_weight is None:
                raise ValueError(f"graph_function: {t.describe()} is stored in a repacked layout; pass "
                                 f"read_weight to differentiate through it (or load with repack=False)")
            v = self.read_weight(t).to(self.dtype).reshape(_shape(t))
        elif _is_integer(t):
            v = tensor_view(t).clone()  # ids, positions
        else:
            v = as_float(t, self.dtype)
        return v.to(self.device) if self.device is not None else v

    def _root_memory(self, root: Tensor) -> torch.Tensor:
        mem = self.memory.get(id(root))
        if mem is None:
            mem = self.memory[id(root)] = self.value(root).reshape(-1) if _contiguous(root) else None
            if mem is None:
                raise ValueError(f"graph_function: views of the non-contiguous {root.describe()} "
                                 f"cannot be differentiated")
        return mem

    def _strided(self, t: Tensor):
        es = type_traits(t.type).type_size
        if type_traits(t.type).blck_size != 1:
            return None
        return _shape(t), tuple(n // es for n in reversed(t.nb)), t.view_offs // es

    def _view(self, t: Tensor) -> torch.Tensor:
        layout = self._strided(t)
        if layout is None:  # a view of block data: read (dequantized) as a constant
            return self._constant(t)
        shape, stride, offset = layout
        return self._root_memory(t.view_src).as_strided(shape, stride, offset)

    def _compute(self, node: Tensor) -> None:
        rule = RULES.get(node.op)
        if rule is None:
            raise UnsupportedOpError(f"graph_function: op {node.op.name} of {node.describe()} has no "
                                     f"differentiable torch rule (supported: "
                                     f"{', '.join(sorted(o.name for o in RULES))})")
        n_src = _N_SRC.get(node.op, sum(s is not None for s in node.src))
        srcs = [self.value(s) if s is not None else None for s in node.src[:n_src]]
        v = rule(node, *srcs)
        if v.is_floating_point():
            low = _LOW_PRECISION.get(node.type)
            if low is not None and self.dtype == torch.float32:
                v = v + (v.to(low).to(v.dtype) - v).detach()  # ggml's rounding, gradient unchanged
            v = v.to(self.dtype)
        v = v.reshape(_shape(node))
        self.values[id(node)] = v
        root = node.view_src
        if root is not None:  # the op wrote into a view: the root's memory changes
            layout = self._strided(node)
            if layout is None:
                raise UnsupportedOpError(f"graph_function: {node.describe()} writes into block-type memory")
            shape, stride, offset = layout
            mem = self._root_memory(root)
            self.memory[id(root)] = mem.as_strided_scatter(v.to(mem.dtype), shape, stride, offset)


def _is_integer(t: Tensor) -> bool:
    dtype = type_traits(t.type).dtype
    return dtype is not None and not dtype.is_floating_point


def _contiguous(t: Tensor) -> bool:
    from ..tensor import is_contiguous
    return is_contiguous(t)


def _ancestors(outputs) -> set:
    """ids of every tensor the outputs depend on (sources and view roots)."""
    seen, stack = set(), list(outputs)
    while stack:
        t = stack.pop()
        if t is None or id(t) in seen:
            continue
        seen.add(id(t))
        stack.extend(s for s in t.src if s is not None)
        if t.view_src is not None:
            stack.append(t.view_src)
    return seen
