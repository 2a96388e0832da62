"""The registry: regs and devices, names and types, backend initialisation, proc addresses,
the SIM reg following TORCHGGML_SIM_DEVICES, plugins (a file, a module name, a directory, an
entry point) and the `torchggml` command."""
from pathlib import Path

import pytest
import torch

import torchggml as ggml
from torchggml import cli
from torchggml.devices.accelerator import gpu_offload_op, op_batch_size

T = ggml.Type
PLUGINS = Path(__file__).parent / "plugins"
PLUGIN = PLUGINS / "toy_backend.py"


@pytest.fixture(autouse=True)
def two_sim_devices(monkeypatch):
    monkeypatch.setenv("TORCHGGML_SIM_DEVICES", "2")


@pytest.fixture
def unload_toy():
    yield
    reg = ggml.backend_reg_by_name("TOY")
    while reg is not None:
        ggml.backend_unload(reg)
        reg = ggml.backend_reg_by_name("TOY")


def device_names():
    return [ggml.backend_dev_name(ggml.backend_dev_get(i)) for i in range(ggml.backend_dev_count())]


def reg_names():
    return [ggml.backend_reg_name(ggml.backend_reg_get(i)) for i in range(ggml.backend_reg_count())]


# ---------------------------------------------------------------- enumeration

def test_builtin_regs_accelerators_first_cpu_last():
    names = reg_names()
    assert names[-1] == "CPU" and names[-2] == "SIM"
    assert ("CUDA" in names) == torch.cuda.is_available()
    assert device_names()[-3:] == ["SIM0", "SIM1", "CPU"]
    for i in range(ggml.backend_reg_count()):
        reg = ggml.backend_reg_get(i)
        devs = [ggml.backend_reg_dev_get(reg, j) for j in range(ggml.backend_reg_dev_count(reg))]
        assert all(ggml.backend_dev_backend_reg(d) is reg for d in devs)


def test_unloaded_sim_reg_stays_out_until_registered_again():
    sim = ggml.backend_reg_by_name("SIM")
    ggml.backend_unload(sim)
    try:
        assert ggml.backend_dev_by_name("SIM0") is None  # although TORCHGGML_SIM_DEVICES=2
    finally:
        ggml.backend_register(sim)
    assert ggml.backend_dev_by_name("SIM0") is sim.get_devices()[0]
    assert reg_names()[-2:] == ["SIM", "CPU"]


@pytest.mark.parametrize("value, sims", [("3", ["SIM0", "SIM1", "SIM2"]), ("1", ["SIM0"]), ("0", []), ("", [])])
def test_sim_reg_follows_the_environment(monkeypatch, value, sims):
    monkeypatch.setenv("TORCHGGML_SIM_DEVICES", value)
    assert [n for n in device_names() if n.startswith("SIM")] == sims
    assert (ggml.backend_reg_by_name("SIM") is not None) == bool(sims)
    assert reg_names()[-1] == "CPU"


def test_sim_devices_are_stable_objects_and_unset_means_none(monkeypatch):
    before = ggml.backend_dev_by_name("SIM0")
    monkeypatch.delenv("TORCHGGML_SIM_DEVICES")
    assert ggml.backend_dev_by_name("SIM0") is None
    monkeypatch.setenv("TORCHGGML_SIM_DEVICES", "2")
    assert ggml.backend_dev_by_name("SIM0") is before


def test_bad_sim_setting_is_named(monkeypatch):
    monkeypatch.setenv("TORCHGGML_SIM_DEVICES", "two")
    with pytest.raises(ValueError, match="TORCHGGML_SIM_DEVICES='two'"):
        ggml.backend_dev_count()


@pytest.mark.parametrize("name, expected", [("cpu", "CPU"), ("Cpu", "CPU"), ("sim1", "SIM1"), ("SIM0", "SIM0"), ("gpu", None)])
def test_device_names_are_case_insensitive(name, expected):
    dev = ggml.backend_dev_by_name(name)
    assert (dev and ggml.backend_dev_name(dev)) == expected


