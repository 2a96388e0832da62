"""Training: the *_BACK ops against torch autograd, cross-entropy against torch, the optimizer
steps against torch.optim, ggml's backward graph of a small MLP against torch autograd, and
the gradient of every differentiable op against finite differences (test-ops' grad mode)."""
import pytest
import torch
import torch.nn.functional as F

import torchggml as ggml
from torchggml.test_ops.cases.rope import rope_ref
from torchggml.test_ops.cases.table import OpCase
from torchggml.test_ops.cases.values import uniform
from torchggml.test_ops.runner import check_grad

T = ggml.Type
R = ggml.RopeType


@pytest.fixture(scope="module")
def cpu():
    return ggml.backend_cpu_init()


def torch_shape(t):
    return tuple(reversed(t.ne))


def compute(cpu, build, values):
    """build(ctx) -> (out, inputs); inputs filled from `values` (torch order); returns out's values
    and the inputs' values after the compute (the optimizer steps update them in place)."""
    ctx = ggml.init(no_alloc=True)
    out, inputs = build(ctx)
    graph = ggml.new_graph_custom(ctx, 256)
    ggml.build_forward_expand(graph, out)
    buf = ggml.backend_alloc_ctx_tensors(ctx, cpu)
    try:
        for t, v in zip(inputs, values):
            ggml.backend_tensor_set(t, v.to(ggml.type_to_dtype(t.type)).contiguous())
        ggml.backend_graph_compute(cpu, graph)
        read = lambda t: ggml.backend_tensor_get(t).reshape(torch_shape(t)).double()
        return read(out), [read(t) for t in inputs]
    finally:
        ggml.backend_buffer_free(buf)
        ggml.free(ctx)


def vjp(fn, x, dy):
    """d(sum(fn(x) * dy))/dx by torch autograd, in float64."""
    x = x.double().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(fn(x), x, dy.double())
    return grad


# ---------------------------------------------------------------- *_BACK ops vs torch autograd

def _rope_back_case(mode, sections=None, n_dims=16, ne=(32, 3, 5, 1), attn_factor=1.0, freq_scale=1.0,
                    ext_factor=0.0):
    n_pos = ne[2] * (4 if sections else 1)

    def build(ctx):
        dy = ggml.new_tensor(ctx, T.F32, list(ne))
        pos = ggml.new_tensor_1d(ctx, T.I32, n_pos)
        args = (n_dims, mode, 64, 10000.0, freq_scale, ext_factor, attn_factor, 32.0, 1.0)
        if sections:
            return ggml.rope_multi_back(ctx, dy, pos, None, args[0], sections, *args[1:]), [dy, pos]
        return ggml.rope_ext_back(ctx, dy, pos, None, *args), [dy, pos]

    def values(gen):
        shape = tuple(reversed(ne))
        return [torch.randn(shape, generator=gen), torch.randint(0, 50, (n_pos,), generator=gen)]

    def expected(dy, pos):
        fn = lambda x: rope_ref(x, pos, None, n_dims, mode, sections or (0, 0, 0, 0), n_ctx_orig=64,
                                fs=freq_scale, ef=ext_factor, af=attn_factor, bf=32.0, bs=1.0)
        return vjp(fn, torch.zeros_like(dy), dy)
    return build, values, expected


def _unary_back(op, fn, ne=(17, 4, 3, 1)):
    def build(ctx):
        a = ggml.new_tensor(ctx, T.F32, list(ne))
        b = ggml.new_tensor(ctx, T.F32, list(ne))
        return op(ctx, a, b), [a, b]

    def values(gen):
        shape = tuple(reversed(ne))
        return [torch.randn(shape, generator=gen), torch.randn(shape, generator=gen) * 2]
    return build, values, lambda dy, x: vjp(fn, x, dy)


def _soft_max_back(scale):
    ne = (19, 6, 2, 1)

    def build(ctx):
        dy = ggml.new_tensor(ctx, T.F32, list(ne))
        y = ggml.new_tensor(ctx, T.F32, list(ne))
        return ggml.soft_max_ext_back(ctx, dy, y, scale, 0.0), [dy, y]

    x = {}

    def values(gen):
        shape = tuple(reversed(ne))
        x["x"] = torch.randn(shape, generator=gen, dtype=torch.float64)
        return [torch.randn(shape, generator=gen), torch.softmax(x["x"] * scale, -1).float()]
    return build, values, lambda dy, y: vjp(lambda v: torch.softmax(v * scale, -1), x["x"], dy)


