"""test-backend-ops for torchggml: a table of op cases, each run on a backend and compared.

A case builds one op from inputs in a no_alloc context. `run_case` allocates it on a backend,
fills the inputs with seeded random values in [-1, 1] (or the case's own init), computes, and
returns the inputs (as stored, i.e. after rounding to their type) and the output. Tests compare
the CPU output with the case's float64 reference; `torchggml test-ops` compares another device
with the CPU. The cases are the table in test_ops/cases/.
"""
from __future__ import annotations

import zlib
from contextlib import contextmanager

import torch

from . import cases as ops_cases
from .cases.table import OpCase
from ..types import Type, type_traits

def all_cases() -> list[OpCase]:
    """Every case of the op table (test_ops/cases/)."""
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
    from ..backend.tensor_io import backend_tensor_set
    tr = type_traits(t.type)
    if tr.is_quantized and values.dtype == torch.uint8:
        data = values.contiguous()
    elif tr.is_quantized:
        from ..quants import quantize
        data = quantize(t.type, values.float().reshape(-1, t.ne[0]))
    else:
        data = values.to(tr.dtype).contiguous()
    backend_tensor_set(t, data)


def read_values(t) -> torch.Tensor:
    """t's stored values as float64 (int64 for integer types), 4-D torch order, on the CPU."""
    from ..backend.tensor_io import backend_tensor_get
    tr = type_traits(t.type)
    if 0 in t.ne:  # an empty result (ggml allows them): nothing to read
        return torch.zeros(tuple(reversed(t.ne)), dtype=torch.float64)
    raw = backend_tensor_get(t).reshape(t.ne[3], t.ne[2], t.ne[1], -1)
    if tr.is_quantized:
        from ..quants import dequantize
        return dequantize(t.type, raw).double()
    if t.type in (Type.I8, Type.I16, Type.I32, Type.I64):
        return raw.long()
    return raw.double()


@contextmanager
def prepared_case(c: OpCase, backend):
    """The case built, allocated on `backend` and filled with its seeded inputs: yields
    (graph, inputs, output); memory is freed on exit."""
    from ..context import init, free
    from ..graph import new_graph_custom, build_forward_expand
    from ..tensor import set_output, set_input
    from ..alloc import backend_alloc_ctx_tensors
    from ..backend.buffer import backend_buffer_free

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
    from ..backend.backend import backend_graph_compute
    with prepared_case(c, backend) as (graph, inputs, out):
        # read the inputs before computing: in-place ops (set_rows, cpy) overwrite them
        values = [read_values(t) for t in inputs]
        backend_graph_compute(backend, graph)
        return values, read_values(out)


def case_work(graph) -> tuple[int, int]:
    """(bytes moved, flops) of one compute, as test-backend-ops counts them: every node's
    sources and output once; 2*M*N*K for products (attention: both products)."""
    from ..enums import Op
    from ..tensor import nbytes, nelements
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
    repeatedly (backend_graph_plan_compute), timing only the computes: with CUDA events on a
    CUDA backend's stream, wall time (after synchronizing) elsewhere."""
    import time
    from ..backend.backend import (backend_graph_plan_create, backend_graph_plan_compute,
                                  backend_graph_plan_free, backend_synchronize)
    with prepared_case(c, backend) as (graph, inputs, out):
        plan = backend_graph_plan_create(backend, graph)
        try:
            backend_graph_plan_compute(backend, plan)  # warm-up (lazy init, compilation)
            backend_synchronize(backend)
            # the number of runs from one synchronized run: an async backend would otherwise
            # queue runs far faster than it computes them
            t0 = time.perf_counter()
            backend_graph_plan_compute(backend, plan)
            backend_synchronize(backend)
            once = max(time.perf_counter() - t0, 1e-6)
            runs = max(min_runs, min(int(min_seconds / once), 100_000))
            timer = DeviceTimer.of(backend)
            timer.start()
            for _ in range(runs):
                backend_graph_plan_compute(backend, plan)
            elapsed = timer.stop(lambda: backend_synchronize(backend)) / runs
        finally:
            backend_graph_plan_free(backend, plan)
        return (elapsed, *case_work(graph))