@pytest.mark.parametrize("name, expected", [("cpu", "CPU"), ("Sim", "SIM"), ("nope", None)])
def test_reg_names_are_case_insensitive(name, expected):
    reg = ggml.backend_reg_by_name(name)
    assert (reg and ggml.backend_reg_name(reg)) == expected


@pytest.mark.parametrize("type", list(ggml.DeviceType), ids=lambda t: t.name)
def test_dev_by_type_is_the_first_device_of_that_type(type):
    devices = [ggml.backend_dev_get(i) for i in range(ggml.backend_dev_count())]
    first = next((d for d in devices if ggml.backend_dev_type(d) == type), None)
    assert ggml.backend_dev_by_type(type) is first


def test_index_errors():
    with pytest.raises(IndexError, match="no index 99"):
        ggml.backend_reg_get(99)
    with pytest.raises(IndexError, match="no index -1"):
        ggml.backend_dev_get(-1)
    with pytest.raises(IndexError, match="reg CPU has 1 devices, no index 1"):
        ggml.backend_reg_dev_get(ggml.backend_reg_by_name("CPU"), 1)


def test_device_props():
    for name, type, host_buffer, events in [("CPU", ggml.DeviceType.CPU, False, False),
                                            ("SIM0", ggml.DeviceType.GPU, True, True)]:
        dev = ggml.backend_dev_by_name(name)
        props = ggml.backend_dev_get_props(dev)
        assert props.name == ggml.backend_dev_name(dev) == name
        assert props.description == ggml.backend_dev_description(dev) != ""
        assert props.type == ggml.backend_dev_type(dev) == type
        assert 0 < props.memory_free <= props.memory_total == ggml.backend_dev_memory(dev)[1]
        assert props.caps.host_buffer is host_buffer and props.caps.events is events
        assert (ggml.backend_dev_host_buffer_type(dev) is not None) is host_buffer


# ---------------------------------------------------------------- backends

@pytest.mark.parametrize("name", ["CPU", "sim0", "SIM1"])
def test_init_by_name(name):
    backend = ggml.backend_init_by_name(name)
    assert ggml.backend_name(backend) == name.upper()
    ggml.backend_free(backend)


def test_init_by_name_unknown_lists_the_devices():
    with pytest.raises(ValueError, match=r"no device named 'CUDA7' \(devices: .*SIM0, SIM1, CPU\)"):
        ggml.backend_init_by_name("CUDA7")


def test_init_by_type_and_best(monkeypatch):
    assert ggml.backend_init_by_type(ggml.DeviceType.ACCEL) is None
    cpu = ggml.backend_init_by_type(ggml.DeviceType.CPU)
    assert ggml.backend_is_cpu(cpu)
    best = ggml.backend_init_best()
    assert ggml.backend_get_device(best) is ggml.backend_dev_by_type(ggml.DeviceType.GPU)
    ggml.backend_free(best)
    if not torch.cuda.is_available():
        monkeypatch.setenv("TORCHGGML_SIM_DEVICES", "0")
        assert ggml.backend_is_cpu(ggml.backend_init_best())  # no GPU, no IGPU: the CPU


def test_dev_init_buffer_type_and_host_ptr():
    cpu_dev, sim_dev = ggml.backend_dev_by_name("CPU"), ggml.backend_dev_by_name("SIM0")
    backend = ggml.backend_dev_init(sim_dev, None)
    assert ggml.backend_get_device(backend) is sim_dev
    ggml.backend_free(backend)
    assert ggml.backend_buft_get_device(ggml.backend_dev_buffer_type(sim_dev)) is sim_dev
    data = torch.arange(8, dtype=torch.float32)
    buf = ggml.backend_dev_buffer_from_host_ptr(cpu_dev, data)
    assert ggml.backend_buffer_get_base(buf) == data.data_ptr()
    assert ggml.backend_dev_buffer_from_host_ptr(sim_dev, data) is None  # caps.buffer_from_host_ptr False


