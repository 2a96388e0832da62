"""Native runs: consecutive bound numba kernels of a CPU graph plan run in one native call.

A decode step's plan is ~20 bound kernels a layer (fast_ops, fusion, the block matvec: each a
BoundKernel, a numba kernel and numpy views of fixed memory). Called one by one from Python
each costs a dispatch, more on the cold cache that streaming a token's weights leaves
behind. Here every run of consecutive calls whose kernels and argument types jit/plan_kernels.OPS
lists is encoded once, when the plan is made, as a program (the arrays by address and shape),
and plan_kernels.run_program calls the same kernels with the same values from native code: a
1.1B model's decode step is then one call instead of ~440. Calls of other kernels stay as
they are between the runs. TORCHGGML_CPU_NATIVE_RUNS=0 turns this off (read when a plan is
made).
"""
from __future__ import annotations

import functools

import numpy as np

from ... import config
from .fast_ops import rope_angle_areas
from .jit.loader import BoundKernel, plan_kernels
from .layouts.fused import group_matvecs

# runs shorter than this stay calls one by one (one call gains nothing)
MIN_RUN = 2


def _argument_types(args) -> str | None:
    """The kernel's argument types as plan_kernels.OPS writes them, or None for an argument a
    program cannot hold (an array that is not C-contiguous, another object)."""
    parts = []
    for a in args:
        if isinstance(a, np.ndarray):
            if not a.flags.c_contiguous or a.ndim > 4:
                return None
            parts.append(f"{a.dtype.str[1:]}/{a.ndim}")
        elif isinstance(a, (bool, np.bool_)):
            parts.append("b")
        elif isinstance(a, (int, np.integer)):
            parts.append("i")
        elif isinstance(a, np.float32):
            parts.append("f4")
        elif isinstance(a, (float, np.float64)):
            parts.append("f8")
        else:
            return None
    return " ".join(parts)


def _program_call(fn) -> tuple[str | None, tuple]:
    """The kernel name and arguments a program runs for the bound call: rope's as rope_shared's
    with the table of angles the run's ROPE nodes of the same positions share (a decode step's
    Q and K of every layer: the angles computed once, not 2 x n_layer times)."""
    name = getattr(fn.kernel, "__name__", None)
    if name == "rope":
        return "rope_shared", (*fn.args, *rope_angle_areas(fn.args))
    return name, fn.args


def _opcode(fn) -> int | None:
    if not isinstance(fn, BoundKernel):
        return None
    name, args = _program_call(fn)
    return _opcodes().get((name, _argument_types(args)))


@functools.cache
def _opcodes() -> dict:
    """(kernel name, argument types) -> opcode."""
    return {op: i for i, op in enumerate(plan_kernels().OPS)}


class NativeRun:
    """Bound kernels run by one plan_kernels.run_program call. `members` are the (call, node)
    pairs it stands for (the profiler times them one by one); the program runs them with the
    products of the same rows grouped (layouts/fused.group_matvecs)."""

    def __init__(self, members):
        kernels = plan_kernels()
        self.members = members
        self.calls = group_matvecs([fn for fn, _node in members])
        self.run_program = kernels.run_program
        arrays, index = [], {}
        self.keep = []  # the arrays whose addresses the program holds
        program = np.zeros((len(self.calls), kernels.PROGRAM_WIDTH), np.int64)
        floats = np.zeros((len(self.calls), kernels.FLOAT_WIDTH), np.float64)
        for r, fn in enumerate(self.calls):
            program[r, 0] = _opcode(fn)
            p, f = 1, 0
            for a in _program_call(fn)[1]:
                if isinstance(a, np.ndarray):
                    key = (a.ctypes.data, a.shape, a.dtype.str)
                    if key not in index:
                        index[key] = len(arrays)
                        shape = (1,) * (4 - a.ndim) + a.shape
                        arrays.append((a.ctypes.data, *shape))
                        self.keep.append(a)
                    program[r, p], p = index[key], p + 1
                elif isinstance(a, (float, np.floating)):
                    floats[r, f], f = float(a), f + 1
                else:
                    program[r, p], p = int(a), p + 1
        self.arrays = np.array(arrays, np.int64).reshape(-1, 5)
        self.program, self.floats = program, floats
        self.status = np.zeros(1, np.int64)

    def __call__(self, _node=None) -> None:
        failed = self.run_program(self.arrays, self.program, self.floats, self.status)
        if failed >= 0:  # a kernel reported a bad row index: its own check raises
            fn = self.calls[failed]
            fn.check(int(self.status[0]))
            raise RuntimeError(f"native run: call {failed} ({fn!r}) failed with {int(self.status[0])}")

    def __repr__(self):
        return f"<NativeRun of {len(self.members)} calls>"


def native_runs_enabled() -> bool:
    return config.value("TORCHGGML_CPU_NATIVE_RUNS")


def native_runs(calls) -> list:
    """The plan's calls with each run of at least MIN_RUN consecutive calls that a program can
    hold replaced by one NativeRun (at the run's last node)."""
    out, run = [], []

    def flush():
        if len(run) >= MIN_RUN:
            out.append((NativeRun(list(run)), run[-1][1]))
        else:
            out.extend(run)
        run.clear()
    for fn, node in calls:
        if _opcode(fn) is not None:
            run.append((fn, node))
        else:
            flush()
            out.append((fn, node))
    flush()
    return out