class DeviceTimer:
    """Seconds between start() and stop(): CUDA events recorded on a CUDA stream (what the
    device spent, host overhead hidden when the device is the bottleneck), else wall time
    after `sync`."""

    def __init__(self, stream=None):
        self.stream = stream
        self.t0 = self.events = None

    @classmethod
    def of(cls, backend) -> "DeviceTimer":
        stream = getattr(getattr(backend, "stream", None), "stream", None)
        return cls(stream if torch.cuda.is_available() and isinstance(stream, torch.cuda.Stream) else None)

    def start(self) -> None:
        import time
        if self.stream is not None:
            self.events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self.events[0].record(self.stream)
        self.t0 = time.perf_counter()

    def stop(self, sync) -> float:
        import time
        if self.stream is None:
            sync()
            return time.perf_counter() - self.t0
        self.events[1].record(self.stream)
        self.events[1].synchronize()
        return self.events[0].elapsed_time(self.events[1]) / 1e3


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
    from ..backend import registry

    if cases is None:
        cases = [c for c in all_cases() if not args.op or c.op.lower() == args.op.lower()]
    cpu = registry.backend_init_by_name("CPU")
    devices = [args.backend] if args.backend else [registry.backend_dev_get(i).get_name()
                                                   for i in range(registry.backend_dev_count())]
    if args.mode == "perf":
        return main_perf(args, cases, devices)
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
            ok, err, line = judge_case(c, backend, cpu)
            n_ok += ok
            n_bad += not ok
            print(f"  {line}")
        if args.mode == "test":
            print(f"  {dev_name}: {n_ok}/{n_ok + n_bad} passed, {n_skip} not supported")
        n_fail += n_bad
    return 1 if n_fail else 0


def _supported(c: OpCase, backend) -> bool:
    from ..context import init, free
    from ..graph import new_graph_custom, build_forward_expand
    ctx = init(no_alloc=True)
    try:
        out, _ = c.build(ctx)
        graph = new_graph_custom(ctx, 4096)
        build_forward_expand(graph, out)
        return all(backend.supports_op(n) for n in graph.nodes)
    finally:
        free(ctx)


# ---------------------------------------------------------------- for kernel developers: judging, timing, the roofline

def judge_case(c: OpCase, backend, cpu) -> tuple[bool, float, str]:
    """(ok, error, line): the case on `backend` against its float64 reference on the CPU
    device, else against the CPU device's output. A failing line names the case, the error,
    the threshold and the largest absolute difference; a kernel that raises fails the case."""
    try:
        inputs, ours = run_case(c, backend)
    except Exception as e:  # noqa: BLE001 - a kernel under test may fail any way: report, go on
        return False, float("inf"), f"{c.name}: FAIL (raised {type(e).__name__}: {e})"
    if backend.get_device().get_name().upper() == "CPU" and c.reference is not None:
        expected = c.reference(*inputs)
    else:
        _, expected = run_case(c, cpu)
    ok, err = compare(c, ours, expected)
    if ok:
        return True, err, f"{c.name}: OK (nmse {err:.3g}, max {c.max_nmse:g})"
    return False, err, failure_message(c, err, ours, expected)


def failure_message(c: OpCase, err: float, result: torch.Tensor, expected: torch.Tensor) -> str:
    """"CASE: FAIL (nmse E > threshold T, max abs error D at ggml index [i0, i1, i2, i3] (got
    g, expected e))": what a kernel developer needs to find the wrong element."""
    diff = (result.double() - expected.double().expand_as(result)).abs()
    where = ""
    if diff.numel():
        flat = diff.nan_to_num(nan=float("inf")).argmax().item()
        index = tuple(reversed(torch.unravel_index(torch.tensor(flat), diff.shape)))
        where = (f", max abs error {diff.reshape(-1)[flat].item():.4g} at ggml index {[int(i) for i in index]} "
                 f"(got {result.reshape(-1)[flat].item():.6g}, expected "
                 f"{expected.expand_as(result).reshape(-1)[flat].item():.6g})")
    measure = "exact match required" if c.max_nmse == 0 else f"nmse {err:.4g} > threshold {c.max_nmse:g}"
    return f"{c.name}: FAIL ({measure}{where})"


