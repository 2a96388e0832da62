"""ggml's backward graph: build_backward_expand, graph_get_grad(_acc), graph_reset.

A graph made with new_graph_custom(ctx, size, grads=True) maps each of its tensors to a
gradient tensor (and, for parameters and losses, to an accumulator). build_backward_expand
walks the forward nodes from last to first and, for each node whose gradient exists, adds to
its sources' gradients the ops of ggml's rule for that op (ggml.c's ggml_compute_backward: the
same ops, so a graph trained here matches one trained by ggml). Gradients are graph nodes like
any other: they are computed by the same backend in the same graph_compute."""
from __future__ import annotations

from . import ops
from .context import new_tensor
from .enums import Op, UnaryOp, GluOp, TensorFlag
from .graph import CGraph, build_forward_expand
from .tensor import (Tensor, are_same_shape, format_name, get_op_params_f32, get_op_params_i32, get_glu_op,
                     get_unary_op, is_contiguous, is_scalar)
from .types import Type

__all__ = ["build_backward_expand", "graph_get_grad", "graph_get_grad_acc", "graph_reset"]

_PARAM, _LOSS = int(TensorFlag.PARAM), int(TensorFlag.LOSS)
# ops whose result may be a view of a source and still have a gradient (others in place: refused)
_VIEWING_OPS = frozenset({Op.CPY, Op.VIEW, Op.RESHAPE, Op.PERMUTE, Op.TRANSPOSE})


def _grads_of(cgraph: CGraph, fn: str) -> tuple[dict, dict]:
    if cgraph.grads is None:
        raise ValueError(f"{fn}: the graph has no gradients (create it with new_graph_custom(ctx, size, grads=True))")
    return cgraph.grads, cgraph.grad_accs


def graph_get_grad(cgraph: CGraph, node: Tensor) -> Tensor | None:
    """The gradient of node in the backward graph (None where none flows or no grads)."""
    return cgraph.grads.get(id(node)) if cgraph.grads is not None else None


def graph_get_grad_acc(cgraph: CGraph, node: Tensor) -> Tensor | None:
    """The gradient accumulator of node (parameters given one, and every loss)."""
    return cgraph.grad_accs.get(id(node)) if cgraph.grad_accs is not None else None


# ---------------------------------------------------------------- adding to a source's gradient

class _Backward:
    """One build_backward_expand: the rules below add to sources' gradients through these."""

    def __init__(self, ctx, cgraph: CGraph, needed: set):
        self.ctx, self.graph, self.needed = ctx, cgraph, needed
        self.grads, self.accs = cgraph.grads, cgraph.grad_accs

    def wants(self, src: Tensor | None) -> bool:
        return src is not None and id(src) in self.graph.visited and id(src) in self.needed

    def _store(self, src: Tensor, grad: Tensor) -> None:
        self.grads[id(src)] = grad
        format_name(grad, "grad for %s", src.name)
        build_forward_expand(self.graph, grad)

    def _combine(self, src: Tensor, tensor: Tensor, plain, inplace, first) -> None:
        """grad = plain(grad, tensor) (in place into an accumulator), or first(tensor) if none yet."""
        old = self.grads.get(id(src))
        if old is None:
            self._store(src, first(tensor))
        else:
            combine = inplace if id(src) in self.accs else plain
            self._store(src, combine(self.ctx, old, tensor))

    def add(self, src, tensor):
        self._combine(src, tensor, ops.add, ops.add_inplace, lambda t: t)

    def sub(self, src, tensor):
        self._combine(src, tensor, ops.sub, ops.sub_inplace, lambda t: ops.neg(self.ctx, t))

    def add1(self, src, tensor):
        self._combine(src, tensor, ops.add1, ops.add1_inplace, lambda t: ops.repeat(self.ctx, t, src))

    def acc(self, src, tensor, nb1, nb2, nb3, offset):
        acc, acc_inplace = _need_op("acc", "VIEW"), _need_op("acc_inplace", "VIEW")
        old = self.grads.get(id(src))
        if old is None:  # zeros of src's shape (as ggml: NaN where src holds inf/NaN)
            self._store(src, acc(self.ctx, ops.scale(self.ctx, src, 0.0), tensor, nb1, nb2, nb3, offset))
        else:
            fn = acc_inplace if id(src) in self.accs else acc
            self._store(src, fn(self.ctx, old, tensor, nb1, nb2, nb3, offset))


