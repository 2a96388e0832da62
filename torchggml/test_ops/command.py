"""`torchggml test-ops` beyond running cases: which cases (the core table, upstream's breadth as
a sample or in full, -o / -p filters), --list-ops, --show-coverage against upstream's
test-backend-ops, grad mode (ggml's backward vs finite differences) and CSV output; the console
test / perf / support loop is testing.main_test_ops."""
from __future__ import annotations

import csv
import re
import sys
from collections import Counter

from .. import config
from .cases.table import OpCase

FULL_ENV = "TORCHGGML_TEST_OPS_FULL"


def full_requested(args) -> bool:
    return bool(getattr(args, "full", False)) or config.value(FULL_ENV)


def select_cases(args) -> list[OpCase]:
    """The core table plus upstream's breadth (a representative sample by default, all of it with
    --full or TORCHGGML_TEST_OPS_FULL=1), filtered by -o OP (the case's op or its upstream name)
    and -p REGEX (searched in the case's name)."""
    from . import cases as ops_cases
    from .cases.breadth import breadth_cases, sample_cases
    cases = list(ops_cases.all_cases())
    cases += list(breadth_cases()) if full_requested(args) else sample_cases()
    op = getattr(args, "op", None)
    if op:
        wanted = {o.strip().lower() for o in op.split(",") if o.strip()}
        names = {c.op for c in cases} | {upstream_op(c) for c in cases}
        unknown = sorted(wanted - {n.lower() for n in names})
        if unknown:
            raise SelectionError(f"unknown op {', '.join(map(repr, unknown))}; choose from "
                                 f"{', '.join(sorted(names, key=str.upper))}")
        cases = [c for c in cases if c.op.lower() in wanted or upstream_op(c).lower() in wanted]
    pattern = getattr(args, "params", None)
    if pattern:
        try:
            rx = re.compile(pattern)
        except re.error as e:
            raise SelectionError(f"-p {pattern!r} is not a regular expression: {e}") from None
        cases = [c for c in cases if rx.search(c.name)]
        if not cases:
            raise SelectionError(f"-p {pattern!r} matches no case{' of ' + op if op else ''} (--list-ops, "
                                 f"or -m support, shows the cases)")
    return cases


class SelectionError(ValueError):
    """An -o, -p or -b that selects nothing: one line, a non-zero exit."""


def check_device(args) -> None:
    """-b names a registered device, else SelectionError listing them."""
    from ..backend import registry
    name = getattr(args, "backend", None)
    if name and registry.backend_dev_by_name(name) is None:
        names = [registry.backend_dev_get(i).get_name() for i in range(registry.backend_dev_count())]
        raise SelectionError(f"no device {name!r} here; choose from {', '.join(names)} (`torchggml devices`)")


# ---------------------------------------------------------------- what a case tests, in upstream's words

def _build_graph(c: OpCase):
    from ..context import init, free
    from ..graph import new_graph_custom, build_forward_expand
    ctx = init(no_alloc=True)
    out, _ = c.build(ctx)
    graph = new_graph_custom(ctx, 8192)
    build_forward_expand(graph, out)
    return ctx, free, graph, out


def op_desc(t) -> str:
    """ggml_op_desc: the op's name, the unary or GLU op's for UNARY / GLU nodes."""
    from ..enums import Op
    from ..tensor import get_unary_op, get_glu_op
    if t.op == Op.UNARY:
        return get_unary_op(t).name
    if t.op == Op.GLU:
        return get_glu_op(t).name
    return t.op.name


def upstream_op(c: OpCase) -> str:
    """The upstream op name a case counts under: its own op's name when ggml has that op, the
    fusion's name (lower case) for graph cases."""
    from ..enums import Op, UnaryOp, GluOp
    name = c.op.upper()
    known = set(Op.__members__) | set(UnaryOp.__members__) | set(GluOp.__members__)
    aliases = {"CONV_2D_DIRECT": "CONV_2D", "CONV_3D_DIRECT": "CONV_3D", "SOFT_MAX_EXT_BACK": "SOFT_MAX_BACK"}
    name = aliases.get(name, name)
    return name if name in known else c.op


def is_graph_case(c: OpCase) -> bool:
    from .cases.breadth.fusion import FUSIONS
    return c.op in FUSIONS


def supported_on(c: OpCase, backend) -> bool:
    ctx, free, graph, _ = _build_graph(c)
    try:
        return all(backend.supports_op(n) for n in graph.nodes)
    finally:
        free(ctx)


# ---------------------------------------------------------------- reporting

class Report:
    """One line per case (console) or per row (CSV, upstream's columns)."""

    FIELDS = ("backend_name", "op_name", "op_params", "test_mode", "supported", "passed", "error", "message")

    def __init__(self, output: str = "console", stream=None):
        self.output = output
        self.stream = stream or sys.stdout
        self.writer = csv.writer(self.stream) if output == "csv" else None
        if self.writer:
            self.writer.writerow(self.FIELDS)

    def case(self, device: str, c: OpCase, mode: str, supported: bool, passed: bool | None, error: float | None,
             message: str) -> None:
        if self.writer:
            self.writer.writerow((device, upstream_op(c), c.desc, mode, int(supported),
                                  "" if passed is None else int(passed), "" if error is None else f"{error:.6g}",
                                  message))
        else:
            print(f"  {c.name}: {message}", file=self.stream)

    def line(self, text: str) -> None:
        if not self.writer:
            print(text, file=self.stream)


# ---------------------------------------------------------------- the command

def main(args) -> int:
    """`torchggml test-ops`: select the cases, run the mode asked for."""
    from .runner import main_test_ops
    try:
        check_device(args)
        cases = select_cases(args)
    except SelectionError as e:
        print(f"torchggml test-ops: error: {e}", file=sys.stderr)
        return 2
    handled = handle(args, cases)
    return handled if handled is not None else main_test_ops(args, cases) or 0