def triton_interpreting() -> bool:
    """Triton kernels run in its CPU interpreter (TRITON_INTERPRET=1): timings mean nothing."""
    import os
    return os.environ.get("TRITON_INTERPRET") == "1"


def registered_for_case(c: OpCase, backend) -> list[str]:
    """Names of the registered kernels (register_kernel) that compute a node of the case on
    `backend`'s device type."""
    from ..context import init, free
    from ..graph import new_graph_custom, build_forward_expand
    from ..devices.kernels.registered import device_type_name, registered_entry
    device_type = device_type_name(backend.get_device())
    ctx = init(no_alloc=True)
    try:
        out, _ = c.build(ctx)
        graph = new_graph_custom(ctx, 4096)
        build_forward_expand(graph, out)
        names = (getattr(registered_entry(n, device_type), "name", None) for n in graph.nodes)
        return sorted({n for n in names if n})
    finally:
        free(ctx)


def rates(seconds: float, moved: int, flops: int) -> str:
    gflops = f"{flops / seconds / 1e9:9.3g} GFLOP/s" if flops else f"{'-':>9} GFLOP/s"
    return f"{seconds * 1e6:10.1f} us/run {moved / seconds / 1e9:9.3g} GB/s {gflops}"


def main_perf(args, cases, devices) -> int:
    """`test-ops -m perf`: per device and case, check the result once, then time it and print
    us/run, GB/s and GFLOP/s; a case a registered kernel computes is timed with it and with
    the built-in kernels, side by side. Under Triton's interpreter only the checks run."""
    from ..backend import registry
    from ..devices.kernels.registered import builtin_kernels_only
    interpreting = triton_interpreting()
    if interpreting:
        print("TRITON_INTERPRET=1: Triton kernels run in Triton's CPU interpreter, so timings would be "
              "meaningless: checking correctness only (one run per case)", flush=True)
    min_seconds = getattr(args, "min_seconds", 0.2)
    cpu = registry.backend_init_by_name("CPU")
    n_fail, rows = 0, []
    for dev_name in devices:
        backend = registry.backend_init_by_name(dev_name)
        print(f"Testing {dev_name} (perf), {len(cases)} cases", flush=True)
        for c in cases:
            if not _supported(c, backend):
                print(f"  {c.name}: not supported [{dev_name}]", flush=True)
                continue
            names = registered_for_case(c, backend)
            tag = f" [registered: {', '.join(names)}]" if names else ""
            ok, _, line = judge_case(c, backend, cpu)
            if not ok or interpreting:
                n_fail += not ok
                print(f"  {line}{tag}", flush=True)
                continue
            ours = time_case(c, backend, min_seconds)
            if not names:
                print(f"  {c.name}: {rates(*ours)}", flush=True)
                rows.append((dev_name, c.name, "built-in", *ours))
                continue
            with builtin_kernels_only():
                base = time_case(c, backend, min_seconds) if _supported(c, backend) else None
            print(f"  {c.name}:\n    {', '.join(names):>12}: {rates(*ours)}", flush=True)
            rows.append((dev_name, c.name, "registered", *ours))
            if base is not None:
                print(f"    {'built-in':>12}: {rates(*base)}  (speed-up of the registered kernel: x{base[0] / ours[0]:.2f})", flush=True)
                rows.append((dev_name, c.name, "built-in", *base))
    if getattr(args, "roofline", None):
        if interpreting or not rows:
            print(f"no roofline: {'timings are meaningless under the interpreter' if interpreting else 'nothing timed'}")
        else:
            for dev_name in devices:
                roofs = measure_roofs(registry.backend_init_by_name(dev_name))
                path = plot_roofline([r for r in rows if r[0] == dev_name], roofs, args.roofline, dev_name,
                                     several=len(devices) > 1)
                print(f"roofline of {dev_name} ({roofs[0] / 1e9:.1f} GB/s copy, {roofs[1] / 1e9:.1f} GFLOP/s matmul): {path}")
    return 1 if n_fail else 0


