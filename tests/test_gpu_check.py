"""scripts/gpu_check.py, the GPU machine's one prepared run (issue 40): its arguments, its stage
table, the report it writes and its time limits with the stages stubbed, the pieces its stages
measure with; and (slow) the rehearsal: the whole script on SIM0 (Triton's interpreter, tiny
shapes), so that the first GPU run cannot fail on a typo or a missing package."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
STAGES = ["env", "pytest", "test_ops", "bench_kernels", "model", "mixed", "meta_dist"]


def _load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gc = _load_script()


def test_the_stage_table_is_the_issues_list_and_its_budgets_fill_the_default():
    assert list(gc.STAGES) == STAGES
    assert sum(s.budget for s in gc.STAGES.values()) == gc.DEFAULT_BUDGET


NO_CUDA = not torch.cuda.is_available()


@pytest.mark.parametrize("argv, message", [
    (["--device", "GPU0"], "--device 'GPU0': expected CUDA<n> (a CUDA GPU) or SIM<n>"),
    pytest.param(["--device", "CUDA0"], "--device CUDA0: torch", marks=pytest.mark.skipif(
        not NO_CUDA, reason="this machine has CUDA")),
    (["--device", "SIM0", "--stages", "env,bogus"], "--stages: unknown stage(s) bogus; choose from env, pytest"),
    (["--device", "SIM0", "--budget", "0"], "--budget 0: expected a positive number of seconds"),
])
def test_bad_arguments_stop_with_one_line_and_exit_2(tmp_path, capsys, argv, message):
    assert gc.main(["--out", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("gpu_check.py: ") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


CANNED = {
    "env": gc.Result("passed", "a device", {"copy_gbps": 4300}, ["| what | value |\n|---|---|\n| torch | x |"]),
    "pytest": gc.Result("failed", "9 passed, 1 failed", reason="pytest exited 1", log_tail="E   assert 1 == 2"),
    "test_ops": gc.Result("passed", "12 cases: 12 passed"),
    "bench_kernels": gc.skipped(gc.not_on_sim("no CUDA events")),
    "model": gc.Result("passed", "decode 1.0 tok/s"),
    "mixed": gc.Result("failed", reason="killed at its time limit (50 s)", log_tail="[gpu_check: killed]"),
    "meta_dist": gc.Result("passed", "relative L2 0"),
}


def test_the_report_lists_every_stage_with_its_status_and_reasons(tmp_path, monkeypatch):
    deadlines = []

    def fake(name, ctx, deadline, argv_base):
        deadlines.append(deadline - ctx.deadline)  # before the run's end
        return CANNED[name]
    monkeypatch.setattr(gc, "run_stage_process", fake)
    out = tmp_path / "out"
    assert gc.main(["--out", str(out), "--device", "SIM0", "--budget", "60"]) == 1  # two stages failed
    report = json.loads((out / "report.json").read_text())
    assert list(report["stages"]) == STAGES and report["device"] == "SIM0" and report["tiny"] is True
    assert {n: s["status"] for n, s in report["stages"].items()} == {n: r.status for n, r in CANNED.items()}
    md = (out / "report.md").read_text()
    for name, r in CANNED.items():
        assert f"| {name} | {r.status} |" in md and f"## {name}: {gc.STAGES[name].what}" in md
    assert "E   assert 1 == 2" in md and "Skipped: not supported on SIM: no CUDA events" in md
    assert "9 passed, 1 failed (pytest exited 1)" in md
    # each stage ends by its cumulative share; the last by the run's end
    assert deadlines == sorted(deadlines) and abs(deadlines[-1]) < 1e-6


def test_a_stage_that_raises_is_failed_with_its_error(tmp_path, monkeypatch):
    def boom(ctx):
        raise RuntimeError("the device fell over\nsecond line")
    monkeypatch.setitem(gc.STAGES, "env", gc.Stage(boom, 15, "boom"))
    result = gc.run_stage_here("env", gc.Ctx("SIM0", True, tmp_path, tmp_path, 0.0))
    assert result.status == "failed" and result.reason == "RuntimeError: the device fell over"
    assert "raise RuntimeError" in result.log_tail


def test_a_stage_out_of_budget_is_skipped(tmp_path):
    ctx = gc.Ctx("SIM0", True, tmp_path, tmp_path, 0.0)
    result = gc.run_stage_process("env", ctx, deadline=0.0, argv_base=[])
    assert result.status == "skipped" and "budget was spent" in result.reason


def test_a_killed_stage_reports_what_it_measured_before(tmp_path, monkeypatch):
    ctx = gc.Ctx("SIM0", True, tmp_path, tmp_path, 0.0)
    measured = {"CUDA graphs": {"decode_tok_s": 512.0}}

    def killed(cmd, log, timeout, env=None, stdout=None):
        ctx.progress("model", measured)
        log.write_text("compiling\n[gpu_check: killed after 60 s, its time limit]\n")
        return gc.Ran(None, timeout, log)
    monkeypatch.setattr(gc, "run_limited", killed)
    result = gc.run_stage_process("model", ctx, gc.time.monotonic() + 60, [])
    assert result.status == "failed" and result.reason.startswith("killed at its time limit")
    assert result.data == {"partial": measured} and "killed after 60 s" in result.log_tail


def test_a_hung_command_is_killed_with_its_children(tmp_path):
    """run_limited kills the whole process group at the time limit: a grandchild that would sleep
    on is gone too."""
    ran = gc.run_limited(["sh", "-c", "sleep 120 & echo $!; wait"], tmp_path / "log", timeout=2)
    assert ran.timed_out and "killed after" in ran.tail()
    grandchild = int(ran.log.read_text().split()[0])
    try:
        state = Path(f"/proc/{grandchild}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        state = "gone"
    assert state in ("gone", "Z", "X")


def test_a_stage_runs_in_a_child_and_hands_back_its_result(tmp_path):
    """The parent / child protocol with the real env stage (SIM0: no copy bandwidth)."""
    ctx = gc.Ctx("SIM0", True, tmp_path, tmp_path, 0.0)
    result = gc.run_stage_process("env", ctx, deadline=gc.time.monotonic() + 120,
                                  argv_base=["--out", str(tmp_path), "--device", "SIM0", "--work", str(tmp_path)])
    assert result.status == "passed", (result.reason, result.log_tail)
    assert "SIM0" in result.data["devices"] and result.data["versions"]["torch"] == torch.__version__


@pytest.mark.parametrize("captured, status", [(1, "passed"), (0, "failed")])
def test_the_model_stage_with_cuda_graphs_compares_both_runs(tmp_path, monkeypatch, captured, status):
    """The branch only a GPU takes (SIM devices cannot capture), with the measurements stubbed."""
    import types
    import torchggml.models.placement as placement
    monkeypatch.setattr(placement, "find_device", lambda name: types.SimpleNamespace(graph_capture=object()))
    monkeypatch.setattr(gc, "model_file", lambda ctx: tmp_path / "m.gguf")
    (tmp_path / "m.gguf").write_bytes(bytes(3 << 20))

    def measure(ctx, path, dev, graphs, full, progress):
        plans = {"captured": captured if graphs else 0, "eager": 0 if graphs else 1, "compiled": 0,
                 "errors": [] if captured or not graphs else ["RuntimeError: capture failed"]}
        entry = {"decode_tok_s": 450.0 if graphs else 150.0, "ms_per_token": 1.0, "plans": plans}
        progress(entry)
        return entry, torch.full((1, 4), 2.0 if graphs else 2.5)
    monkeypatch.setattr(gc, "measure_model", measure)
    result = gc.stage_model(gc.Ctx("CUDA0", False, tmp_path, tmp_path, gc.time.monotonic() + 60))
    assert result.status == status
    assert result.summary == ("m.gguf (3 MiB): decode 450.0 tok/s (CUDA graphs), 150.0 tok/s without; logits "
                              "differ by at most 0.5")
    assert result.data["graphs_vs_eager_max_abs_diff"] == 0.5 and result.data["target_decode_400"] is True
    rows = result.tables[0].splitlines()
    assert rows[2].startswith("| CUDA graphs | 450.00 | 1.00 | n/a") and rows[3].startswith("| no CUDA graphs | 150.00")
    assert json.loads((tmp_path / "model.partial.json").read_text())["no CUDA graphs"]["decode_tok_s"] == 150.0


@pytest.mark.parametrize("line, test, outcome", [
    ("tests/test_a.py::test_x PASSED", "tests/test_a.py::test_x", "PASSED"),
    ("tests/test_a.py::test_y[p=1, q] FAILED                  [ 50%]", "tests/test_a.py::test_y[p=1, q]", "FAILED"),
    ("[gw3] [ 12%] SKIPPED tests/test_b.py::test_z[CUDA0]", "tests/test_b.py::test_z[CUDA0]", "SKIPPED"),
    ("[gw0] ERROR tests/test_b.py::test_w", "tests/test_b.py::test_w", "ERROR"),
    ("FAILED tests/test_a.py::test_y - assert 1 == 2", None, None),   # the summary repeats, not a result
    ("ERROR tests/test_c.py - ModuleNotFoundError: No module named 'gguf'", "tests/test_c.py", "ERROR"),
    ("collected 12 items", None, None),
])
def test_pytest_outcomes_read_plain_and_xdist_lines(line, test, outcome):
    assert gc.pytest_outcomes(line) == ({test: outcome} if test else {})


def test_bench_targets_and_their_table():
    def row(m, ours, bw=None, flops=None):
        return {"type": "Q4_0", "N": "4096", "K": "14336", "M": str(m), "ours_s": str(ours),
                "bw_frac": str(bw or 0), "flops_frac": "" if flops is None else str(flops)}
    rows = [row(1, 1e-4, bw=0.9), row(16, 1.5e-4, bw=0.5), row(512, 1e-3, flops=0.7), row(4096, 1e-2, flops=0.8)]
    (t,) = gc.bench_targets(rows)
    assert t == {"type": "Q4_0", "shape": "4096x14336", "m1_bw_frac": 0.9, "m16_over_m1": pytest.approx(1.5),
                 "m512_vs_bf16": 0.7, "m4096_vs_bf16": 0.8}
    assert gc.targets_table([t]).splitlines()[-1] == "| Q4_0 | 4096x14336 | 0.90 | 1.50 (miss) | 0.70 | 0.80 (miss) |"


@pytest.mark.parametrize("a, b, both", [
    ([(0, 10)], [(5, 15)], 5), ([(0, 10), (20, 30)], [(5, 25)], 10), ([(0, 1)], [(2, 3)], 0), ([], [(0, 5)], 0),
])
def test_overlap_of_busy_intervals(a, b, both):
    assert gc.overlap(a, b) == both == gc.overlap(b, a)


def test_intervals_merge_the_kept_events():
    trace = {"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 0, "dur": 5}, {"ph": "X", "cat": "kernel", "ts": 3, "dur": 5},
                             {"ph": "X", "cat": "gpu_memcpy", "ts": 20, "dur": 2}, {"ph": "i", "cat": "kernel", "ts": 30}]}
    assert gc.intervals(trace, gc.is_kernel) == [(0, 8)] and gc.intervals(trace, gc.is_copy) == [(20, 22)]


def test_q4_k_m_gives_layers_q6_k_by_llama_cpps_rule():
    assert [il for il in range(32) if gc.more_bits(il, 32)] == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    types = {name: t for name, _, t in gc.q4_k_m_tensors(gc.LLAMA3_8B)}
    assert types["output.weight"] == "Q6_K" and types["blk.5.ffn_down.weight"] == "Q4_K"
    assert types["blk.6.attn_v.weight"] == "Q6_K" and len(types) == 1 + 9 * 32 + 2


def test_the_generated_model_loads_and_its_logits_are_finite_and_moderate(tmp_path):
    """Random blocks with float16 scales sized to the row length keep activations O(1)."""
    from torchggml.models import load_model
    path = gc.write_llama(tmp_path / "m.gguf", gc.TINY, "cpu")
    model = load_model(path, progress=False)
    try:
        assert {t.type.name for t in model.file.tensors.values()} == {"Q4_K", "Q6_K", "F32"}
        logits = model.eval([1, 2, 3, 4])
    finally:
        model.close()
    assert logits.shape == (4, gc.TINY.n_vocab) and torch.isfinite(logits).all()
    assert 0.1 < float(logits.std()) < 10


@pytest.mark.slow
def test_rehearsal_on_sim0_writes_the_report_with_every_stage(tmp_path):
    """The whole script on SIM0: every stage present; those that can run on SIM passed, the others
    skipped saying why."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--device", "SIM0", "--budget", "900"],
                         capture_output=True, text=True, env=env, timeout=1200)
    md = (out / "report.md").read_text() if (out / "report.md").exists() else run.stdout + run.stderr
    assert run.returncode == 0, md
    report = json.loads((out / "report.json").read_text())
    stages = report["stages"]
    assert list(stages) == STAGES
    assert {n for n, s in stages.items() if s["status"] == "skipped"} == {"bench_kernels"}, md
    assert stages["bench_kernels"]["reason"].startswith("not supported on SIM")
    assert all(s["status"] == "passed" for n, s in stages.items() if n != "bench_kernels"), md
    assert stages["pytest"]["data"]["counts"]["passed"] >= 2 and stages["test_ops"]["data"]["passed"] >= 2
    assert stages["model"]["data"]["no graph capture"]["decode_tok_s"] > 0
    assert stages["meta_dist"]["data"]["relative_l2"] <= 1e-3
    for name in ("report.md", "report.json", "pytest.log", "pytest.xml", "test_ops.csv", "trace.json.gz"):
        assert (out / name).exists(), name
    assert len(list(out.iterdir())) <= 8  # what the device tool brings back