def test_dev_for_torch_device():
    assert ggml.backend_dev_for_torch_device("cpu") is ggml.backend_dev_by_name("CPU")
    assert ggml.backend_dev_for_torch_device(torch.device("cpu")) is ggml.backend_dev_by_name("CPU")
    with pytest.raises(ValueError, match="no ggml device for torch device meta"):
        ggml.backend_dev_for_torch_device("meta")
    if torch.cuda.is_available():
        assert ggml.backend_dev_name(ggml.backend_dev_for_torch_device("cuda:0")) == "CUDA0"


def test_cuda_reg_imports_without_cuda():
    from torchggml.devices.cuda import backend_reg
    reg = backend_reg()
    assert (len(reg.get_devices()) if reg is not None else 0) == torch.cuda.device_count()


# ---------------------------------------------------------------- proc addresses

@pytest.mark.parametrize("name", ["set_n_threads", "ggml_backend_set_n_threads", "dev_get_extra_bufts",
                                  "get_features", "set_abort_callback"])
def test_cpu_proc_addresses_exist(name):
    assert callable(ggml.backend_reg_get_proc_address(ggml.backend_reg_by_name("CPU"), name))


@pytest.mark.parametrize("reg, name", [("CPU", "no_such_function"), ("SIM", "set_n_threads")])
def test_missing_proc_address_is_none(reg, name):
    assert ggml.backend_reg_get_proc_address(ggml.backend_reg_by_name(reg), name) is None


def test_cpu_procs_work():
    reg = ggml.backend_reg_by_name("CPU")
    cpu = ggml.backend_cpu_init()
    threads = torch.get_num_threads()
    ggml.backend_reg_get_proc_address(reg, "set_n_threads")(cpu, 1)
    assert torch.get_num_threads() == 1
    ggml.backend_reg_get_proc_address(reg, "set_n_threads")(cpu, threads)
    features = ggml.backend_reg_get_proc_address(reg, "get_features")()
    assert features["TORCH"] == torch.__version__
    extra = ggml.backend_reg_get_proc_address(reg, "dev_get_extra_bufts")(ggml.backend_dev_by_name("CPU"))
    assert [ggml.backend_buft_name(b) for b in extra] == ["CPU_REPACK"]  # upstream's repack buffers
    ctx = ggml.init(1 << 16)
    a = ggml.new_tensor_1d(ctx, T.F32, 4)
    g = ggml.new_graph(ctx)
    ggml.build_forward_expand(g, ggml.add(ctx, a, a))
    ggml.backend_reg_get_proc_address(reg, "set_abort_callback")(cpu, lambda: True)
    assert ggml.backend_graph_compute(cpu, g) == ggml.Status.ABORTED
    ggml.backend_reg_get_proc_address(reg, "set_abort_callback")(cpu, None)
    assert ggml.backend_graph_compute(cpu, g) == ggml.Status.SUCCESS


def test_sim_features():
    features = ggml.backend_reg_get_proc_address(ggml.backend_reg_by_name("SIM"), "get_features")()
    assert features["SIM_DEVICES"] == "2"


# ---------------------------------------------------------------- registration and plugins

def toy_graph_on(dev, n=16):
    backend = ggml.backend_dev_init(dev)
    ctx = ggml.init(no_alloc=True)
    a = ggml.new_tensor_1d(ctx, T.F32, n)
    b = ggml.new_tensor_1d(ctx, T.F32, n)
    out = ggml.scale(ctx, ggml.mul(ctx, ggml.add(ctx, a, b), b), 0.5)
    g = ggml.new_graph(ctx)
    ggml.build_forward_expand(g, out)
    buf = ggml.backend_alloc_ctx_tensors(ctx, backend)
    return backend, buf, g, a, b, out


