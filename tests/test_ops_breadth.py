"""test-backend-ops at upstream's breadth on the CPU: a representative sample of the generated
families (every op, every 60th of its cases up to 2^17 values) against their float64 references;
the whole table (20,000+ cases) with TORCHGGML_TEST_OPS_FULL=1. Cases the CPU does not support
are reported as skips naming the reason, as upstream's test-backend-ops reports them."""
import os

import pytest

import torchggml as ggml
from torchggml.test_ops.cases.breadth import breadth_cases, sample_cases
from torchggml.test_ops.runner import check_case_against_reference
from torchggml.test_ops.command import supported_on

CASES = list(breadth_cases()) if os.environ.get("TORCHGGML_TEST_OPS_FULL") else sample_cases()


@pytest.fixture(scope="module")
def cpu():
    return ggml.backend_cpu_init()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_breadth_case_matches_float64_reference(case, cpu):
    if not supported_on(case, cpu):
        pytest.skip(f"{case.name}: not supported on CPU")
    ok, err = check_case_against_reference(case, cpu)
    assert ok, f"{case.name}: normalized MSE {err:.3g} exceeds {case.max_nmse:g}"


def test_breadth_reaches_upstream_scale():
    """At least 15,000 single-op cases over the ops torchggml has, every op family of upstream's
    list that torchggml implements represented, and the fusion graphs upstream tests."""
    from torchggml.test_ops.cases.breadth.fusion import FUSIONS
    from torchggml.test_ops.cases.upstream_counts import UPSTREAM_CASES
    from torchggml.test_ops.command import upstream_op
    cases = breadth_cases()
    single = [c for c in cases if c.op not in FUSIONS]
    assert len(single) >= 15000
    ours = {upstream_op(c) for c in single}
    recurrent = {"SSM_CONV", "SSM_SCAN", "RWKV_WKV6", "RWKV_WKV7", "GATED_LINEAR_ATTN", "GATED_DELTA_NET",
                 "SOLVE_TRI", "MUL_MAT_HADAMARD", "LIGHTNING_INDEXER", "DSV4_HC_COMB", "DSV4_HC_PRE", "DSV4_HC_POST"}
    assert set(UPSTREAM_CASES) - ours <= recurrent
    assert {c.op for c in cases if c.op in FUSIONS} == FUSIONS