def _need_op(name: str, for_op: str):
    fn = getattr(ops, name, None)
    if fn is None:
        raise NotImplementedError(f"build_backward_expand: the gradient of {for_op} needs ggml.{name}, "
                                  "which this torchggml lacks")
    return fn


def _size_t(t: Tensor, word: int) -> int:
    lo, hi = t.op_params[word] & 0xFFFFFFFF, t.op_params[word + 1] & 0xFFFFFFFF
    return lo | (hi << 32)


def _acc_params(t: Tensor) -> tuple[int, int, int, int]:
    """nb1, nb2, nb3, offset of an ACC/SET node (int32 op params)."""
    return tuple(get_op_params_i32(t, i) for i in range(4))


# ---------------------------------------------------------------- the rules, per op

def _mul_mat_grad_a(b: _Backward, node, a, x, grad):
    """d(a) = out_prod(x, grad), summed over the broadcast groups of a (a repeat-interleaved)."""
    ctx = b.ctx
    tmp = ops.out_prod(ctx, x, grad)
    if not are_same_shape(tmp, a):
        if tmp.ne[3] != 1:
            raise ValueError(f"build_backward_expand: mul_mat gradient of a broadcast over dim 3 is not "
                             f"supported by ggml [{node.describe()}]")
        groups = tmp.ne[2] // a.ne[2]
        tmp = ops.view_4d(ctx, tmp, a.ne[0], a.ne[1], a.ne[2], groups, tmp.nb[1], tmp.nb[2] * groups, tmp.nb[2], 0)
        tmp = ops.repeat_back(ctx, tmp, a)
    return tmp


def _rope_back(ctx, node, grad):
    x, pos, factors = node.src[0], node.src[1], node.src[2]
    n_dims, mode, n_ctx_orig = (get_op_params_i32(node, i) for i in (1, 2, 4))
    floats = [get_op_params_f32(node, i) for i in range(5, 11)]
    if grad.ne[2] == pos.ne[0]:
        return ops.rope_ext_back(ctx, grad, pos, factors, n_dims, mode, n_ctx_orig, *floats)
    sections = [get_op_params_i32(node, i) for i in range(11, 15)]
    return ops.rope_multi_back(ctx, grad, pos, factors, n_dims, sections, mode, n_ctx_orig, *floats)


def _unary_backward(b: _Backward, node, s0, grad):
    ctx, uop = b.ctx, get_unary_op(node)
    if uop in (UnaryOp.SGN, UnaryOp.STEP):
        return  # piecewise constant
    if not b.wants(s0):
        return
    if uop == UnaryOp.ABS:
        b.add(s0, ops.mul(ctx, ops.sgn(ctx, s0), grad))
    elif uop == UnaryOp.NEG:
        b.sub(s0, grad)
    elif uop == UnaryOp.RELU:
        b.add(s0, ops.mul(ctx, ops.step(ctx, s0), grad))
    elif uop == UnaryOp.SILU:
        b.add(s0, ops.silu_back(ctx, grad, s0))
    elif uop == UnaryOp.EXP:
        b.add(s0, ops.mul(ctx, node, grad))
    elif uop.name == "EXPM1":
        b.add(s0, ops.mul(ctx, grad, ops.exp(ctx, s0)))
    elif uop.name == "SOFTPLUS":
        b.add(s0, ops.mul(ctx, grad, ops.sigmoid(ctx, s0)))
    else:
        raise NotImplementedError(f"build_backward_expand: no gradient for unary op {uop.name} (as ggml) "
                                  f"[{node.describe()}]")