def check_toy_device_works(dev):
    """The plugin device computes, compares equal to the CPU, and answers supports_op truthfully."""
    assert ggml.backend_dev_type(dev) == ggml.DeviceType.ACCEL
    backend, buf, g, a, b, out = toy_graph_on(dev)
    assert ggml.backend_buffer_name(buf) == "TOY0" and not ggml.backend_buffer_is_host(buf)
    av, bv = torch.rand(16), torch.rand(16)
    ggml.backend_tensor_set(a, av)
    ggml.backend_tensor_set(b, bv)
    assert ggml.backend_graph_compute(backend, g) == ggml.Status.SUCCESS
    torch.testing.assert_close(ggml.backend_tensor_get(out), (av + bv) * bv * 0.5)
    diffs = []
    assert ggml.backend_compare_graph_backend(backend, ggml.backend_cpu_init(), g,
                                              lambda i, t1, t2: diffs.append(
                                                  (ggml.backend_tensor_get(t1) - ggml.backend_tensor_get(t2)).abs().max()) or True)
    assert len(diffs) == 3 and max(diffs) == 0
    ctx = ggml.init(no_alloc=True)
    mm = ggml.mul_mat(ctx, ggml.new_tensor_2d(ctx, T.F32, 4, 4), ggml.new_tensor_2d(ctx, T.F32, 4, 4))
    assert not ggml.backend_dev_supports_op(dev, mm)


def test_plugin_from_a_file(unload_toy):
    reg = ggml.backend_load(str(PLUGIN))
    assert ggml.backend_reg_name(reg) == "TOY"
    assert ggml.backend_reg_by_name("toy") is reg
    assert ggml.backend_load(str(PLUGIN)) is reg  # loading again gives the same reg
    assert reg_names().count("TOY") == 1
    dev = ggml.backend_dev_by_name("toy0")
    assert dev is ggml.backend_reg_dev_get(reg, 0)
    assert ggml.backend_reg_get_proc_address(reg, "get_features")() == {"TOY": "1"}
    check_toy_device_works(dev)
    ggml.backend_unload(reg)
    assert ggml.backend_reg_by_name("TOY") is None and ggml.backend_dev_by_name("TOY0") is None
    with pytest.raises(ValueError, match="not registered"):
        ggml.backend_unload(reg)


def test_plugin_from_a_module_name(monkeypatch, unload_toy):
    monkeypatch.syspath_prepend(str(PLUGINS))
    reg = ggml.backend_load("toy_backend")
    check_toy_device_works(ggml.backend_reg_dev_get(reg, 0))


def test_load_all_from_backend_path(monkeypatch, tmp_path, unload_toy):
    (tmp_path / "broken_backend.py").write_text("raise ImportError('this plugin is broken')\n")
    (tmp_path / "_private.py").write_text("raise AssertionError('never imported')\n")
    (tmp_path / "toy.py").write_text(PLUGIN.read_text())
    monkeypatch.setenv("TORCHGGML_BACKEND_PATH", str(tmp_path))
    with pytest.warns(RuntimeWarning, match="skipping .*broken_backend.py: ImportError: this plugin is broken"):
        regs = ggml.backend_load_all()
    assert [ggml.backend_reg_name(r) for r in regs] == ["TOY"]
    check_toy_device_works(ggml.backend_dev_by_name("TOY0"))


def test_load_all_from_an_entry_point(monkeypatch, tmp_path, unload_toy):
    """A package installed with `[project.entry-points."torchggml.backends"] toy = "toy_backend"`."""
    dist = tmp_path / "toy_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[torchggml.backends]\ntoy = toy_backend\n")
    (tmp_path / "toy_backend.py").write_text(PLUGIN.read_text())
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("TORCHGGML_BACKEND_PATH", raising=False)
    regs = ggml.backend_load_all()
    assert [ggml.backend_reg_name(r) for r in regs] == ["TOY"]
    assert ggml.backend_load_all() == regs  # already loaded: the same reg, not a second one
    check_toy_device_works(ggml.backend_dev_by_name("TOY0"))


