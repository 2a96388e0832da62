"""The whole op case table on a SIM device: the accelerator (GPU) op table, with the Triton
kernels running in Triton's interpreter, against each case's float64 reference. The device is
TORCHGGML_TEST_DEVICE (SIM0; CUDA0 when scripts/gpu_check.py runs this on a GPU, with the Triton
kernels compiled).

Every quantized MUL_MAT / MUL_MAT_ID / GET_ROWS case whose weight type the Triton kernels
decode must reach them (a spy counts the calls). Cases whose Triton work is too slow for the
interpreter (more than HEAVY_WEIGHT_VALUES weight values in one product) run on SIM devices only
with TORCHGGML_SIM_FULL_TABLE=1.
"""
import os

import pytest

import torchggml as ggml
from torchggml import config
from torchggml.test_ops.runner import all_cases, check_case_against_reference

triton_kernels = pytest.importorskip("torchggml.devices.triton")

DEVICE = config.value("TORCHGGML_TEST_DEVICE")
FULL_TABLE = os.environ.get("TORCHGGML_SIM_FULL_TABLE") == "1" or not DEVICE.upper().startswith("SIM")
HEAVY_WEIGHT_VALUES = 1 << 18
TRITON_OPS = {"mul_mat": "mul_mat", "mul_mat_id": "mul_mat_id", "get_rows": "get_rows"}


def _first_node_of(case, op: str):
    """(src0 type, src0 element count) of the case's first node of `op`, or None."""
    ctx = ggml.init(no_alloc=True)
    try:
        out, _ = case.build(ctx)
        graph = ggml.new_graph_custom(ctx, 4096)
        ggml.build_forward_expand(graph, out)
        node = next((n for n in graph.nodes if n.op.name.lower() == op), None)
        if node is None:
            return None
        a = node.src[0]
        return a.type, a.ne[0] * a.ne[1] * a.ne[2] * a.ne[3]
    finally:
        ggml.free(ctx)


def _triton_expected(case) -> bool:
    """The case's product reads quantized weights of a type the Triton kernels decode."""
    if case.op not in TRITON_OPS:
        return False
    found = _first_node_of(case, case.op)
    return (found is not None and ggml.type_traits(found[0]).is_quantized
            and triton_kernels.supports(found[0]))


def _heavy(case) -> bool:
    if case.op not in TRITON_OPS or not _triton_expected(case):
        return False
    return _first_node_of(case, case.op)[1] > HEAVY_WEIGHT_VALUES


CASES = all_cases()
PARAMS = [pytest.param(c, marks=() if FULL_TABLE or not _heavy(c) else pytest.mark.skip(
    reason=f"more than {HEAVY_WEIGHT_VALUES} weight values through Triton's interpreter: "
           f"TORCHGGML_SIM_FULL_TABLE=1 runs it"), id=c.name) for c in CASES]


@pytest.fixture(scope="module")
def sim():
    backend = ggml.backend_init_by_name(DEVICE)
    yield backend
    ggml.backend_free(backend)


@pytest.fixture
def triton_calls(monkeypatch):
    """Counts calls of the torchggml.devices.triton entry points the GPU table binds."""
    calls = dict.fromkeys(TRITON_OPS.values(), 0)
    for name in calls:
        real = getattr(triton_kernels, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(triton_kernels, name, spy)
    return calls


@pytest.mark.parametrize("case", PARAMS)
def test_gpu_table_matches_float64_reference(case, sim, triton_calls):
    ok, err = check_case_against_reference(case, sim)
    assert ok, f"{case.name} on {DEVICE}: normalized MSE {err:.3g} exceeds {case.max_nmse:g}"
    if _triton_expected(case):
        assert triton_calls[TRITON_OPS[case.op]] > 0, f"{case.name}: the Triton kernel was not called"


def test_every_triton_decoder_is_reached_by_product_cases():
    """Every block type the Triton kernels decode has MUL_MAT cases in the table (the test above
    then checks each reaches Triton), and MUL_MAT_ID cases exist for some; quantized product
    cases of other types run the torch kernels."""
    products = [c for c in CASES if c.op in ("mul_mat", "mul_mat_id") and _triton_expected(c)]
    covered = {_first_node_of(c, c.op)[0] for c in products if c.op == "mul_mat"}
    decoded = {t for t in triton_kernels.SUPPORTED_TYPES if ggml.type_traits(t).is_quantized}
    assert decoded <= covered, decoded - covered
    assert sum(c.op == "mul_mat_id" for c in products) >= 10
    assert len(products) >= 90
