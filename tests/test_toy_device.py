"""A new device is one file: `devices/toy.py` below (a generic accelerator on torch's cpu
device type, with the torch reference kernels) is found by the registry with no edit anywhere
else, and passes op cases, async data movement, events and the scheduler."""
from __future__ import annotations

import pytest
import torch

import torchggml as ggml
import torchggml.devices
from torchggml.backend import registry
from torchggml.test_ops.runner import all_cases, check_case_against_reference

TOY_FILE = '''"""TOY: a device made of this file alone."""
from .accelerator import AcceleratorDevice, AcceleratorReg
from .kernels import TORCH_KERNELS


class ToyDevice(AcceleratorDevice):
    torch_type = "cpu"
    kernels = TORCH_KERNELS


def backend_reg():
    return AcceleratorReg.of_available("TOY", ToyDevice)
'''



@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The registry as it is, plus devices/toy.py (the package's path gains a folder
    holding the file; the registry rescans)."""
    folder = tmp_path_factory.mktemp("device_files")
    (folder / "toy.py").write_text(TOY_FILE)
    mp = pytest.MonkeyPatch()
    mp.setattr(torchggml.devices, "__path__", [*torchggml.devices.__path__, str(folder)])
    mp.setattr(registry, "_state", None)
    try:
        device = ggml.backend_dev_by_name("TOY0")
        assert device is not None, "the registry did not find devices/toy.py"
        yield device
    finally:
        mp.undo()


def test_the_registry_finds_the_device_file(toy):
    names = [ggml.backend_dev_name(ggml.backend_dev_get(i)) for i in range(ggml.backend_dev_count())]
    assert "TOY0" in names and names[-1] == "CPU"
    assert ggml.backend_dev_type(toy) == ggml.DeviceType.GPU
    assert ggml.backend_dev_get_props(toy).caps.events
    # torch cpu memory is still the CPU device's
    assert ggml.backend_dev_name(ggml.backend_dev_for_torch_device("cpu")) == "CPU"


# the first case of every op in the table (one per op keeps the suite fast)
_FIRST = {}
for _c in all_cases():
    _FIRST.setdefault(_c.op, _c)
CASES = list(_FIRST.values())


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_op_case_matches_reference(toy, case):
    backend = ggml.backend_dev_init(toy)
    ok, err = check_case_against_reference(case, backend)
    assert ok, f"{case.name}: normalized MSE {err:.3g} exceeds {case.max_nmse:g}"


def test_async_io_events_and_scheduler(toy):
    backend = ggml.backend_dev_init(toy)
    cpu = ggml.backend_cpu_init()
    ctx = ggml.init(no_alloc=True)
    a = ggml.new_tensor_1d(ctx, ggml.Type.F32, 8)
    b = ggml.new_tensor_1d(ctx, ggml.Type.F32, 8)
    ggml.set_input(a)
    y = ggml.add(ctx, ggml.mul(ctx, a, b), b)
    buf = ggml.backend_alloc_ctx_tensors(ctx, backend)
    assert ggml.backend_buffer_get_type(buf) is ggml.backend_dev_buffer_type(toy)
    x = torch.arange(8, dtype=torch.float32)
    ggml.backend_tensor_set_async(backend, b, x)
    event = ggml.backend_event_new(toy)
    ggml.backend_event_record(event, backend)
    ggml.backend_event_synchronize(event)
    ggml.backend_synchronize(backend)

    graph = ggml.new_graph(ctx)
    ggml.build_forward_expand(graph, y)
    sched = ggml.backend_sched_new([backend, cpu])
    assert ggml.backend_sched_alloc_graph(sched, graph)
    ggml.backend_tensor_set(a, torch.full((8,), 2.0))
    assert ggml.backend_sched_graph_compute(sched, graph) == ggml.Status.SUCCESS
    torch.testing.assert_close(ggml.backend_tensor_get(y), x * 2 + x)
    ggml.backend_sched_free(sched)
    ggml.backend_buffer_free(buf)
