"""test-backend-ops on the CPU device: every case of the op table against its float64 reference."""
import pytest

import torchggml as ggml
from torchggml.test_ops.runner import all_cases, check_case_against_reference

CASES = all_cases()


@pytest.fixture(scope="module")
def cpu():
    return ggml.backend_cpu_init()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_op_matches_float64_reference(case, cpu):
    ok, err = check_case_against_reference(case, cpu)
    assert ok, f"{case.name}: normalized MSE {err:.3g} exceeds {case.max_nmse:g}"


def test_perf_mode_times_computes_and_counts_work(cpu):
    """`test-ops --mode perf`: time per compute of a planned graph, flops of products, bytes
    of element-wise ops."""
    from torchggml.test_ops.runner import time_case
    mm = next(c for c in CASES if c.op == "mul_mat" and "type_a=F32,type_b=F32,m=7,n=9,k=96" in c.desc)
    seconds, moved, flops = time_case(mm, cpu, min_seconds=0.01)
    assert seconds > 0 and flops == 2 * 7 * 9 * 96
    add = next(c for c in CASES if c.op == "add" and c.desc.startswith("type=F32"))
    seconds, moved, flops = time_case(add, cpu, min_seconds=0.01)
    assert flops == 0 and moved == 3 * 32 * 4 * 3 * 2 * 4  # a, b, out: 32x4x3x2 F32 each
