"""Kernels from user code: ggml.register_kernel, test-ops --kernels, -m perf, and the Triton
entries' sync-free MUL_MAT_ID and capture-safe bounds checks."""
import textwrap

import pytest
import torch

import torchggml as ggml
from torchggml.cli import main as cli_main
from torchggml.test_ops.runner import all_cases, prepared_case


@pytest.fixture(autouse=True)
def no_registrations_left():
    yield
    for reg in ggml.registered_kernels():
        reg.remove()


def _add_graph(ctx, t=ggml.Type.F32, n=8):
    a, b = ggml.new_tensor_1d(ctx, t, n), ggml.new_tensor_1d(ctx, t, n)
    out = ggml.add(ctx, a, b)
    graph = ggml.new_graph(ctx)
    ggml.build_forward_expand(graph, out)
    return a, b, out, graph


def _kernel_file(tmp_path, body: str, name="my_kernels.py"):
    path = tmp_path / name
    path.write_text("import torchggml as ggml\nCALLS = []\n\n" + textwrap.dedent(body))
    return str(path)


SAME_SHAPE_F32 = "lambda n: all(t.type == ggml.Type.F32 and t.ne == n.ne for t in (n, *n.src[:2]))"

RIGHT_ADD = f"""
def add_f32(node):
    CALLS.append(node.name)
    a, b = ggml.to_torch(node.src[0]), ggml.to_torch(node.src[1])
    ggml.to_torch(node).copy_(a + b)

ggml.register_kernel("ADD", add_f32, device="SIM", supports={SAME_SHAPE_F32})
"""

WRONG_ADD = f"""
def add_f32_wrong(node):
    CALLS.append(node.name)
    a, b = ggml.to_torch(node.src[0]), ggml.to_torch(node.src[1])
    ggml.to_torch(node).copy_(a - b)  # the bug

ggml.register_kernel("ADD", add_f32_wrong, device="SIM", supports={SAME_SHAPE_F32})
"""


def _calls():
    (reg,) = ggml.registered_kernels("SIM")
    return reg.kernel.__globals__["CALLS"]


def test_test_ops_fails_a_wrong_kernel(tmp_path, capsys):
    path = _kernel_file(tmp_path, WRONG_ADD)
    assert cli_main(["test-ops", "-b", "SIM0", "-o", "add", "--kernels", path]) == 1
    out = capsys.readouterr().out
    fail = next(line for line in out.splitlines() if "FAIL" in line)
    # the line names the case, the error, the threshold and the largest difference
    assert "add(type=F32,ne_a=[32, 4, 3, 2],ne_b=[32, 4, 3, 2])" in fail
    assert "threshold 1e-07" in fail and "max abs error" in fail and "expected" in fail
    assert _calls(), "the registered kernel was not called"
    # cases it does not support (broadcast b, F16) still pass on the built-in kernels
    assert "add(type=F32,ne_a=[32, 4, 3, 2],ne_b=[1, 4, 3, 2]): OK" in out


def test_test_ops_passes_a_right_kernel_and_calls_it(tmp_path, capsys):
    path = _kernel_file(tmp_path, RIGHT_ADD)
    assert cli_main(["test-ops", "-b", "SIM0", "-o", "add", "--kernels", path]) == 0
    calls = _calls()
    n_same_shape_f32 = sum(1 for c in all_cases() if c.op == "add" and c.desc.startswith("type=F32")
                           and c.desc.count("[32, 4, 3, 2]") == 2)
    assert len(calls) >= n_same_shape_f32 > 0  # once per run of a case it supports
    assert "FAIL" not in capsys.readouterr().out


