"""torch.profiler ranges for ggml work: one per scheduler split (`ggml:split:<backend>:<i>`)
and, when TORCHGGML_PROFILE=1 or a torch profiler is running, one per node
(`ggml:<OP>:<name>`). With neither, nothing is recorded and compute pays one check per graph."""
from __future__ import annotations

import contextlib

import torch

from . import config

PROFILE_ENV = "TORCHGGML_PROFILE"


def profiling() -> bool:
    """Ranges are wanted: a torch profiler is active, or TORCHGGML_PROFILE=1."""
    # the C flag is per thread (and off with profile_all_threads); the Python one is global
    return (torch.autograd._profiler_enabled() or torch.autograd.profiler._is_profiler_enabled
            or config.value(PROFILE_ENV))


def split_range(backend_name: str, index: int):
    """The range of split `index` run by `backend_name` (a no-op context when not profiling)."""
    if not profiling():
        return contextlib.nullcontext()
    return torch.profiler.record_function(f"ggml:split:{backend_name}:{index}")


def node_range_name(node) -> str:
    return f"ggml:{node.op.name}:{node.name}"


def run_calls_profiled(calls) -> None:
    """Run compiled (kernel, node) calls, each inside its node's range (the calls a native run
    stands for one by one)."""
    for fn, node in calls:
        for fn_i, node_i in getattr(fn, "members", None) or ((fn, node),):
            with torch.profiler.record_function(node_range_name(node_i)):
                fn_i(node_i)