def handle(args, cases: list[OpCase]) -> int | None:
    """--list-ops, --show-coverage, grad mode and CSV output of test/support; None when the
    console test/support/perf loop of testing.main_test_ops should run."""
    if getattr(args, "list_ops", False):
        return list_ops(cases)
    if getattr(args, "show_coverage", False):
        return show_coverage(args, cases)
    if args.mode == "grad":
        return run_cases(args, cases, grad=True)
    if getattr(args, "output", "console") == "csv" and args.mode in ("test", "support"):
        return run_cases(args, cases, grad=False)
    return None


def list_ops(cases: list[OpCase]) -> int:
    counts = Counter(upstream_op(c) for c in cases)
    for name in sorted(counts):
        print(f"{name:28s} {counts[name]:6d}")
    print(f"{len(counts)} ops, {len(cases)} cases")
    return 0


def _devices(args) -> list[str]:
    from ..backend import registry
    from ..backend.device import backend_dev_name
    if getattr(args, "backend", None):
        return [args.backend]
    return [backend_dev_name(registry.backend_dev_get(i)) for i in range(registry.backend_dev_count())]


def run_cases(args, cases: list[OpCase], grad: bool) -> int:
    """test / support (CSV) and grad mode over the selected devices."""
    from ..backend import registry
    from .runner import check_grad, GradSkip, run_case, compare
    report = Report(getattr(args, "output", "console"))
    cpu = registry.backend_init_by_name("CPU")
    n_fail = 0
    mode = "grad" if grad else args.mode
    for dev in _devices(args):
        backend = registry.backend_init_by_name(dev)
        n_ok = n_bad = n_skip = 0
        report.line(f"Testing {dev} ({mode}), {len(cases)} cases")
        for c in cases:
            supported = supported_on(c, backend)
            if mode == "support":
                report.case(dev, c, mode, supported, None, None, "yes" if supported else "no")
                continue
            if not supported:
                n_skip += 1
                report.case(dev, c, mode, False, None, None, f"not supported [{dev}]")
                continue
            if grad:
                try:
                    ok, err = check_grad(c, backend)
                except GradSkip as e:
                    n_skip += 1
                    report.case(dev, c, mode, False, None, None, f"not supported [{e}]")
                    continue
                limit = "mean abs asymmetry"
            else:
                ok, err = _judge(c, backend, cpu, dev, run_case, compare)
                limit = "nmse"
            n_ok += ok
            n_bad += not ok
            report.case(dev, c, mode, True, ok, err, f"{'OK' if ok else 'FAIL'} ({limit} {err:.3g})")
        if mode != "support":
            report.line(f"  {dev}: {n_ok}/{n_ok + n_bad} passed, {n_skip} not supported")
        n_fail += n_bad
    return 1 if n_fail else 0


def _judge(c, backend, cpu, dev, run_case, compare) -> tuple[bool, float]:
    """The CPU against the case's float64 reference, other devices against the CPU."""
    inputs, ours = run_case(c, backend)
    if dev.upper() == "CPU" and c.reference is not None:
        return compare(c, ours, c.reference(*inputs))
    _, ref = run_case(c, cpu)
    return compare(c, ours, ref)


# ---------------------------------------------------------------- coverage against upstream

def show_coverage(args, cases: list[OpCase]) -> int:
    """Ops and cases per device against upstream test-backend-ops' single-op cases (its CPU's
    support in brackets), and the graph (fusion) cases."""
    from ..backend import registry
    from ..enums import GGML_COMMIT
    from .cases.upstream_counts import UPSTREAM_CASES
    devices = _devices(args)
    backends = {d: registry.backend_init_by_name(d) for d in devices}
    single = [c for c in cases if not is_graph_case(c)]
    graph = [c for c in cases if is_graph_case(c)]
    ours = Counter(upstream_op(c) for c in single)
    supported = {d: Counter() for d in devices}
    for c in single:
        for d, b in backends.items():
            if supported_on(c, b):
                supported[d][upstream_op(c)] += 1
    names = sorted(set(UPSTREAM_CASES) | set(ours))
    header = f"{'op':26s} {'upstream (CPU)':>16s} {'torchggml':>10s}" + "".join(f" {d:>10s}" for d in devices)
    table = "full table" if full_requested(args) else "sample (--full for all)"
    print(f"test-ops coverage against upstream test-backend-ops at ggml {GGML_COMMIT[:8]} ({table})")
    print(header)
    for name in names:
        up, up_cpu = UPSTREAM_CASES.get(name, (0, 0))
        print(f"{name:26s} {f'{up} ({up_cpu})':>16s} {ours[name]:>10d}" +
              "".join(f" {supported[d][name]:>10d}" for d in devices))
    up_total = sum(v[0] for v in UPSTREAM_CASES.values())
    covered = [n for n in UPSTREAM_CASES if ours[n]]
    missing = sorted(n for n in UPSTREAM_CASES if not ours[n])
    print(f"ops: upstream {len(UPSTREAM_CASES)} with cases; torchggml cases for {len(covered)} of them, "
          f"{len([n for n in ours if n not in UPSTREAM_CASES])} more op names of its own")
    print(f"single-op cases: upstream {up_total}, torchggml {len(single)}"
          + "".join(f", {d} supports {sum(supported[d].values())}" for d in devices))
    print(f"graph (fusion) cases: torchggml {len(graph)} ({', '.join(sorted(Counter(c.op for c in graph)))})")
    if missing:
        print(f"upstream ops without torchggml cases: {', '.join(missing)}")
    return 0
