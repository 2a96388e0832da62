"""Op tests for the meta device: a test-ops case run on Meta(dev0..devN-1) with its inputs
split, compared with the same case on one device.

For every case a few split policies are tried in order until one is accepted by the split
state rules (UnsupportedSplitError otherwise): inputs split along axis 1, 2, 3 or 0 (all float
inputs, then only the first), index inputs always MIRRORED. A case no policy can split runs
MIRRORED (every device computes the whole op).
"""
from __future__ import annotations

import torch

from ..devices.meta.meta import backend_meta_device, get_split_state
from ..devices.meta.split import MIRRORED, MetaSplitState, SplitAxis, UnsupportedSplitError, axis_granularity
from .runner import OpCase, compare, prepared_case, read_values, run_case
from ..types import type_traits

POLICIES = [(axis, first_only) for axis in (1, 2, 3, 0) for first_only in (False, True)]


class _Policy:
    """The meta device's get_split_state: splits input tensors as the current policy says."""

    def __init__(self, n: int):
        self.n = n
        self.policy = None  # (axis, first_only) or None for all MIRRORED
        self.n_split = 0

    def __call__(self, t):
        if self.policy is None or type_traits(t.type).dtype in (torch.int32, torch.int64):
            return MIRRORED
        axis, first_only = self.policy
        if first_only and self.n_split:
            return MIRRORED
        gran = axis_granularity(t, axis)
        if t.ne[axis] < self.n * gran or t.ne[axis] % gran:
            return MIRRORED
        self.n_split += 1
        return MetaSplitState(SplitAxis(axis))


class MetaCaseRunner:
    """Runs cases on a meta device over `devs` (one backend kept for all cases)."""

    def __init__(self, devs):
        self.policy = _Policy(len(devs))
        self.device = backend_meta_device(devs, self.policy)
        self.backend = self.device.init_backend()

    def free(self) -> None:
        self.backend.free()

    def run(self, c: OpCase):
        """(policy, output values): the first policy the split rules accept that splits something."""
        from ..backend.backend import backend_graph_compute
        for policy in [*POLICIES, None]:
            self.policy.policy, self.policy.n_split = policy, 0
            try:
                with prepared_case(c, self.backend) as (graph, inputs, out):
                    split = any(get_split_state(n, False).axis != SplitAxis.MIRRORED for n in graph.nodes)
                    if policy is not None and not split:
                        continue
                    backend_graph_compute(self.backend, graph)
                    return policy, read_values(out)
            except UnsupportedSplitError:
                continue
        raise AssertionError(f"{c.name}: not even MIRRORED inputs run on {self.device.get_name()}")


def check_meta_case(c: OpCase, runner: MetaCaseRunner, reference_backend):
    """(ok, error, policy): the meta result against the reference backend's, at the case's threshold."""
    policy, ours = runner.run(c)
    _, ref = run_case(c, reference_backend)
    ok, err = compare(c, ours, ref)
    return ok, err, policy