def _get_rows_back():
    def build(ctx):
        dy = ggml.new_tensor_2d(ctx, T.F32, 12, 7)
        rows = ggml.new_tensor_1d(ctx, T.I32, 7)
        data = ggml.new_tensor_2d(ctx, T.F32, 12, 5)
        return ggml.get_rows_back(ctx, dy, rows, data), [dy, rows, data]

    def values(gen):  # repeated indices: their rows' gradients add up
        return [torch.randn(7, 12, generator=gen), torch.tensor([0, 3, 3, 1, 4, 0, 3]), torch.zeros(5, 12)]

    def expected(dy, rows, data):
        return vjp(lambda d: d[..., rows.reshape(-1).long(), :], data, dy)
    return build, values, expected


def _repeat_back(reps):
    small = (8, 3, 2, 2)

    def build(ctx):
        big = ggml.new_tensor(ctx, T.F32, [s * r for s, r in zip(small, reps)])
        like = ggml.new_tensor(ctx, T.F32, list(small))
        return ggml.repeat_back(ctx, big, like), [big, like]

    def values(gen):
        return [torch.randn(tuple(reversed([s * r for s, r in zip(small, reps)])), generator=gen),
                torch.zeros(tuple(reversed(small)))]
    return build, values, lambda dy, like: vjp(lambda x: x.repeat(*reversed(reps)), like, dy)


def _cross_entropy_loss_back():
    ne = (10, 6, 1, 1)

    def build(ctx):
        grad = ggml.new_tensor_1d(ctx, T.F32, 1)
        logits = ggml.new_tensor(ctx, T.F32, list(ne))
        labels = ggml.new_tensor(ctx, T.F32, list(ne))
        return ggml.cross_entropy_loss_back(ctx, grad, logits, labels), [grad, logits, labels]

    def values(gen):
        shape = tuple(reversed(ne))
        return [torch.tensor([0.7]), torch.randn(shape, generator=gen) * 3,
                torch.softmax(torch.randn(shape, generator=gen), -1)]

    def expected(grad, logits, labels):
        loss = lambda x: F.cross_entropy(x.reshape(-1, ne[0]), labels.reshape(-1, ne[0]), reduction="mean")
        return vjp(loss, logits, grad.reshape(()))
    return build, values, expected


def _rms_norm_x(x, eps=1e-5):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)


BACK_CASES = {
    "silu_back": _unary_back(ggml.silu_back, F.silu),
    "rms_norm_back": _unary_back(lambda ctx, a, b: ggml.rms_norm_back(ctx, a, b, 1e-5), _rms_norm_x),
    "rms_norm_back eps=0.5": _unary_back(lambda ctx, a, b: ggml.rms_norm_back(ctx, a, b, 0.5),
                                         lambda x: _rms_norm_x(x, 0.5)),
    "soft_max_ext_back": _soft_max_back(1.0),
    "soft_max_ext_back scale=0.3": _soft_max_back(0.3),
    "get_rows_back": _get_rows_back(),
    "repeat_back 1x1x1x1": _repeat_back((1, 1, 1, 1)),
    "repeat_back 2x3x1x2": _repeat_back((2, 3, 1, 2)),
    "cross_entropy_loss_back": _cross_entropy_loss_back(),
    "rope_ext_back normal": _rope_back_case(R.NORMAL),
    "rope_ext_back neox partial": _rope_back_case(R.NEOX, n_dims=8),
    "rope_ext_back yarn": _rope_back_case(R.NEOX, freq_scale=0.25, ext_factor=1.0, attn_factor=0.8),
    "rope_multi_back mrope": _rope_back_case(R.MROPE, sections=[2, 3, 3, 0]),
    "rope_multi_back vision": _rope_back_case(R.VISION, sections=[4, 4, 0, 0], n_dims=16),
}