def test_perf_mode_times_registered_and_builtin_side_by_side(tmp_path, capsys, monkeypatch):
    path = _kernel_file(tmp_path, RIGHT_ADD.replace('device="SIM"', 'device="CPU"'))
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # a torch kernel on the CPU: timings are real
    assert cli_main(["test-ops", "-b", "CPU", "-o", "add", "-m", "perf", "--min-seconds", "0.001",
                     "--kernels", path]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    i = lines.index("  add(type=F32,ne_a=[32, 4, 3, 2],ne_b=[32, 4, 3, 2]):")
    assert lines[i + 1].split(":")[0].strip() == "add_f32" and "GB/s" in lines[i + 1] and "us/run" in lines[i + 1]
    assert lines[i + 2].split(":")[0].strip() == "built-in" and "GB/s" in lines[i + 2]
    assert "speed-up of the registered kernel" in lines[i + 2]


def test_perf_mode_under_the_interpreter_checks_only(tmp_path, capsys):
    path = _kernel_file(tmp_path, WRONG_ADD)
    assert cli_main(["test-ops", "-b", "SIM0", "-o", "add", "-m", "perf", "--kernels", path]) == 1
    out = capsys.readouterr().out
    assert "timings would be meaningless" in out and "us/run" not in out
    assert "FAIL" in out and "[registered: add_f32_wrong]" in out


def test_roofline_png(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    png = tmp_path / "roof.png"
    assert cli_main(["test-ops", "-b", "CPU", "-o", "mul_mat", "-m", "perf", "--min-seconds", "0.001",
                     "--roofline", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "GB/s copy" in capsys.readouterr().out


def test_supports_op_and_plans_follow_registrations():
    ctx = ggml.init(no_alloc=True)
    a, b, out, graph = _add_graph(ctx, ggml.Type.I32)
    cpu = ggml.backend_cpu_init()
    assert not ggml.backend_supports_op(cpu, out)

    def add_i32(node):
        ggml.to_torch(node).copy_(ggml.to_torch(node.src[0]) + ggml.to_torch(node.src[1]))
    handle = ggml.register_kernel(ggml.Op.ADD, add_i32, device=ggml.backend_dev_by_name("CPU"))
    assert ggml.backend_supports_op(cpu, out) and ggml.backend_dev_supports_op(ggml.backend_dev_by_name("CPU"), out)
    assert not ggml.backend_supports_op(ggml.backend_init_by_name("SIM0"), out)  # another device type
    buf = ggml.backend_alloc_ctx_tensors(ctx, cpu)
    ggml.backend_tensor_set(a, torch.arange(8, dtype=torch.int32))
    ggml.backend_tensor_set(b, torch.full((8,), 5, dtype=torch.int32))
    plan = ggml.backend_graph_plan_create(cpu, graph)
    ggml.backend_graph_plan_compute(cpu, plan)
    assert ggml.backend_tensor_get(out).tolist() == [5, 6, 7, 8, 9, 10, 11, 12]
    handle.remove()
    handle.remove()  # idempotent
    assert not ggml.backend_supports_op(cpu, out)
    with pytest.raises(ggml.UnsupportedOpError, match="op ADD is not supported on CPU"):
        ggml.backend_graph_plan_compute(cpu, plan)  # recompiled: the removed kernel is gone
    ggml.backend_graph_plan_free(cpu, plan)
    ggml.backend_buffer_free(buf)


def test_a_plan_drops_a_removed_kernel_on_sim():
    ctx = ggml.init(no_alloc=True)
    a, b, out, graph = _add_graph(ctx)
    sim = ggml.backend_init_by_name("SIM0")
    buf = ggml.backend_alloc_ctx_tensors(ctx, sim)
    ggml.backend_tensor_set(a, torch.ones(8))
    ggml.backend_tensor_set(b, torch.ones(8))
    plan = ggml.backend_graph_plan_create(sim, graph)

    def compute():
        ggml.backend_graph_plan_compute(sim, plan)
        ggml.backend_synchronize(sim)
        return ggml.backend_tensor_get(out)[0].item()
    assert compute() == 2
    with ggml.register_kernel("add", lambda node: ggml.to_torch(node).fill_(7), device="sim", name="sevens") as h:
        assert "sevens" in repr(h) and compute() == 7
    assert compute() == 2
    ggml.backend_graph_plan_free(sim, plan)
    ggml.backend_buffer_free(buf)


def test_newest_registration_wins_and_supports_selects():
    ctx = ggml.init(no_alloc=True)
    _, _, out, _ = _add_graph(ctx)
    from torchggml.devices.kernels.registered import registered_entry
    first = ggml.register_kernel("ADD", lambda n: None, device="CUDA", name="first")
    second = ggml.register_kernel("ADD", lambda n: None, device="CUDA", name="second",
                                  supports=lambda n: n.ne[0] > 8)
    assert registered_entry(out, "CUDA") is first  # second does not take 8 values
    third = ggml.register_kernel("ADD", lambda n: None, device="CUDA", name="third")
    assert registered_entry(out, "CUDA") is third
    assert [r.name for r in ggml.registered_kernels("cuda")] == ["third", "second", "first"]


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(op="NOT_AN_OP"), ValueError, "no op named 'NOT_AN_OP'"),
    (dict(op=ggml.Op.VIEW), ValueError, "VIEW is a view op"),
    (dict(kernel="not callable"), TypeError, "kernel must be callable"),
    (dict(supports=3), TypeError, "supports must be callable"),
    (dict(device=""), ValueError, "device must name a device type"),
    (dict(device=3.5), TypeError, "device must be a device type name or a Device"),
])
def test_register_kernel_rejects_bad_arguments(kwargs, error, match):
    args = dict(op="ADD", kernel=lambda n: None, device="CPU") | kwargs
    with pytest.raises(error, match=match):
        ggml.register_kernel(args.pop("op"), args.pop("kernel"), **args)


def test_load_kernel_files_errors(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="no kernel file .*missing.py"):
        ggml.load_kernel_files([str(tmp_path / "missing.py")])
    broken = _kernel_file(tmp_path, "raise RuntimeError('boom')\n", "broken.py")
    with pytest.raises(RuntimeError, match="loading .*broken.py failed: RuntimeError: boom"):
        ggml.load_kernel_files(broken)
    with pytest.raises(ValueError, match="neither a file nor an importable module"):
        ggml.load_kernel_files(["no_such_module_xyz"])
    assert cli_main(["test-ops", "-o", "add", "--kernels", str(tmp_path / "missing.py")]) == 2
    assert "no kernel file" in capsys.readouterr().err


# ---------------------------------------------------------------- MUL_MAT_ID and GET_ROWS on the Triton entries

def _case(op: str, contains: str):
    return next(c for c in all_cases() if c.op == op and contains in c.desc)


class HostSync(AssertionError):
    pass


def test_mul_mat_id_plan_never_syncs_the_host(monkeypatch):
    """The bound Triton MUL_MAT_ID keeps expert ids on the device: no .tolist()/.item()/int()/
    bool() of a tensor while the plan computes (what a CUDA graph capture forbids)."""
    case = _case("mul_mat_id", "type_a=Q4_0,type_b=F32,n_expert=8,n_used=2,b.ne1=2,n_tokens=7")
    sim = ggml.backend_init_by_name("SIM0")
    with prepared_case(case, sim) as (graph, inputs, out):
        plan = ggml.backend_graph_plan_create(sim, graph)
        ggml.backend_graph_plan_compute(sim, plan)  # warm-up: Triton's interpreter set-up
        ggml.backend_synchronize(sim)
        expected = ggml.backend_tensor_get(out).clone()
        ggml.backend_tensor_set(out, torch.zeros_like(expected))

        def forbidden(*args, **kwargs):
            raise HostSync("host sync")
        for name in ("tolist", "item", "__int__", "__bool__", "__index__", "cpu", "numpy"):
            monkeypatch.setattr(torch.Tensor, name, forbidden)
        ggml.backend_graph_plan_compute(sim, plan)
        ggml.backend_synchronize(sim)
        monkeypatch.undo()
        assert torch.equal(ggml.backend_tensor_get(out), expected)
        ggml.backend_graph_plan_free(sim, plan)


@pytest.mark.parametrize("op, contains, n_valid", [
    ("mul_mat_id", "type_a=Q4_0,type_b=F32,n_expert=4,n_used=2,b.ne1=1,n_tokens=5", 4),
    ("get_rows", "type=Q4_0,ne0=256,n_rows=6,n=4,batch=[1, 1]", 6),
    ("get_rows", "type=Q4_0,ne0=256,n_rows=5,n=3,batch=[2, 2]", 5),
])
def test_out_of_range_ids_fail_on_the_device_check(op, contains, n_valid):
    case = _case(op, contains)
    sim = ggml.backend_init_by_name("SIM0")
    with prepared_case(case, sim) as (graph, inputs, out):
        ids = next(t for t in inputs if t.type == ggml.Type.I32)
        bad = torch.zeros(tuple(reversed(ids.ne)), dtype=torch.int32)
        bad.view(-1)[-1] = n_valid  # one past the end
        ggml.backend_tensor_set(ids, bad)
        with pytest.raises(ggml.StreamError, match=rf"op {op.upper()} .*must lie in \[0, {n_valid}\)"):
            ggml.backend_graph_compute(sim, graph)  # computes and synchronizes


@pytest.mark.parametrize("command", [["eval", "{missing}", "--tokens", "1"], ["run", "{missing}", "-n", "1"]])
def test_run_and_eval_load_kernel_files_first(tmp_path, command, capsys):
    path = _kernel_file(tmp_path, RIGHT_ADD)
    argv = [a.format(missing=tmp_path / "missing.gguf") for a in command] + ["--kernels", path]
    assert cli_main(argv) == 1  # the model file is missing: a one-line error...
    assert "missing.gguf" in capsys.readouterr().err
    assert [r.name for r in ggml.registered_kernels("SIM")] == ["add_f32"]  # ...after the kernels loaded
