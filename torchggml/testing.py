"""test-backend-ops for torchggml: a table of op cases, each run on a backend and compared.

A case builds one op from inputs in a no_alloc context. `run_case` allocates it on a backend,
fills the inputs with seeded random values in [-1, 1] (or the case's own init), computes, and
returns the inputs (as stored, i.e. after rounding to their type) and the output. Tests compare
the CPU output with the case's float64 reference; `torchggml test-ops` compares another device
with the CPU. The cases are the table in ops_cases/.
"""
from __future__ import annotations

import zlib
from contextlib import contextmanager

import torch

from . import ops_cases
from .ops_cases.table import OpCase
from .types import Type, type_traits

def all_cases() -> list[OpCase]:
    """Every case of the op table (ops_cases/)."""
    return ops_cases.all_cases()


# ---------------------------------------------------------------- running

def seed_of(name: str) -> int:
    return zlib.crc32(name.encode())


def random_values(t, gen: torch.Generator) -> torch.Tensor:
    """Uniform [-1, 1] floats for t's logical shape (what a float or block input is filled from)."""
    shape = tuple(reversed(t.ne))
    return torch.rand(shape, generator=gen, dtype=torch.float32) * 2 - 1


def fill_input(t, values: torch.Tensor) -> None:
    """Store float/int values into t (converting to its type; quantizing block types). For block
    types, uint8 values are taken as ready-made blocks (for types quantize does not produce)."""
    from .backend.tensor_io import backend_tensor_set
    tr = type_traits(t.type)
    if tr.is_quantized and values.dtype == torch.uint8:
        data = values.contiguous()
    elif tr.is_quantized:
        from .quants import quantize
        data = quantize(t.type, values.float().reshape(-1, t.ne[0]))
    else:
        data = values.to(tr.dtype).contiguous()
    backend_tensor_set(t, data)


def read_values(t) -> torch.Tensor:
    """t's stored values as float64 (int64 for integer types), 4-D torch order, on the CPU."""
    from .backend.tensor_io import backend_tensor_get
    tr = type_traits(t.type)
    if 0 in t.ne:  # an empty result (ggml allows them): nothing to read
        return torch.zeros(tuple(reversed(t.ne)), dtype=torch.float64)
    raw = backend_tensor_get(t).reshape(t.ne[3], t.ne[2], t.ne[1], -1)
    if tr.is_quantized:
        from .quants import dequantize
        return dequantize(t.type, raw).double()
    if t.type in (Type.I8, Type.I16, Type.I32, Type.I64):
        return raw.long()
    return raw.double()


@contextmanager
def prepared_case(c: OpCase, backend):
    """The case built, allocated on `backend` and filled with its seeded inputs: yields
    (graph, inputs, output); memory is freed on exit."""
    from .context import init, free
    from .graph import new_graph_custom, build_forward_expand
    from .tensor import set_output, set_input
    from .alloc import backend_alloc_ctx_tensors
    from .backend.buffer import backend_buffer_free

    ctx = init(no_alloc=True)
    buffer = None
    try:
        out, inputs = c.build(ctx)
        for t in inputs:
            set_input(t)
        set_output(out)
        graph = new_graph_custom(ctx, 4096)
        build_forward_expand(graph, out)
        buffer = backend_alloc_ctx_tensors(ctx, backend)
        gen = torch.Generator().manual_seed(seed_of(c.name))
        for i, t in enumerate(inputs):
            make = c.init.get(i)
            fill_input(t, make(t, gen) if make else random_values(t, gen))
        yield graph, inputs, out
    finally:
        if buffer is not None:
            backend_buffer_free(buffer)
        free(ctx)