def _compute_backward(b: _Backward, node: Tensor) -> None:
    grad = b.grads.get(id(node))
    if grad is None:
        return
    ctx = b.ctx
    s0, s1, s2 = node.src[0], node.src[1], node.src[2]
    w0, w1, w2 = b.wants(s0), b.wants(s1), b.wants(s2)
    op = node.op
    if op == Op.NONE:
        pass
    elif op == Op.DUP:
        if w0:
            b.add(s0, grad)
    elif op == Op.ADD:
        if w0:
            b.add(s0, grad)
        if w1:
            b.add(s1, grad if are_same_shape(s0, s1) else ops.repeat_back(ctx, grad, s1))
    elif op == Op.ADD1:
        if w0:
            b.add(s0, grad)
        if w1:
            b.add(s1, ops.mean(ctx, grad))  # ggml: mean (its TODO says sum)
    elif op == Op.ACC:
        if w0:
            b.add(s0, grad)
        if w1:
            nb1, nb2, nb3, offset = _acc_params(node)
            view = ops.view_4d(ctx, grad, *s1.ne, nb1, nb2, nb3, offset)
            b.add(s1, ops.reshape(ctx, ops.cont(ctx, view), s1))
    elif op == Op.SUB:
        if w0:
            b.add(s0, grad)
        if w1:
            b.sub(s1, grad)
    elif op == Op.MUL:
        if w0:
            b.add(s0, ops.mul(ctx, grad, s1))
        if w1:
            tmp = ops.mul(ctx, s0, grad)
            b.add(s1, tmp if are_same_shape(s0, s1) else ops.repeat_back(ctx, tmp, s1))
    elif op == Op.DIV:
        if w0:
            b.add(s0, ops.div(ctx, grad, s1))
        if w1:
            b.sub(s1, ops.mul(ctx, grad, ops.div(ctx, node, s1)))
    elif op == Op.SQR:
        if w0:
            b.add(s0, ops.scale(ctx, ops.mul(ctx, s0, grad), 2.0))
    elif op == Op.SQRT:
        if w0:
            b.add(s0, ops.scale(ctx, ops.div(ctx, grad, node), 0.5))
    elif op == Op.LOG:
        if w0:
            b.add(s0, ops.div(ctx, grad, s0))
    elif op == Op.SIN:
        if w0:
            b.add(s0, ops.mul(ctx, grad, ops.cos(ctx, s0)))
    elif op == Op.COS:
        if w0:
            b.sub(s0, ops.mul(ctx, grad, ops.sin(ctx, s0)))
    elif op == Op.SUM:
        if w0:
            b.add1(s0, grad)
    elif op == Op.SUM_ROWS:
        if w0:
            b.add(s0, ops.repeat(ctx, grad, s0))
    elif op == Op.MEAN:
        if w0:
            b.add1(s0, ops.scale(ctx, grad, 1.0 / s0.ne[0]))
    elif op == Op.REPEAT:
        if w0:
            b.add(s0, ops.repeat_back(ctx, grad, s0))
    elif op == Op.REPEAT_BACK:
        if w0:
            b.add(s0, ops.repeat(ctx, grad, s0))
    elif op == Op.RMS_NORM:
        if w0:
            b.add(s0, ops.rms_norm_back(ctx, grad, s0, get_op_params_f32(node, 0)))
    elif op == Op.MUL_MAT:
        if w0:
            if grad.ne[2] != s1.ne[2] or grad.ne[3] != s1.ne[3]:
                raise ValueError(f"build_backward_expand: mul_mat gradient shape mismatch [{node.describe()}]")
            b.add(s0, _mul_mat_grad_a(b, node, s0, s1, grad))
        if w1:
            b.add(s1, ops.out_prod(ctx, s0, ops.transpose(ctx, grad)))
    elif op == Op.SCALE:
        if w0:
            b.add(s0, ops.scale(ctx, grad, get_op_params_f32(node, 0)))
    elif op == Op.SET:
        nb1, nb2, nb3, offset = _acc_params(node)
        if w0 or w1:
            view = ops.view_4d(ctx, grad, *s1.ne, nb1, nb2, nb3, offset)
            if w0:
                acc = _need_op("acc", "SET")
                b.add(s0, acc(ctx, grad, ops.neg(ctx, view), nb1, nb2, nb3, offset))
            if w1:
                b.add(s1, ops.reshape(ctx, ops.cont(ctx, view), s1))
    elif op == Op.CPY:
        if w0:  # the target (src1) is overwritten: no gradient to it
            b.add(s0, ops.reshape(ctx, grad, s0))
    elif op == Op.CONT:
        if w0:
            b.add(s0, grad if are_same_shape(node, s0) else ops.reshape(ctx, grad, s0))
    elif op == Op.RESHAPE:
        if w0:
            b.add(s0, ops.reshape(ctx, grad if is_contiguous(grad) else ops.cont(ctx, grad), s0))
    elif op == Op.VIEW:
        if w0:
            _view_backward(b, node, s0, grad)
    elif op == Op.PERMUTE:
        if w0:
            axes = [get_op_params_i32(node, i) & 3 for i in range(4)]
            back = [0] * 4
            for i, ax in enumerate(axes):
                back[ax] = i
            b.add(s0, ops.permute(ctx, grad, *back))
    elif op == Op.TRANSPOSE:
        if w0:
            b.add(s0, ops.transpose(ctx, grad))
    elif op == Op.GET_ROWS:
        if w0:
            b.add(s0, ops.get_rows_back(ctx, grad, s1, s0))
    elif op in (Op.DIAG_MASK_INF, Op.DIAG_MASK_ZERO):
        if w0:
            b.add(s0, ops.diag_mask_zero(ctx, grad, get_op_params_i32(node, 0)))
    elif op == Op.SOFT_MAX:
        if w1:
            raise NotImplementedError(f"build_backward_expand: no gradient for the soft_max mask (as ggml) "
                                      f"[{node.describe()}]")
        if w0:
            b.add(s0, ops.soft_max_ext_back(ctx, grad, node, get_op_params_f32(node, 0), get_op_params_f32(node, 1)))
    elif op == Op.ROPE:
        if w2:
            raise NotImplementedError(f"build_backward_expand: no gradient for rope's frequency factors (as ggml) "
                                      f"[{node.describe()}]")
        if w0:
            b.add(s0, _rope_back(ctx, node, grad))
    elif op == Op.IM2COL:
        if w1:
            im2col_back = _need_op("im2col_back", "IM2COL")
            s0_, s1_, p0, p1, d0, d1, is_2d = (get_op_params_i32(node, i) for i in range(7))
            b.add(s1, im2col_back(ctx, grad, s0, list(s1.ne), s0_, s1_, p0, p1, d0, d1, is_2d == 1))
    elif op == Op.POOL_2D:
        if w0:
            pool_2d_back = _need_op("pool_2d_back", "POOL_2D")
            pool_op, k0, k1, st0, st1, p0, p1 = (get_op_params_i32(node, i) for i in range(7))
            b.add(s0, pool_2d_back(ctx, grad, s0, pool_op, k0, k1, st0, st1, p0, p1))
    elif op == Op.UNARY:
        _unary_backward(b, node, s0, grad)
    elif op == Op.CROSS_ENTROPY_LOSS:
        if w1:
            raise NotImplementedError(f"build_backward_expand: no gradient for the labels (as ggml) "
                                      f"[{node.describe()}]")
        if w0:
            b.add(s0, ops.cross_entropy_loss_back(ctx, grad, s0, s1))
    elif op == Op.GLU:
        if get_glu_op(node) != GluOp.SWIGLU or s1 is None:
            raise NotImplementedError(f"build_backward_expand: ggml has gradients only for split swiglu "
                                      f"[{node.describe()}]")
        if w0:
            b.add(s0, ops.silu_back(ctx, ops.mul(ctx, grad, s1), s0))
        if w1:
            b.add(s1, ops.mul(ctx, ops.silu(ctx, s0), grad))
    else:
        raise NotImplementedError(f"build_backward_expand: ggml has no backward pass for op {op.name} "
                                  f"[{node.describe()}]")
    for i, (src, wanted) in enumerate(((s0, w0), (s1, w1), (s2, w2))):
        if wanted and id(src) not in b.grads:  # ggml has no rule for this source (e.g. soft_max's sinks)
            raise NotImplementedError(f"build_backward_expand: ggml has no gradient for source {i} of op {op.name} "
                                      f"[{node.describe()}; {src.describe()}]")
        if wanted and not are_same_shape(src, b.grads[id(src)]):
            raise AssertionError(f"build_backward_expand: gradient of {src.describe()} has shape "
                                 f"{b.grads[id(src)].ne} [{node.describe()}]")


