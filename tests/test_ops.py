"""test-backend-ops on the CPU device: every case of the op table against its float64 reference."""
import pytest

import torchggml as ggml
from torchggml.testing import all_cases, check_case_against_reference

CASES = all_cases()


@pytest.fixture(scope="module")
def cpu():
    return ggml.backend_cpu_init()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_op_matches_float64_reference(case, cpu):
    ok, err = check_case_against_reference(case, cpu)
    assert ok, f"{case.name}: normalized MSE {err:.3g} exceeds {case.max_nmse:g}"