@pytest.mark.parametrize("name", list(BACK_CASES))
def test_back_op_matches_torch_autograd(cpu, name):
    build, values, expected = BACK_CASES[name]
    gen = torch.Generator().manual_seed(7)
    vals = values(gen)
    out, stored = compute(cpu, build, vals)
    torch.testing.assert_close(out, expected(*stored).reshape(out.shape), rtol=1e-5, atol=1e-5)


def test_cross_entropy_loss_matches_torch(cpu):
    gen = torch.Generator().manual_seed(3)
    logits, labels = torch.randn(9, 33, generator=gen) * 4, torch.softmax(torch.randn(9, 33, generator=gen), -1)

    def build(ctx):
        a, b = ggml.new_tensor_2d(ctx, T.F32, 33, 9), ggml.new_tensor_2d(ctx, T.F32, 33, 9)
        return ggml.cross_entropy_loss(ctx, a, b), [a, b]
    out, _ = compute(cpu, build, [logits, labels])
    assert out.numel() == 1
    torch.testing.assert_close(out.reshape(()), F.cross_entropy(logits.double(), labels.double()), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- optimizer steps vs torch.optim

def _optimizer_run(cpu, n_steps, make_step, hyper_of):
    """n_steps of one ggml optimizer step node on w with fresh gradients each step; returns w."""
    gen = torch.Generator().manual_seed(11)
    w0 = torch.randn(5, 12, generator=gen)
    grads = [torch.randn(5, 12, generator=gen) for _ in range(n_steps)]
    ctx = ggml.init(no_alloc=True)
    w, g = ggml.new_tensor_2d(ctx, T.F32, 12, 5), ggml.new_tensor_2d(ctx, T.F32, 12, 5)
    ggml.set_param(w)
    step, state = make_step(ctx, w, g)
    graph = ggml.new_graph_custom(ctx, 64)
    ggml.build_forward_expand(graph, step)
    buf = ggml.backend_alloc_ctx_tensors(ctx, cpu)
    try:
        ggml.backend_tensor_set(w, w0)
        for t in state[:-1]:
            ggml.backend_tensor_set(t, torch.zeros(5, 12))
        for i, grad in enumerate(grads):
            ggml.backend_tensor_set(g, grad)
            ggml.backend_tensor_set(state[-1], torch.tensor(hyper_of(i + 1), dtype=torch.float32))
            ggml.backend_graph_compute(cpu, graph)
        return w0, grads, ggml.backend_tensor_get(w).reshape(5, 12)
    finally:
        ggml.backend_buffer_free(buf)
        ggml.free(ctx)


def _torch_run(w0, grads, optimizer):
    w = w0.clone().requires_grad_(True)
    opt = optimizer([w])
    for grad in grads:
        w.grad = grad.clone()
        opt.step()
    return w.detach()


def test_opt_step_adamw_matches_torch_adamw(cpu):
    lr, betas, eps, wd = 1e-2, (0.9, 0.99), 1e-6, 0.1

    def make(ctx, w, g):
        m, v = ggml.new_tensor_2d(ctx, T.F32, 12, 5), ggml.new_tensor_2d(ctx, T.F32, 12, 5)
        p = ggml.new_tensor_1d(ctx, T.F32, 7)
        return ggml.opt_step_adamw(ctx, w, g, m, v, p), [m, v, p]

    def hyper(t):  # ggml-opt's bias corrections for step t
        return [lr, betas[0], betas[1], eps, wd, 1 / (1 - betas[0] ** t), 1 / (1 - betas[1] ** t)]
    w0, grads, ours = _optimizer_run(cpu, 5, make, hyper)
    expected = _torch_run(w0, grads, lambda p: torch.optim.AdamW(p, lr=lr, betas=betas, eps=eps, weight_decay=wd))
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-6)