def measure_roofs(backend, copy_mib: int = 64, matmul_n: int = 1024) -> tuple[float, float]:
    """(bytes/s, flop/s): the device's copy bandwidth (a buffer-sized tensor copy: read + write)
    and matmul peak (float32 on the CPU, float16 on accelerators), measured on its torch device."""
    device = getattr(backend.get_device(), "torch_device", torch.device("cpu"))
    timer = DeviceTimer.of(backend)

    def best(fn, runs=5) -> float:
        fn()
        times = []
        for _ in range(runs):
            timer.start()
            fn()
            times.append(timer.stop(lambda: torch.accelerator.synchronize() if device.type != "cpu" else None))
        return min(times)

    src = torch.empty(copy_mib * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_s = best(lambda: dst.copy_(src))
    dtype = torch.float32 if device.type == "cpu" else torch.float16
    a = torch.randn(matmul_n, matmul_n, dtype=dtype, device=device)
    mm_s = best(lambda: a @ a)
    return 2 * src.numel() / copy_s, 2 * matmul_n**3 / mm_s


def plot_roofline(rows, roofs, path: str, dev_name: str, several: bool = False) -> str:
    """A log-log roofline PNG: GFLOP/s against arithmetic intensity (flops per byte moved) of
    the timed cases with flops, under min(matmul peak, copy bandwidth * intensity); cases
    without flops (element-wise, copies) are drawn at their GB/s on the bandwidth line's
    scale on a second panel. Returns the file written (the device name is added before the
    suffix when several devices were timed)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("--roofline needs matplotlib: pip install 'torchggml[plot]'") from e
    from pathlib import Path
    out = Path(path)
    if several:
        out = out.with_name(f"{out.stem}_{dev_name}{out.suffix or '.png'}")
    bandwidth, peak = roofs
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5))
    flop_rows = [r for r in rows if r[5]]
    xs = [r[5] / r[4] for r in flop_rows] or [1.0]
    lo, hi = min(xs + [peak / bandwidth]) / 4, max(xs + [peak / bandwidth]) * 4
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(grid, [min(peak, bandwidth * x) / 1e9 for x in grid], "k-", label="roof: min(matmul peak, copy bw x intensity)")
    for kind, marker in (("registered", "o"), ("built-in", "x")):
        pts = [(r[5] / r[4], r[5] / r[3] / 1e9, r[1]) for r in flop_rows if r[2] == kind]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=f"{kind} kernel")
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (flop / byte)", ylabel="GFLOP/s",
           title=f"{dev_name}: cases with flops")
    ax.legend(fontsize=8)
    labels = [f"{r[1][:40]} ({r[2]})" for r in rows]
    bx.barh(range(len(rows)), [r[4] / r[3] / 1e9 for r in rows],
            color=["tab:blue" if r[2] == "registered" else "tab:orange" for r in rows])
    bx.axvline(bandwidth / 1e9, color="k", label=f"copy bandwidth {bandwidth / 1e9:.1f} GB/s")
    bx.set_yticks(range(len(rows)), labels, fontsize=6)
    bx.set(xlabel="GB/s", title="bytes moved per second, every timed case")
    bx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return str(out)


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
    from ..context import init, free
    from ..graph import new_graph_custom, build_forward_expand, graph_cpy
    from ..backward import build_backward_expand, graph_get_grad, graph_reset
    from ..tensor import set_param, set_loss, is_scalar, nelements
    from ..ops import sum as ggml_sum
    from ..alloc import backend_alloc_ctx_tensors
    from ..backend.buffer import backend_buffer_free
    from ..backend.backend import backend_graph_compute
    from ..backend.tensor_io import backend_tensor_set

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