def _view_backward(b: _Backward, node, s0, grad):
    """The view's gradient accumulates into s0's at the view's offset and strides (rescaled when
    s0's gradient has another element size than s0)."""
    offset = _size_t(node, 0)
    nb1, nb2, nb3 = node.nb[1], node.nb[2], node.nb[3]
    old = b.grads.get(id(s0))
    if old is not None and old.type != s0.type:
        from .types import type_size
        ng, n0 = type_size(old.type), type_size(s0.type)
        offset, nb1, nb2, nb3 = ((v // n0) * ng for v in (offset, nb1, nb2, nb3))
    b.acc(s0, grad, nb1, nb2, nb3, offset)


# ---------------------------------------------------------------- the pass

def _ignored_sources(node: Tensor) -> frozenset:
    """Sources whose gradient does not matter to the node's (ggml's list)."""
    if node.op.name in ("IM2COL", "IM2COL_BACK"):
        return frozenset({0})  # only its shape is used
    if node.op == Op.UNARY and get_unary_op(node) in (UnaryOp.SGN, UnaryOp.STEP):
        return frozenset({0})
    if node.op in (Op.CPY, Op.GET_ROWS, Op.GET_ROWS_BACK, Op.ROPE):
        return frozenset({1})  # copy target, row indices, positions
    return frozenset()


def build_backward_expand(ctx, cgraph: CGraph, grad_accs=None) -> None:
    """Add the backward pass to cgraph (made with grads=True; built forward first, with
    set_param on the trainable leafs and set_loss on the loss). grad_accs: optional per-node
    accumulators (a list as long as the forward's nodes, None where none). A loss gets an F32
    accumulator of its shape in ctx; graph_reset sets it to 1 before a compute."""
    _grads_of(cgraph, "build_backward_expand")
    nodes = list(cgraph.nodes)
    if not nodes:
        raise ValueError("build_backward_expand: the graph has no nodes (build the forward pass first)")
    if not any(n.flags & _PARAM for n in nodes):
        raise ValueError("build_backward_expand: no trainable parameters found (set_param)")
    if not any(n.flags & _LOSS for n in nodes):
        raise ValueError("build_backward_expand: no training loss found (set_loss)")
    cgraph.grads.clear()
    cgraph.grad_accs.clear()
    needed: set[int] = set()
    for i, node in enumerate(nodes):
        if node.type == Type.I32:
            continue
        needs_grad = bool(node.flags & (_PARAM | _LOSS))
        ignored = _ignored_sources(node)
        for j, src in enumerate(node.src):
            if src is None or j in ignored or id(src) not in needed:
                continue
            if src.type not in (Type.F32, Type.F16):
                raise ValueError(f"build_backward_expand: gradients need F32/F16 sources, got {src.describe()} "
                                 f"[{node.describe()}]")
            needs_grad = True
            break
        if not needs_grad:
            continue
        if node.view_src is not None and node.op not in _VIEWING_OPS:
            raise ValueError(f"build_backward_expand: in-place ops are not supported [{node.describe()}]")
        acc = grad_accs[i] if grad_accs is not None and i < len(grad_accs) else None
        if acc is None and node.flags & _LOSS:
            acc = new_tensor(ctx, Type.F32, node.ne)
        if acc is not None:
            cgraph.grad_accs[id(node)] = acc
            cgraph.grads[id(node)] = acc
        needed.add(id(node))
    backward = _Backward(ctx, cgraph, needed)
    for node in reversed(nodes):
        _compute_backward(backward, node)


def graph_reset(cgraph: CGraph) -> None:
    """Before a training step: losses' gradient accumulators to 1, other accumulators and the
    AdamW moments to 0 (the tensors must have memory)."""
    from .storage import tensor_view
    if cgraph is None:
        return
    _grads_of(cgraph, "graph_reset")
    for node in cgraph.nodes:
        if node.op == Op.OPT_STEP_ADAMW:
            tensor_view(node.src[2]).zero_()
            tensor_view(node.src[3]).zero_()
        acc = graph_get_grad_acc(cgraph, node)
        if acc is None:
            continue
        if node.flags & _LOSS:
            if acc.type != Type.F32 or not is_scalar(acc):
                raise ValueError(f"graph_reset: a loss's gradient must be an F32 scalar, got {acc.describe()}")
            tensor_view(acc).fill_(1.0)
        else:
            tensor_view(acc).zero_()