def test_opt_step_sgd_matches_torch_sgd(cpu):
    lr, wd = 0.05, 0.2

    def make(ctx, w, g):
        p = ggml.new_tensor_1d(ctx, T.F32, 2)
        return ggml.opt_step_sgd(ctx, w, g, p), [p]
    w0, grads, ours = _optimizer_run(cpu, 4, make, lambda t: [lr, wd])
    # torch's weight decay adds wd * w to the gradient: w - lr (g + wd w) = w (1 - lr wd) - lr g
    expected = _torch_run(w0, grads, lambda p: torch.optim.SGD(p, lr=lr, weight_decay=wd))
    torch.testing.assert_close(ours, expected, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- the backward graph of an MLP

def _mlp(ctx, act, loss_kind):
    x = ggml.new_tensor_2d(ctx, T.F32, 8, 5)
    w1, b1 = ggml.new_tensor_2d(ctx, T.F32, 8, 6), ggml.new_tensor_1d(ctx, T.F32, 6)
    w2 = ggml.new_tensor_2d(ctx, T.F32, 6, 4)
    labels = ggml.new_tensor_2d(ctx, T.F32, 4, 5)
    for p in (w1, b1, w2):
        ggml.set_param(p)
    h = (ggml.relu if act == "relu" else ggml.silu)(ctx, ggml.add(ctx, ggml.mul_mat(ctx, w1, x), b1))
    logits = ggml.mul_mat(ctx, w2, h)
    if loss_kind == "cross_entropy":
        loss = ggml.cross_entropy_loss(ctx, logits, labels)
    else:  # soft_max then a weighted sum: soft_max's own backward
        loss = ggml.sum(ctx, ggml.mul(ctx, ggml.soft_max(ctx, logits), labels))
    ggml.set_loss(loss)
    return loss, (x, labels), (w1, b1, w2)


def _mlp_torch(vals, act, loss_kind):
    x, labels, w1, b1, w2 = vals
    h = (torch.relu if act == "relu" else F.silu)(x @ w1.T + b1)
    logits = h @ w2.T
    if loss_kind == "cross_entropy":
        return F.cross_entropy(logits, labels)
    return (torch.softmax(logits, -1) * labels).sum()


def _mlp_values(seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(5, 8, generator=gen), torch.softmax(torch.randn(5, 4, generator=gen), -1),
            torch.randn(6, 8, generator=gen), torch.randn(6, generator=gen), torch.randn(4, 6, generator=gen)]


@pytest.mark.parametrize("act", ["relu", "silu"])
@pytest.mark.parametrize("loss_kind", ["cross_entropy", "soft_max"])
def test_mlp_backward_graph_matches_torch_autograd(cpu, act, loss_kind):
    ctx = ggml.init(no_alloc=True)
    loss, data, params = _mlp(ctx, act, loss_kind)
    graph = ggml.new_graph_custom(ctx, 1024, grads=True)
    ggml.build_forward_expand(graph, loss)
    n_forward = ggml.graph_n_nodes(graph)
    ggml.build_backward_expand(ctx, graph)
    grads = [ggml.graph_get_grad(graph, p) for p in params]
    for g in grads:
        ggml.build_forward_expand(graph, g)
    assert ggml.graph_n_nodes(graph) > n_forward
    assert ggml.graph_get_grad_acc(graph, loss) is not None and ggml.graph_get_grad_acc(graph, params[0]) is None
    buf = ggml.backend_alloc_ctx_tensors(ctx, cpu)
    try:
        vals = _mlp_values(1)
        for t, v in zip((*data, *params), vals):
            ggml.backend_tensor_set(t, v)
        ggml.graph_reset(graph)
        ggml.backend_graph_compute(cpu, graph)
        leaves = [v.double().requires_grad_(True) for v in vals]
        expected_loss = _mlp_torch(leaves, act, loss_kind)
        expected = torch.autograd.grad(expected_loss, leaves[2:])
        torch.testing.assert_close(ggml.backend_tensor_get(loss).double()[0], expected_loss.detach(),
                                   rtol=1e-5, atol=1e-6)
        for p, g, e in zip(params, grads, expected):
            torch.testing.assert_close(ggml.backend_tensor_get(g).double().reshape(e.shape), e, rtol=1e-4, atol=1e-5)
    finally:
        ggml.backend_buffer_free(buf)
        ggml.free(ctx)


def test_mlp_training_with_accumulators_and_adamw_matches_torch(cpu):
    """ggml-opt's loop: gradient accumulators per parameter (added to in place), graph_reset
    before each step, one opt_step_adamw per parameter in the same graph; 3 steps equal
    torch.optim.AdamW on the same MLP."""
    lr, betas, eps, wd = 1e-2, (0.9, 0.999), 1e-8, 0.01
    ctx = ggml.init(no_alloc=True)
    loss, data, params = _mlp(ctx, "silu", "cross_entropy")
    graph = ggml.new_graph_custom(ctx, 1024, grads=True)
    ggml.build_forward_expand(graph, loss)
    accs = [ggml.new_tensor(ctx, T.F32, p.ne) if p.flags & ggml.TensorFlag.PARAM else None for p in graph.nodes]
    ggml.build_backward_expand(ctx, graph, accs)
    hyper = ggml.new_tensor_1d(ctx, T.F32, 7)
    moments = []
    for p in params:
        m, v = ggml.new_tensor(ctx, T.F32, p.ne), ggml.new_tensor(ctx, T.F32, p.ne)
        moments.append((m, v))
        acc = ggml.graph_get_grad_acc(graph, p)  # the gradient is added into it in place
        assert acc is not None and ggml.graph_get_grad(graph, p).view_src is acc
        ggml.build_forward_expand(graph, ggml.opt_step_adamw(ctx, p, ggml.graph_get_grad(graph, p), m, v, hyper))
    buf = ggml.backend_alloc_ctx_tensors(ctx, cpu)
    try:
        vals = _mlp_values(2)
        for t, v in zip((*data, *params), vals):
            ggml.backend_tensor_set(t, v)
        for m, v in moments:  # garbage: graph_reset must clear the moments before step 1
            ggml.backend_tensor_set(m, torch.full(torch_shape(m), 5.0))
        weights = [v.clone().requires_grad_(True) for v in vals[2:]]
        opt = torch.optim.AdamW(weights, lr=lr, betas=betas, eps=eps, weight_decay=wd)
        for step in range(1, 4):
            ggml.backend_tensor_set(hyper, torch.tensor(
                [lr, betas[0], betas[1], eps, wd, 1 / (1 - betas[0] ** step), 1 / (1 - betas[1] ** step)]))
            if step == 1:
                ggml.graph_reset(graph)
            else:  # only the gradients: ggml-opt keeps the moments between steps
                for p in params:
                    ggml.backend_tensor_set(ggml.graph_get_grad_acc(graph, p), torch.zeros(torch_shape(p)))
            ggml.backend_graph_compute(cpu, graph)
            opt.zero_grad()
            _mlp_torch([vals[0], vals[1], *weights], "silu", "cross_entropy").backward()
            opt.step()
        for p, w in zip(params, weights):
            torch.testing.assert_close(ggml.backend_tensor_get(p).reshape(w.shape), w.detach(), rtol=1e-5, atol=1e-6)
    finally:
        ggml.backend_buffer_free(buf)
        ggml.free(ctx)


# ---------------------------------------------------------------- every differentiable op vs finite differences

def _g(op, desc, build, init=None, params=None, eps=1e-1, max_err=1e-4):
    return pytest.param(OpCase(op, desc, build, None, init=init or {}), params, eps, max_err, id=f"{op}({desc})")


def _new(ctx, *ne):
    return ggml.new_tensor(ctx, T.F32, list(ne))


def _one(op, ne=(5, 3, 2, 1)):
    def build(ctx):
        a = _new(ctx, *ne)
        return op(ctx, a), [a]
    return build


def _two(op, ne_a=(5, 3, 2, 1), ne_b=(5, 3, 2, 1)):
    def build(ctx):
        a, b = _new(ctx, *ne_a), _new(ctx, *ne_b)
        return op(ctx, a, b), [a, b]
    return build


def _weighted(op, ne=(5, 3, 2, 1)):
    """op(a) * w: soft_max rows sum to 1, so sum(soft_max(a)) alone has a zero gradient."""
    def build(ctx):
        a, w = _new(ctx, *ne), _new(ctx, *ne)
        return ggml.mul(ctx, op(ctx, a), w), [a, w]
    return build


POSITIVE = {0: uniform(0.5, 2.0), 1: uniform(0.5, 2.0)}
AWAY_FROM_ZERO = {0: lambda t, g: (torch.rand(torch_shape(t), generator=g) + 0.2) * torch.where(
    torch.rand(torch_shape(t), generator=g) > 0.5, 1.0, -1.0)}


def _rope_build(mode, sections=None):
    def build(ctx):
        a = _new(ctx, 8, 2, 3, 1)
        pos = ggml.new_tensor_1d(ctx, T.I32, 3 * (4 if sections else 1))
        if sections:
            return ggml.rope_multi(ctx, a, pos, None, 8, sections, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0), [a, pos]
        return ggml.rope_ext(ctx, a, pos, None, 8, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0), [a, pos]
    return build


def _get_rows_build(ctx):
    a, rows = _new(ctx, 5, 4), ggml.new_tensor_1d(ctx, T.I32, 6)
    return ggml.get_rows(ctx, a, rows), [a, rows]


def _cpy_build(ctx):
    a, b = _new(ctx, 6, 4), _new(ctx, 6, 4)
    return ggml.cpy(ctx, a, b), [a, b]


def _cross_entropy_build(ctx):
    a, b = _new(ctx, 7, 3), _new(ctx, 7, 3)
    return ggml.cross_entropy_loss(ctx, a, b), [a, b]


def _mask_build(op):
    def build(ctx):
        a = _new(ctx, 5, 5, 2)
        return op(ctx, a, 1), [a]
    return build


GRAD_CASES = [
    _g("add", "same shape", _two(ggml.add)),
    _g("add", "broadcast b", _two(ggml.add, ne_b=(5, 1, 2, 1))),
    # ggml gives b the mean of the gradient (its TODO: "should probably be sum"): a only
    _g("add1", "scalar b", _two(ggml.add1, ne_b=(1, 1, 1, 1)), params=[0]),
    _g("sub", "broadcast b", _two(ggml.sub)),
    _g("mul", "broadcast b", _two(ggml.mul, ne_b=(5, 3, 1, 1))),
    _g("div", "positive", _two(ggml.div), init=POSITIVE),
    _g("sqr", "", _one(ggml.sqr)),
    _g("sqrt", "positive", _one(ggml.sqrt), init=POSITIVE),
    _g("log", "positive", _one(ggml.log), init=POSITIVE),
    _g("sin", "", _one(ggml.sin)),
    _g("cos", "", _one(ggml.cos)),
    _g("sum", "", _one(ggml.sum)),
    _g("sum_rows", "", _one(ggml.sum_rows)),
    _g("mean", "", _one(ggml.mean)),
    _g("repeat", "2x2", _two(lambda ctx, a, b: ggml.repeat(ctx, a, b), ne_a=(5, 3, 1, 1), ne_b=(10, 6, 2, 1)),
       params=[0]),
    _g("repeat_back", "", _two(lambda ctx, a, b: ggml.repeat_back(ctx, a, b), ne_a=(10, 6, 2, 1),
                                ne_b=(5, 3, 1, 1)), params=[0]),
    _g("rms_norm", "", _one(lambda ctx, a: ggml.rms_norm(ctx, a, 1e-6))),
    _g("mul_mat", "", _two(ggml.mul_mat, ne_a=(6, 4, 2, 1), ne_b=(6, 3, 2, 1))),
    _g("mul_mat", "broadcast a over dim 2", _two(ggml.mul_mat, ne_a=(6, 4, 1, 1), ne_b=(6, 3, 2, 1))),
    _g("out_prod", "via mul_mat of a transposed b", _two(
        lambda ctx, a, b: ggml.mul_mat(ctx, a, ggml.cont(ctx, ggml.transpose(ctx, b))), ne_a=(4, 3), ne_b=(5, 4))),
    _g("scale", "", _one(lambda ctx, a: ggml.scale(ctx, a, 1.7))),
    _g("cpy", "", _cpy_build, params=[0]),
    _g("cont", "of a transpose", _one(lambda ctx, a: ggml.cont(ctx, ggml.transpose(ctx, a)))),
    _g("reshape", "", _one(lambda ctx, a: ggml.reshape_2d(ctx, a, 10, 3))),
    _g("permute", "", _one(lambda ctx, a: ggml.cont(ctx, ggml.permute(ctx, a, 2, 0, 1, 3)))),
    _g("transpose", "", _one(lambda ctx, a: ggml.cont(ctx, ggml.transpose(ctx, a)))),
    _g("get_rows", "", _get_rows_build, init={1: lambda t, g: torch.tensor([0, 2, 2, 3, 1, 0])}),
    _g("diag_mask_inf", "then soft_max", _weighted(lambda ctx, a: ggml.soft_max(ctx, ggml.diag_mask_inf(ctx, a, 1)),
                                                   (5, 5, 2, 1)), params=[0]),
    _g("diag_mask_zero", "", _mask_build(ggml.diag_mask_zero)),
    _g("soft_max", "", _weighted(ggml.soft_max), params=[0]),
    _g("soft_max", "scale", _weighted(lambda ctx, a: ggml.soft_max_ext(ctx, a, None, 0.5, 0.0)), params=[0]),
    _g("rope", "normal", _rope_build(R.NORMAL), init={1: lambda t, g: torch.tensor([0, 3, 9])}),
    _g("rope", "neox", _rope_build(R.NEOX), init={1: lambda t, g: torch.tensor([1, 4, 20])}),
    _g("rope", "mrope", _rope_build(R.MROPE, [1, 1, 2, 0]), init={1: lambda t, g: torch.arange(12) * 3}),
    _g("abs", "", _one(ggml.abs), init=AWAY_FROM_ZERO, eps=1e-2),
    _g("neg", "", _one(ggml.neg)),
    _g("relu", "", _one(ggml.relu), init=AWAY_FROM_ZERO, eps=1e-2),
    _g("silu", "", _one(ggml.silu)),
    _g("exp", "", _one(ggml.exp)),
    _g("expm1", "", _one(ggml.expm1)),
    _g("softplus", "", _one(ggml.softplus)),
    _g("sgn", "piecewise constant: no gradient", _one(ggml.sgn), init=AWAY_FROM_ZERO, eps=1e-2),
    _g("step", "piecewise constant: no gradient", _one(ggml.step), init=AWAY_FROM_ZERO, eps=1e-2),
    _g("cross_entropy_loss", "", _cross_entropy_build, params=[0],
       init={1: lambda t, g: torch.softmax(torch.randn(3, 7, generator=g), -1)}),
    _g("swiglu", "split", _two(ggml.swiglu_split)),
    _g("dup", "", _one(ggml.dup)),
]


@pytest.mark.parametrize("case,params,eps,max_err", GRAD_CASES)
def test_gradient_matches_finite_differences(cpu, case, params, eps, max_err):
    ok, err = check_grad(case, cpu, params=params, eps=eps, max_err=max_err)
    assert ok, f"{case.name}: mean absolute asymmetry {err:.3g} > {max_err:g}"


# ---------------------------------------------------------------- bad input and refusals

def test_builders_refuse_bad_shapes_naming_op_and_tensor():
    ctx = ggml.init(no_alloc=True)
    a, b = _new(ctx, 4, 3), _new(ctx, 5, 3)
    with pytest.raises(ValueError, match=r"silu_back: .*\[4, 3, 1, 1\].*\[5, 3, 1, 1\]"):
        ggml.silu_back(ctx, a, b)
    with pytest.raises(ValueError, match="cross_entropy_loss: logits"):
        ggml.cross_entropy_loss(ctx, a, b)
    with pytest.raises(ValueError, match="repeat_back"):
        ggml.repeat_back(ctx, a, b)
    with pytest.raises(ValueError, match="opt_step_sgd: a must be a parameter"):
        ggml.opt_step_sgd(ctx, a, a, ggml.new_tensor_1d(ctx, T.F32, 2))
    ggml.set_param(a)
    with pytest.raises(ValueError, match="opt_step_adamw: adamw_params must be F32 with 7 values"):
        ggml.opt_step_adamw(ctx, a, a, a, a, ggml.new_tensor_1d(ctx, T.F32, 6))
    with pytest.raises(ValueError, match="set_loss: the loss must be an F32 scalar"):
        ggml.set_loss(b)
    with pytest.raises(NotImplementedError, match="flash_attn_back"):
        ggml.flash_attn_back(ctx, a, a, a, a, False)


def test_backward_needs_grads_params_and_loss():
    ctx = ggml.init(no_alloc=True)
    a = _new(ctx, 4)
    loss = ggml.sum(ctx, ggml.sqr(ctx, a))
    plain = ggml.new_graph_custom(ctx, 64)
    ggml.build_forward_expand(plain, loss)
    with pytest.raises(ValueError, match="grads=True"):
        ggml.build_backward_expand(ctx, plain)
    graph = ggml.new_graph_custom(ctx, 64, grads=True)
    ggml.build_forward_expand(graph, loss)
    with pytest.raises(ValueError, match="no trainable parameters"):
        ggml.build_backward_expand(ctx, graph)
    ggml.set_param(a)
    graph = ggml.new_graph_custom(ctx, 64, grads=True)
    ggml.build_forward_expand(graph, loss)
    with pytest.raises(ValueError, match="no training loss"):
        ggml.build_backward_expand(ctx, graph)
    assert ggml.graph_get_grad(plain, a) is None


# ---------------------------------------------------------------- the rules that use the vision/region ops

def _view_build(ctx):
    a = _new(ctx, 6, 4, 2)
    v = ggml.view_2d(ctx, a, 3, 4, a.nb[1], 2 * 4)  # columns 2..4 of every row of the first matrix
    return ggml.sqr(ctx, v), [a]


def _acc_build(ctx):
    a, b = _new(ctx, 6, 4, 2), _new(ctx, 3, 2, 2)
    return ggml.acc(ctx, a, b, a.nb[1], a.nb[2], a.nb[3], a.nb[1] + 4), [a, b]


def _set_build(ctx):
    a, b = _new(ctx, 6, 4, 2), _new(ctx, 3, 2, 2)
    return ggml.set(ctx, a, b, a.nb[1], a.nb[2], a.nb[3], 4), [a, b]


def _im2col_build(ctx):
    kernel = ggml.new_tensor_4d(ctx, T.F32, 3, 2, 2, 1)
    image = _new(ctx, 5, 4, 2, 1)
    return ggml.im2col(ctx, kernel, image, 1, 1, 1, 0, 1, 1, True, T.F32), [kernel, image]


def _pool_build(op):
    def build(ctx):
        a = _new(ctx, 6, 5, 2, 1)
        return ggml.pool_2d(ctx, a, op, 2, 2, 2, 1, 0, 0), [a]
    return build


VISION_GRAD_CASES = [
    _g("view", "columns of rows", _view_build),
    _g("acc", "", _acc_build),
    _g("set", "", _set_build),
    _g("im2col", "2D", _im2col_build, params=[1]),
    _g("pool_2d", "avg", _pool_build(ggml.OpPool.AVG)),
    _g("pool_2d", "max", _pool_build(ggml.OpPool.MAX), init={0: lambda t, g: torch.randperm(60, generator=g).double()
                                                              .reshape(1, 2, 5, 6) / 10}, eps=1e-2),
]


@pytest.mark.parametrize("case,params,eps,max_err", VISION_GRAD_CASES)
def test_gradient_of_view_region_and_vision_ops_matches_finite_differences(cpu, case, params, eps, max_err):
    ok, err = check_grad(case, cpu, params=params, eps=eps, max_err=max_err)
    assert ok, f"{case.name}: mean absolute asymmetry {err:.3g} > {max_err:g}"


def test_every_training_op_has_a_builder_and_a_kernel():
    """Upstream's training ops (FLASH_ATTN_BACK aside: ggml aborts in its builder)."""
    from torchggml.devices.kernels.reference import TORCH_KERNELS
    ops = {"REPEAT_BACK": "repeat_back", "SILU_BACK": "silu_back", "RMS_NORM_BACK": "rms_norm_back",
           "GET_ROWS_BACK": "get_rows_back", "SOFT_MAX_BACK": "soft_max_ext_back", "ROPE_BACK": "rope_ext_back",
           "CROSS_ENTROPY_LOSS": "cross_entropy_loss", "CROSS_ENTROPY_LOSS_BACK": "cross_entropy_loss_back",
           "OPT_STEP_ADAMW": "opt_step_adamw", "OPT_STEP_SGD": "opt_step_sgd"}
    for op, builder in ops.items():
        assert callable(getattr(ggml, builder)), builder
        assert ggml.Op[op] in TORCH_KERNELS.entries, op
    assert callable(ggml.rope_multi_back) and callable(ggml.soft_max_ext_back_inplace)
