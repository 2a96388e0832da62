"""`torchggml test-ops`: case selection (-o, -p, --full), --list-ops, --show-coverage, grad mode
and CSV output, through the command's own parser."""
import csv
import io

import pytest

from torchggml.cli import build_parser


def run(capsys, *argv):
    args = build_parser().parse_args(["test-ops", *argv])
    rc = args.func(args)
    return rc, capsys.readouterr().out


def test_list_ops_counts_cases_per_upstream_op(capsys):
    rc, out = run(capsys, "--list-ops", "--full", "-o", "rope,rope_back")
    assert rc == 0
    lines = dict(line.split() for line in out.splitlines()[:-1])
    assert lines == {"ROPE": lines["ROPE"], "ROPE_BACK": lines["ROPE_BACK"]}
    assert int(lines["ROPE_BACK"]) == 404  # upstream's count for the family, reproduced


def test_params_regex_and_csv_output(capsys):
    rc, out = run(capsys, "-b", "CPU", "-o", "silu_back,cross_entropy_loss", "-p", r"ne=\[10, 5, 4, 3\]|64, 5",
                  "--output", "csv")
    assert rc == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert {r["op_name"] for r in rows} == {"SILU_BACK", "CROSS_ENTROPY_LOSS"}
    assert rows and all(r["passed"] == "1" and r["backend_name"] == "CPU" for r in rows)


def test_grad_mode_checks_backward_against_finite_differences(capsys):
    rc, out = run(capsys, "-b", "CPU", "-m", "grad", "-o", "soft_max,get_rows_back", "-p", "ne=\\[5, 1, 1, 1\\]|n=1,m=8")
    assert rc == 0
    assert "OK (mean abs asymmetry" in out
    assert "not supported [" in out  # get_rows_back has no gradient in ggml: reported, not failed


def test_show_coverage_compares_with_upstream(capsys):
    rc, out = run(capsys, "-b", "CPU", "--show-coverage", "--full", "-o", "rope,soft_max_back")
    assert rc == 0
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:] if line.split()[0] in ("ROPE", "SOFT_MAX_BACK")}
    assert rows["ROPE"][1:3] == ["466", "(466)"]                 # upstream (its CPU)
    assert int(rows["ROPE"][3]) >= 466 and rows["ROPE"][4] == rows["ROPE"][3]  # torchggml's, the CPU's
    assert rows["SOFT_MAX_BACK"][1:3] == ["48", "(24)"]
    assert "single-op cases: upstream 19726" in out


def test_support_mode_without_a_backend_lists_every_device(capsys):
    """No -b: every registered device is tested (this crashed naming a missing registry function)."""
    from torchggml.backend import registry
    rc, out = run(capsys, "-m", "support", "-o", "concat", "-p", "type=F32")
    assert rc == 0
    names = [registry.backend_dev_get(i).get_name() for i in range(registry.backend_dev_count())]
    assert all(f"Testing {name} (support)" in out for name in names)


@pytest.mark.parametrize("argv, message", [
    (["-o", "BOGUS"], "unknown op 'bogus'; choose from "),
    (["-o", "add,NOPE"], "unknown op 'nope'; choose from "),
    (["-b", "CUDA7", "-o", "add"], "no device 'CUDA7' here; choose from "),
    (["-b", "SIM9", "-o", "add"], "no device 'SIM9' here; choose from "),
    (["-o", "add", "-p", "no-such-case"], "-p 'no-such-case' matches no case of add"),
    (["-p", "(["], "-p '([' is not a regular expression"),
])
def test_selections_that_select_nothing_are_one_line_errors(capsys, argv, message):
    """Was: "0/0 passed" and exit 0 for -o BOGUS, a traceback for -b CUDA0 without CUDA, "0/0" for a
    -p that matched nothing (as the support test above did with type=f32)."""
    args = build_parser().parse_args(["test-ops", *argv])
    assert args.func(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("torchggml test-ops: error: ") and message in lines[0], lines