@pytest.mark.parametrize("source, error", [
    ("does/not/exist.py", FileNotFoundError),
    ("torchggml.types", ImportError),        # a module without backend_reg()
    ("no_such_module_xyz", ImportError),
])
def test_bad_plugins_are_refused(source, error):
    with pytest.raises(error):
        ggml.backend_load(source)


def test_register_a_reg_and_a_device_directly():
    toy = ggml.backend_load(str(PLUGIN))
    ggml.backend_unload(toy)
    reg = type(toy)()  # a fresh TOY reg, registered by hand
    ggml.backend_register(reg)
    ggml.backend_register(reg)
    assert reg_names().count("TOY") == 1
    ggml.backend_unload(reg)
    extra = type(toy)().devices[0]
    ggml.backend_device_register(extra)
    assert ggml.backend_dev_by_name("TOY0") is extra and ggml.backend_dev_count() == len(device_names())
    with pytest.raises(TypeError, match="expected a torchggml Reg"):
        ggml.backend_register("CPU")
    with pytest.raises(TypeError, match="expected a torchggml Device"):
        ggml.backend_device_register(object())
    from torchggml.backend import registry
    registry._registry().extra_devices.remove(extra)


# ---------------------------------------------------------------- GPU offload policy (upstream CUDA)

def _node(op_builder):
    ctx = ggml.init(no_alloc=True)
    return op_builder(ctx)


@pytest.mark.parametrize("name, build, batch", [
    ("mul_mat ne1=8", lambda c: ggml.mul_mat(c, ggml.new_tensor_2d(c, T.Q4_0, 64, 32), ggml.new_tensor_2d(c, T.F32, 64, 8)), 8),
    ("mul_mat ne1=64", lambda c: ggml.mul_mat(c, ggml.new_tensor_2d(c, T.Q4_0, 64, 32), ggml.new_tensor_2d(c, T.F32, 64, 64)), 64),
    ("get_rows", lambda c: ggml.get_rows(c, ggml.new_tensor_2d(c, T.Q4_0, 64, 32), ggml.new_tensor_1d(c, T.I32, 100)), 0),
    ("add rows", lambda c: ggml.add(c, ggml.new_tensor_2d(c, T.F32, 8, 40), ggml.new_tensor_2d(c, T.F32, 8, 40)), 40),
    ("mul_mat_id tokens", lambda c: ggml.mul_mat_id(c, ggml.new_tensor_3d(c, T.Q4_0, 64, 16, 4),
                                                    ggml.new_tensor_3d(c, T.F32, 64, 2, 33),
                                                    ggml.new_tensor_2d(c, T.I32, 2, 33)), 33),
])
def test_offload_policy(name, build, batch):
    node = _node(build)
    assert op_batch_size(node) == batch
    assert gpu_offload_op(node) is (batch >= 32)


# ---------------------------------------------------------------- the command line

def test_cli_devices(capsys):
    assert cli.main(["devices"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["reg", "device", "type"]
    for name in device_names():
        assert any(line.split()[1:2] == [name] for line in lines[2:])
    sim_line = next(line for line in lines if line.split()[1:2] == ["SIM0"])
    assert "GPU" in sim_line and "async,host_buffer,events" in sim_line


def test_cli_test_ops_hands_its_arguments_to_the_testing_module(monkeypatch):
    import torchggml.test_ops.runner
    seen = []
    monkeypatch.setattr(torchggml.test_ops.runner, "main_test_ops", lambda args, cases=None: seen.append(args) or 3)
    assert cli.main(["test-ops", "-b", "SIM0", "-o", "MUL_MAT", "--mode", "perf"]) == 3
    assert (seen[0].backend, seen[0].op, seen[0].mode) == ("SIM0", "MUL_MAT", "perf")
    with pytest.raises(SystemExit):
        cli.main(["test-ops", "--mode", "fast"])