def run_case(c: OpCase, backend) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Build, allocate, fill, compute on `backend`; return (input values, output values)."""
    from .backend.backend import backend_graph_compute
    with prepared_case(c, backend) as (graph, inputs, out):
        # read the inputs before computing: in-place ops (set_rows, cpy) overwrite them
        values = [read_values(t) for t in inputs]
        backend_graph_compute(backend, graph)
        return values, read_values(out)


def case_work(graph) -> tuple[int, int]:
    """(bytes moved, flops) of one compute, as test-backend-ops counts them: every node's
    sources and output once; 2*M*N*K for products (attention: both products)."""
    from .enums import Op
    from .tensor import nbytes, nelements
    moved = flops = 0
    for node in graph.nodes:
        moved += nbytes(node) + sum(nbytes(s) for s in node.src if s is not None)
        if node.op in (Op.MUL_MAT, Op.MUL_MAT_ID, Op.OUT_PROD):
            flops += 2 * nelements(node) * node.src[0].ne[0]
        elif node.op == Op.FLASH_ATTN_EXT:
            q, k, v = node.src[0], node.src[1], node.src[2]
            flops += 2 * q.ne[1] * q.ne[2] * q.ne[3] * k.ne[1] * (q.ne[0] + v.ne[0])
    return moved, flops


def time_case(c: OpCase, backend, min_seconds: float = 0.2, min_runs: int = 3) -> tuple[float, int, int]:
    """(seconds per compute, bytes moved, flops): the graph is planned once and computed
    repeatedly (backend_graph_plan_compute), timing only the computes."""
    import time
    from .backend.backend import (backend_graph_plan_create, backend_graph_plan_compute,
                                  backend_graph_plan_free, backend_synchronize)
    with prepared_case(c, backend) as (graph, inputs, out):
        plan = backend_graph_plan_create(backend, graph)
        try:
            backend_graph_plan_compute(backend, plan)  # warm-up (lazy init, compilation)
            backend_synchronize(backend)
            runs, t0 = 0, time.perf_counter()
            while runs < min_runs or time.perf_counter() - t0 < min_seconds:
                backend_graph_plan_compute(backend, plan)
                runs += 1
            backend_synchronize(backend)
            elapsed = (time.perf_counter() - t0) / runs
        finally:
            backend_graph_plan_free(backend, plan)
        return (elapsed, *case_work(graph))


def nmse(result: torch.Tensor, expected: torch.Tensor) -> float:
    """sum((result - expected)^2) / sum(expected^2), as test-backend-ops computes it."""
    result = result.double()
    expected = expected.double().expand_as(result)
    den = (expected * expected).sum().item()
    num = ((result - expected) ** 2).sum().item()
    if den == 0:
        return 0.0 if num == 0 else float("inf")
    return num / den


def compare(c: OpCase, result: torch.Tensor, expected: torch.Tensor) -> tuple[bool, float]:
    """(ok, error): exact equality for max_nmse == 0, else normalized MSE within the threshold.
    NaN/inf positions must agree."""
    expected = expected.to(result.dtype if result.dtype == torch.int64 else torch.float64).expand_as(result)
    if c.max_nmse == 0:
        ok = torch.equal(result.to(expected.dtype), expected) or (
            result.is_floating_point() and torch.allclose(result.double(), expected.double(), rtol=0, atol=0, equal_nan=True))
        return ok, 0.0 if ok else float("inf")
    r, e = result.double(), expected.double()
    finite = torch.isfinite(e)
    if not torch.equal(finite, torch.isfinite(r)) or not torch.equal(r[~finite].nan_to_num(), e[~finite].nan_to_num()):
        return False, float("inf")
    err = nmse(r[finite], e[finite])
    return err <= c.max_nmse, err


def check_case_against_reference(c: OpCase, backend) -> tuple[bool, float]:
    inputs, out = run_case(c, backend)
    expected = c.reference(*inputs)
    return compare(c, out, expected)


# ---------------------------------------------------------------- the test-ops command

def main_test_ops(args, cases: list[OpCase] | None = None) -> int:
    """`torchggml test-ops [-b DEVICE] [-o OP] [--mode test|perf|support]` over `cases` (default:
    the core table, -o filtered); test_ops.main selects cases and runs the other modes."""
    from .backend import registry

    if cases is None:
        cases = [c for c in all_cases() if not args.op or c.op.lower() == args.op.lower()]
    cpu = registry.backend_init_by_name("CPU")
    devices = [args.backend] if args.backend else [registry.backend_dev_name(registry.backend_dev_get(i))
                                                   for i in range(registry.backend_dev_count())]
    n_fail = 0
    for dev_name in devices:
        backend = registry.backend_init_by_name(dev_name)
        n_ok = n_skip = n_bad = 0
        print(f"Testing {dev_name} ({args.mode}), {len(cases)} cases")
        for c in cases:
            supported = _supported(c, backend)
            if args.mode == "support":
                print(f"  {c.name}: {'yes' if supported else 'no'}")
                continue
            if not supported:
                n_skip += 1
                print(f"  {c.name}: not supported [{dev_name}]")
                continue
            if args.mode == "perf":
                seconds, moved, flops = time_case(c, backend)
                rate = f"{flops / seconds / 1e9:9.2f} GFLOP/s" if flops else f"{moved / seconds / 1e9:9.2f} GB/s"
                print(f"  {c.name}: {seconds * 1e6:10.1f} us/run {rate}")
                continue
            _, ours = run_case(c, backend)
            if dev_name.upper() == "CPU" and c.reference is not None:
                inputs, _ = run_case(c, backend)
                ok, err = compare(c, ours, c.reference(*inputs))
            else:
                _, ref = run_case(c, cpu)
                ok, err = compare(c, ours, ref)
            n_ok += ok
            n_bad += not ok
            print(f"  {c.name}: {'OK' if ok else 'FAIL'} (nmse {err:.3g}, max {c.max_nmse:g})")
        if args.mode == "test":
            print(f"  {dev_name}: {n_ok}/{n_ok + n_bad} passed, {n_skip} not supported")
        n_fail += n_bad
    return 1 if n_fail else 0


def _supported(c: OpCase, backend) -> bool:
    from .context import init, free
    from .graph import new_graph_custom, build_forward_expand
    ctx = init(no_alloc=True)
    try:
        out, _ = c.build(ctx)
        graph = new_graph_custom(ctx, 4096)
        build_forward_expand(graph, out)
        return all(backend.supports_op(n) for n in graph.nodes)
    finally:
        free(ctx)


# ---------------------------------------------------------------- grad mode (ggml's backward vs finite differences)

GRAD_EPS = 1e-1       # upstream's default step; the 4-point formula cancels the cubic term
GRAD_MAX_ERR = 1e-3   # mean absolute asymmetry: upstream's 1e-4 default, 1e-3 for its non-linear ops
GRAD_MAX_VALUES = 10000  # parameters' total elements above which a case is skipped (upstream's grad_nmax)


class GradSkip(Exception):
    """The case has no gradient check here: the reason says why (as upstream's 'not supported')."""


GRAD_ZERO = 1e-4      # gradients both below this agree (a constant loss: finite differences give noise)


def mean_abs_asymmetry(a: torch.Tensor, b: torch.Tensor, zero: float = GRAD_ZERO) -> float:
    """mean(|a - b| / (|a| + |b|)) over the elements: upstream's grad error; elements where both
    are below `zero` (the finite differences' noise floor) count as agreeing."""
    a, b = a.double().reshape(-1), b.double().reshape(-1)
    both_zero = (a.abs() < zero) & (b.abs() < zero)
    terms = torch.where(both_zero, torch.zeros_like(a), (a - b).abs() / (a.abs() + b.abs()).clamp_min(1e-300))
    return terms.mean().item() if terms.numel() else 0.0


class _NoGradient(GradSkip):
    """build_backward_expand refused the chosen parameters."""


def check_grad(c: OpCase, backend, params=None, eps: float = GRAD_EPS,
               max_err: float = GRAD_MAX_ERR) -> tuple[bool, float]:
    """_check_grad over every F32 input; where ggml has no gradient for one of them (a mask, sinks,
    labels), over the first input alone, as upstream's cases mark only it."""
    try:
        return _check_grad(c, backend, params, eps, max_err)
    except _NoGradient:
        if params is not None:
            raise
        return _check_grad(c, backend, [0], eps, max_err)


def _check_grad(c: OpCase, backend, params, eps: float, max_err: float) -> tuple[bool, float]:
    """Upstream's grad mode: the case's F32 inputs (or those at the indices `params`) become
    parameters, the loss is sum(output); ggml's backward graph (build_backward_expand) gives the
    gradients, compared with central differences of the forward graph (4 evaluations per
    element). Raises GradSkip where the case cannot be checked (types, no gradient, too large)."""
    from .context import init, free
    from .graph import new_graph_custom, build_forward_expand, graph_cpy
    from .backward import build_backward_expand, graph_get_grad, graph_reset
    from .tensor import set_param, set_loss, is_scalar, nelements
    from .ops import sum as ggml_sum
    from .alloc import backend_alloc_ctx_tensors
    from .backend.buffer import backend_buffer_free
    from .backend.backend import backend_graph_compute
    from .backend.tensor_io import backend_tensor_set

    ctx = init(no_alloc=True)
    buffer = None
    try:
        out, inputs = c.build(ctx)
        chosen = [t for i, t in enumerate(inputs) if (params is None or i in params) and t.type == Type.F32
                  and t.view_src is None]
        if out.type != Type.F32:
            raise GradSkip(f"output type {out.type.name} != F32")
        if not chosen:
            raise GradSkip("no F32 inputs")
        if sum(nelements(t) for t in chosen) > GRAD_MAX_VALUES:
            raise GradSkip("too many values for finite differences")
        for t in chosen:
            set_param(t)
        loss = out if is_scalar(out) else ggml_sum(ctx, out)
        set_loss(loss)
        forward = new_graph_custom(ctx, 4096, grads=True)
        build_forward_expand(forward, loss)
        backward = new_graph_custom(ctx, 8192, grads=True)
        graph_cpy(forward, backward)
        try:
            build_backward_expand(ctx, backward)
        except (NotImplementedError, ValueError) as e:  # no rule in ggml, or in place (ggml asserts)
            raise _NoGradient(str(e)) from None
        grads = [graph_get_grad(backward, t) for t in chosen]
        for g in grads:
            if g is not None:
                build_forward_expand(backward, g)
        unsupported = [n for n in backward.nodes if not backend.supports_op(n)]
        if unsupported:
            raise GradSkip(f"{unsupported[0].op.name} not supported")
        buffer = backend_alloc_ctx_tensors(ctx, backend)
        gen = torch.Generator().manual_seed(seed_of(c.name))
        for i, t in enumerate(inputs):
            make = c.init.get(i)
            fill_input(t, make(t, gen) if make else random_values(t, gen))
        graph_reset(backward)
        backend_graph_compute(backend, backward)
        analytic = [read_values(g) if g is not None else torch.zeros(tuple(reversed(t.ne)), dtype=torch.float64)
                    for t, g in zip(chosen, grads)]

        def loss_at(t, flat, i, value):
            flat[i] = value
            backend_tensor_set(t, flat)
            backend_graph_compute(backend, forward)
            return read_values(loss).reshape(-1)[0].item()

        # the finite differences' noise floor: float32 rounding of the loss over the step
        zero = max(GRAD_ZERO, 16 * abs(read_values(loss).reshape(-1)[0].item()) * 2.0 ** -23 / eps)
        worst = 0.0
        for t, ga in zip(chosen, analytic):
            x0 = read_values(t).reshape(-1).float()
            numeric = torch.empty(x0.numel(), dtype=torch.float64)
            for i in range(x0.numel()):
                flat = x0.clone()
                fu, fuh, fdh, fd = (loss_at(t, flat, i, x0[i].item() + k * eps) for k in (1.0, 0.5, -0.5, -1.0))
                numeric[i] = (8.0 * (fuh - fdh) + (fd - fu)) / (6.0 * eps)
            backend_tensor_set(t, x0)
            if not torch.isfinite(ga).all():
                return False, float("inf")
            worst = max(worst, mean_abs_asymmetry(ga.reshape(-1), numeric, zero))
        return worst <= max_err, worst
    finally:
        if buffer is not None:
            backend_buffer_free(buffer)
        free(ctx)
