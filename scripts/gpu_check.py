#!/usr/bin/env python
"""One unattended run that proves torchggml's CUDA path on a GPU machine and measures it (issue 40).

    python scripts/gpu_check.py --out OUT [--device CUDA0] [--budget 420] [--stages a,b] [--tiny]
    python scripts/gpu_check.py --out /tmp/rehearsal --device SIM0     # the rehearsal, tiny shapes

Stages, in order (STAGES below; each runs as a child process of this script, with a deadline):
  env            versions, the device, torchggml's devices, the device's copy bandwidth
  pytest         the device tests on --device (TORCHGGML_TEST_DEVICE): the op table, Triton
                 kernels compiled, CUDA-graph plans, scheduler splits CPU + device, events and
                 streams, pinned host buffers; pass/fail per test (pytest.log, pytest.xml)
  test_ops       `torchggml test-ops -b DEVICE` on the sample of every op, then the full
                 MUL_MAT / MUL_MAT_ID / GET_ROWS families of every type the Triton kernels
                 decode (test_ops.csv)
  bench_kernels  scripts/bench_kernels.py: matvec M=1, M=2..16 and the GEMM of Q4_0, Q4_K, Q5_K,
                 Q6_K, Q8_0, IQ4_XS, MXFP4 on 4096x14336 and 14336x4096 (bench_kernels.csv)
  model          a Llama-3-8B-shaped Q4_K_M file of random blocks (finite float16 scales sized so
                 activations stay O(1); written by torchggml's own GGUF writer, no quantizer, no
                 `gguf`): decode tok/s with and without CUDA-graph plans, their logits compared,
                 pp512, host time per token, 4 and 8 sequences in one batch
  mixed          the same file with half the layers on the CPU: decode tok/s and a torch.profiler
                 trace (trace.json.gz) with the copy / compute overlap measured from it
  meta_dist      the meta device over torch.distributed in a world of one process (torchrun;
                 NCCL on CUDA) against the plain device's logits

Everything lands in OUT: report.md, report.json and the files named above (at most 8 files).
A stage that fails is recorded with the last lines of its error and the run goes on; each stage
must end by its share of --budget (unused time passes to the next stage) and is killed when it
does not, so the whole run ends within the budget even if a stage hangs. On a SIM device the
shapes are tiny (--tiny, automatic there) and what cannot run there is recorded as skipped with
the reason. Exit status: 0 when no stage failed, 1 otherwise, 2 for bad arguments.

Running it on the GPU machine with the `device` tool (docs/devices.md, "Running the GPU check"):
the machine has torch, triton, numba, pytest and tokenizers but not `gguf`, which the Triton
kernel tests read their references with; carry its wheel (once, in the repository root):

    echo /.whl/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 -d .whl gguf==0.19.0

then one `run` call, carry [".whl"], timeout_s 500:

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH; PYTHONUNBUFFERED=1 python3 \
        scripts/gpu_check.py --out $OUT --device CUDA0 --budget 420
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import gzip
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_BUDGET = 420
TAIL_LINES = 25
TRITON_TYPES = ("q4_0", "q4_K", "q5_K", "q6_K", "q8_0", "iq4_xs", "mxfp4")  # the bench types


# ---------------------------------------------------------------- arguments and the device

class UsageError(ValueError):
    """Bad arguments or a device that is not here: one line, exit 2."""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for report.md, report.json and the logs")
    p.add_argument("--device", default="CUDA0", help="CUDA<n> (a GPU) or SIM<n> (the rehearsal)")
    p.add_argument("--budget", type=float, default=DEFAULT_BUDGET, help="seconds for the whole run")
    p.add_argument("--stages", default=None, help="comma-separated stages to run (default: all)")
    p.add_argument("--tiny", action="store_true", help="tiny shapes (automatic on SIM devices)")
    p.add_argument("--work", default=None, help="scratch folder for the generated models (default: a temp dir)")
    p.add_argument("--stage", default=None, help=argparse.SUPPRESS)      # run one stage in this process
    p.add_argument("--warm-cpu", action="store_true", help=argparse.SUPPRESS)  # compile the CPU kernels (background)
    p.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def check_device(name: str) -> str:
    """The device name normalized (CUDA0, SIM1), or UsageError saying what is wrong and where."""
    m = re.fullmatch(r"(cuda|sim)(\d+)", name.strip(), flags=re.I)
    if not m:
        raise UsageError(f"--device {name!r}: expected CUDA<n> (a CUDA GPU) or SIM<n> (the rehearsal on "
                         f"Triton's interpreter)")
    kind, index = m.group(1).upper(), int(m.group(2))
    if kind == "CUDA":
        import torch
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if index >= count:
            raise UsageError(f"--device {kind}{index}: torch {torch.__version__} sees {count} CUDA device(s) "
                             f"on this machine; run it on the GPU machine, or --device SIM0 to rehearse")
    return f"{kind}{index}"


def is_sim(device: str) -> bool:
    return device.startswith("SIM")


def check_stages(text: str | None) -> list[str]:
    if not text:
        return list(STAGES)
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in names if s not in STAGES]
    if unknown:
        raise UsageError(f"--stages: unknown stage(s) {', '.join(unknown)}; choose from {', '.join(STAGES)}")
    return names


# ---------------------------------------------------------------- what a stage gives back

@dataclasses.dataclass
class Result:
    status: str                      # passed, failed, skipped
    summary: str = ""
    data: dict = dataclasses.field(default_factory=dict)
    tables: list = dataclasses.field(default_factory=list)   # markdown blocks for report.md
    reason: str = ""                 # why skipped, or what failed
    seconds: float = 0.0
    log_tail: str = ""


def skipped(reason: str, **data) -> Result:
    return Result("skipped", reason=reason, data=data)


def not_on_sim(what: str) -> str:
    return f"not supported on SIM: {what}"


@dataclasses.dataclass
class Ctx:
    """What a stage knows: the device, tiny shapes or not, where to write, its deadline."""
    device: str
    tiny: bool
    out: Path
    work: Path
    deadline: float

    @property
    def sim(self) -> bool:
        return is_sim(self.device)

    @property
    def shape(self) -> "Shape":
        return TINY if self.tiny else LLAMA3_8B

    @property
    def sizes(self) -> "Sizes":
        return TINY_SIZES if self.tiny else FULL_SIZES

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def progress(self, stage: str, data: dict) -> None:
        """What a stage has measured so far: the parent reports it if the stage is killed."""
        (self.work / f"{stage}.partial.json").write_text(json.dumps(data, default=str))

    def env(self, **extra) -> dict:
        return child_env(self.device, **extra)


def child_env(device: str, **extra) -> dict:
    """The environment of every process this script starts: the source tree first, Triton's
    interpreter only for SIM devices, SIM devices registered (the scheduler tests mix SIM1 in)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(PYTHONUNBUFFERED="1", TORCHGGML_PROGRESS="0", TORCHGGML_TEST_DEVICE=device,
               TRITON_INTERPRET="1" if is_sim(device) else "0")
    env.setdefault("TORCHGGML_SIM_DEVICES", "2")
    env.update(extra)
    return env


# where the CPU is only the reference (pytest, test-ops): its torch kernels, so that no stage waits
# for numba to compile the CPU's kernels on the GPU machine's cold cache
CPU_AS_REFERENCE = {"TORCHGGML_CPU_FAST_OPS": "0", "TORCHGGML_CPU_PATH": "dequant"}


# ---------------------------------------------------------------- processes with a time limit

@dataclasses.dataclass
class Ran:
    returncode: int | None   # None: killed at its time limit
    seconds: float
    log: Path

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def tail(self, n: int = TAIL_LINES) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def run_limited(cmd: list[str], log: Path, timeout: float, env: dict | None = None, stdout: Path | None = None) -> Ran:
    """Run cmd (its output to `log`; stdout to its own file when `stdout` is given) in its own
    process group; past `timeout` seconds the whole group is killed (TERM, then KILL), so a hung
    grandchild cannot outlive it."""
    start = time.monotonic()
    with open(log, "w") as f, open(stdout or os.devnull, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out if stdout else f, stderr=f if stdout else subprocess.STDOUT,
                                env=env, cwd=ROOT, start_new_session=True)
        try:
            code = proc.wait(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            code = None
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=5)
                    break
                except subprocess.TimeoutExpired:
                    continue
                except ProcessLookupError:
                    break
            f.write(f"\n[gpu_check: killed after {time.monotonic() - start:.0f} s, its time limit]\n")
    return Ran(code, time.monotonic() - start, log)


# ---------------------------------------------------------------- stage: env

def stage_env(ctx: Ctx) -> Result:
    import platform
    import torch
    import torchggml as ggml
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "cuda": str(torch.version.cuda)}
    for name in ("triton", "numba", "numpy", "gguf", "tokenizers", "pytest", "xdist"):
        try:
            versions[name] = getattr(__import__(name), "__version__", "present")
        except ImportError:
            versions[name] = "missing"
    devices = [ggml.backend_dev_name(ggml.backend_dev_get(i)) for i in range(ggml.backend_dev_count())]
    dev = ggml.backend_dev_by_name(ctx.device)
    if dev is None:
        return Result("failed", reason=f"torchggml has no device {ctx.device} (devices: {', '.join(devices)})")
    _, total = ggml.backend_dev_memory(dev)
    data = {"versions": versions, "devices": devices, "description": ggml.backend_dev_description(dev),
            "memory_gib": round(total / 2**30, 1), "cpu_count": os.cpu_count()}
    if not ctx.sim:
        props = torch.cuda.get_device_properties(int(ctx.device[4:]))
        data.update(capability=f"{props.major}.{props.minor}", sms=props.multi_processor_count,
                    copy_gbps=round(copy_bandwidth(1 << 28 if ctx.tiny else 1 << 30) / 1e9))
    notes = [] if versions["gguf"] != "missing" else ["gguf is missing: tests/test_triton_kernels.py cannot "
                                                      "import its references (carry its wheel)"]
    rows = [f"| {k} | {v} |" for k, v in {**versions, **{k: v for k, v in data.items() if k != 'versions'}}.items()]
    table = "| what | value |\n|---|---|\n" + "\n".join(rows)
    summary = f"{data['description']}, {data['memory_gib']} GiB" + (
        f", sm_{data['capability'].replace('.', '')}, copy {data['copy_gbps']} GB/s" if not ctx.sim else "")
    return Result("passed", "; ".join([summary] + notes), data, [table])


def copy_bandwidth(nbytes: int) -> float:
    """Bytes/s of a device-to-device copy (read + write), median of 5 timed with CUDA events."""
    import torch
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return 2 * nbytes / statistics.median(times)


# ---------------------------------------------------------------- stage: pytest

# the device tests: each file's accelerator is TORCHGGML_TEST_DEVICE, or CUDA0 where torch has CUDA
PYTEST_FILES = ("tests/test_backend.py", "tests/test_registry.py", "tests/test_triton_kernels.py",
                "tests/test_sched.py", "tests/test_torch_integration.py", "tests/test_ops_sim.py")
# the rehearsal's selection: one test of each kind that runs on a SIM device in seconds
OP_TABLE_TEST = "tests/test_ops_sim.py::test_gpu_table_matches_float64_reference"
PYTEST_TINY = ("tests/test_backend.py::test_cuda_graph_plan_replays_a_50_node_graph",
               "tests/test_backend.py::test_cuda_host_buffers",
               "tests/test_sched.py::test_weights_on_sim_input_on_cpu_splits_and_copy_names",
               f"{OP_TABLE_TEST}[add(type=F32,ne_a=[32, 4, 3, 2],ne_b=[32, 4, 3, 2])]",
               f"{OP_TABLE_TEST}[mul_mat(type_a=Q4_0,type_b=F32,m=16,n=1,k=64,bs=[1, 1],nr=[1, 1])]")
OUTCOMES = ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS")
_PLAIN = re.compile(r"^(\S+::.+?) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
_XDIST = re.compile(r"^\[gw\d+\](?: \[\s*\d+%\])? (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+::.+?)\s*$")
_COLLECTION = re.compile(r"^ERROR (\S+\.py)(?: - .*)?$")  # a file that could not be imported (short summary)


def pytest_outcomes(log_text: str) -> dict[str, str]:
    """{test id: outcome} from pytest -v output (plain or pytest-xdist's lines)."""
    found = {}
    for line in log_text.splitlines():
        m = _PLAIN.match(line)
        if m:
            found[m.group(1)] = m.group(2)
            continue
        m = _XDIST.match(line)
        if m:
            found[m.group(2)] = m.group(1)
            continue
        m = _COLLECTION.match(line)
        if m:
            found[m.group(1)] = "ERROR"
    return found


def stage_pytest(ctx: Ctx) -> Result:
    selection = list(PYTEST_TINY if ctx.tiny else PYTEST_FILES)
    log, xml = ctx.out / "pytest.log", ctx.out / "pytest.xml"
    cmd = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-o", "console_output_style=classic",
           "--continue-on-collection-errors", f"--junitxml={xml}", *selection]
    workers = 0 if ctx.sim or ctx.tiny else min(8, os.cpu_count() or 1)
    if workers > 1 and _have("xdist"):
        cmd += ["-n", str(workers)]
    ran = run_limited(cmd, log, ctx.left() - 5, ctx.env(**CPU_AS_REFERENCE))
    outcomes = pytest_outcomes(log.read_text(errors="replace"))
    counts = {o.lower(): sum(v == o for v in outcomes.values()) for o in OUTCOMES}
    failed = sorted(t for t, o in outcomes.items() if o in ("FAILED", "ERROR"))
    data = {"counts": counts, "failed": failed[:50], "returncode": ran.returncode, "workers": workers}
    summary = ", ".join(f"{n} {o}" for o, n in counts.items() if n)
    if ran.timed_out:
        return Result("failed", summary, data, reason=f"stopped at its time limit after {len(outcomes)} tests",
                      log_tail=ran.tail())
    # 5: nothing collected; 1: failures; 2-4: interrupted, internal or usage errors
    ok = ran.returncode == 0
    tables = [_bullets("failed tests", failed)] if failed else []
    return Result("passed" if ok else "failed", summary, data, tables,
                  reason="" if ok else f"pytest exited {ran.returncode}", log_tail="" if ok else ran.tail())


def _have(module: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(module) is not None


def _bullets(title: str, items, limit: int = 30) -> str:
    more = f"\n- ... and {len(items) - limit} more" if len(items) > limit else ""
    return f"{title}:\n\n" + "\n".join(f"- `{x}`" for x in list(items)[:limit]) + more


# ---------------------------------------------------------------- stage: test_ops

def test_ops_runs(ctx: Ctx) -> list[tuple[str, list[str]]]:
    """(what, test-ops arguments): the sample of every op, then the Triton families in full."""
    import torchggml.devices.triton as tk
    decoded = sorted(t.name for t in tk.SUPPORTED_TYPES)
    if ctx.tiny:
        return [("a sample of cheap ops", ["-o", "ADD,RMS_NORM,SOFT_MAX,ROPE", "-p", r"ne=\[16,"]),
                ("Triton families (Q4_0 matvec rows)",
                 ["-o", "MUL_MAT,GET_ROWS", "-p", r"type_a=Q4_0,type_b=F32,m=16,n=1,"])]
    families = r"type(_a|_src)?=(" + "|".join(decoded) + r"),"
    return [("the sample of every op", []),
            ("MUL_MAT / MUL_MAT_ID / GET_ROWS of every Triton type, in full",
             ["-o", "MUL_MAT,MUL_MAT_ID,GET_ROWS", "--full", "-p", families])]


def stage_test_ops(ctx: Ctx) -> Result:
    out_csv = ctx.out / "test_ops.csv"
    rows, notes, failed_runs = [], [], []
    runs = test_ops_runs(ctx)
    for i, (what, extra) in enumerate(runs):
        part = ctx.work / f"test_ops_{i}.csv"
        cmd = [sys.executable, "-m", "torchggml", "test-ops", "-b", ctx.device, "--output", "csv", *extra]
        ran = run_limited(cmd, ctx.work / f"test_ops_{i}.log", ctx.left() / (len(runs) - i) - 3,
                          ctx.env(**CPU_AS_REFERENCE), stdout=part)
        got = [r for r in _read_csv(part) if None not in r.values()]  # a killed run's last row may be cut
        rows += got
        if ran.timed_out:
            notes.append(f"{what}: stopped at its time limit after {len(got)} cases ({ran.seconds:.0f} s)")
        elif ran.returncode not in (0, 1):  # 1: some case failed, counted below
            notes.append(f"{what}: exited {ran.returncode}: {ran.tail(1)}")
        if ran.timed_out or ran.returncode not in (0, 1):
            failed_runs.append(what)
    with open(out_csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["backend_name", "op_name", "op_params", "test_mode", "supported",
                                               "passed", "error", "message"])
        writer.writeheader()
        writer.writerows(rows)
    per_op: dict[str, list[int]] = {}
    failures = []
    for r in rows:
        c = per_op.setdefault(r["op_name"], [0, 0, 0])
        if r["supported"] != "1":
            c[2] += 1
        elif r["passed"] == "1":
            c[0] += 1
        else:
            c[1] += 1
            failures.append(f"{r['op_name']}({r['op_params']}): {r['message']}")
    total = [sum(c[k] for c in per_op.values()) for k in range(3)]
    table = "| op | passed | failed | not supported |\n|---|---:|---:|---:|\n" + "\n".join(
        f"| {op} | {p} | {f} | {u} |" for op, (p, f, u) in sorted(per_op.items()))
    summary = f"{len(rows)} cases: {total[0]} passed, {total[1]} failed, {total[2]} not supported"
    data = {"cases": len(rows), "passed": total[0], "failed": total[1], "not_supported": total[2],
            "failures": failures[:50], "runs": [w for w, _ in runs], "notes": notes}
    tables = [table] + ([_bullets("failed cases", failures)] if failures else [])
    status = "failed" if total[1] or failed_runs or not rows else "passed"
    return Result(status, summary, data, tables, reason="; ".join(notes) or ("" if rows else "no case ran"))


# ---------------------------------------------------------------- stage: bench_kernels

def bench_argv(ctx: Ctx) -> list[str]:
    if ctx.tiny:
        return ["--types", "q4_0,q4_K", "--shapes", "1024x1024", "--ms", "1,16,512", "--reps", "3"]
    return ["--types", ",".join(TRITON_TYPES), "--shapes", "4096x14336,14336x4096",
            "--ms", "1,2,4,8,16,512,4096", "--reps", "10"]


def stage_bench_kernels(ctx: Ctx) -> Result:
    import bench_kernels
    import torchggml.devices.triton as tk
    argv = bench_argv(ctx) + ["--csv", str(ctx.out / "bench_kernels.csv"), "--png", str(ctx.work / "bench.png")]
    args = bench_kernels.parse_args(argv)  # a typo here fails the rehearsal too
    bench_kernels.parse_types(args.types, tk.SUPPORTED_TYPES)
    bench_kernels.parse_shapes(args.shapes)
    if ctx.sim:
        return skipped(not_on_sim("bench_kernels.py times Triton kernels with CUDA events (its arguments "
                                  "were checked)"), argv=argv)
    ran = run_limited([sys.executable, str(ROOT / "scripts" / "bench_kernels.py"), *argv],
                      ctx.work / "bench_kernels.log", ctx.left() - 5, ctx.env())
    rows = _read_csv(ctx.out / "bench_kernels.csv")
    targets = bench_targets(rows)
    data = {"rows": len(rows), "targets": targets, "returncode": ran.returncode}
    tables = [targets_table(targets)] if targets else []
    summary = f"{len(rows)} cases timed"
    if ran.timed_out or ran.returncode != 0:
        why = f"stopped at its time limit after {len(rows)} cases" if ran.timed_out else f"exited {ran.returncode}"
        return Result("failed", summary, data, tables, reason=why, log_tail=ran.tail())
    return Result("passed", summary, data, tables)


def _read_csv(path: Path) -> list[dict]:
    try:
        with open(path) as f:
            return list(csv.DictReader(f))
    except OSError:
        return []


def bench_targets(rows: list[dict]) -> list[dict]:
    """Per type and shape, the issue's targets (reported, not asserted): matvec M=1 at >= 85% of
    copy bandwidth, M=16 within 1.25x M=1's time, GEMM at >= 65% (M=512) / 90% (M=4096) of bf16."""
    by = {}
    for r in rows:
        by.setdefault((r["type"], r["N"], r["K"]), {})[int(r["M"])] = r
    out = []
    for (qtype, n, k), ms in by.items():
        t = {"type": qtype, "shape": f"{n}x{k}"}
        if 1 in ms:
            t["m1_bw_frac"] = float(ms[1]["bw_frac"])
        if 1 in ms and 16 in ms:
            t["m16_over_m1"] = float(ms[16]["ours_s"]) / float(ms[1]["ours_s"])
        for m in (512, 4096):
            if m in ms and ms[m].get("flops_frac"):
                t[f"m{m}_vs_bf16"] = float(ms[m]["flops_frac"])
        out.append(t)
    return out


TARGETS = {"m1_bw_frac": ("M=1 bw / copy bw", ">=", 0.85), "m16_over_m1": ("M=16 / M=1 time", "<=", 1.25),
           "m512_vs_bf16": ("M=512 vs bf16", ">=", 0.65), "m4096_vs_bf16": ("M=4096 vs bf16", ">=", 0.90)}


def targets_table(targets: list[dict]) -> str:
    def cell(t, key):
        if key not in t:
            return "n/a"
        _, op, goal = TARGETS[key]
        met = t[key] >= goal if op == ">=" else t[key] <= goal
        return f"{t[key]:.2f}{'' if met else ' (miss)'}"
    head = "| type | N x K | " + " | ".join(f"{label} ({op} {goal:.2f})" for label, op, goal in TARGETS.values())
    return head + " |\n|---|---|" + "---:|" * len(TARGETS) + "\n" + "\n".join(
        f"| {t['type']} | {t['shape']} | " + " | ".join(cell(t, k) for k in TARGETS) + " |" for t in targets)


# ---------------------------------------------------------------- the generated model

@dataclasses.dataclass(frozen=True)
class Shape:
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int


LLAMA3_8B = Shape(4096, 32, 32, 8, 14336, 128256)
TINY = Shape(256, 2, 4, 2, 256, 256)  # rows of 256 values (the K-quants' block); few rows: the interpreter is slow


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How much the model stages run: tokens of each test, and untimed steps before each (a
    plan's first compute runs eagerly, its second captures the device graph)."""
    prompt: int       # the prompt before decode steps
    decode: int       # timed decode steps
    warm: int         # untimed steps before timed ones
    pp: int           # the prompt-processing test's tokens
    pp_reps: int
    batch_steps: int  # timed steps of 4 and 8 sequences
    profiled: int     # decode steps under the profiler
    n_ctx: int


FULL_SIZES = Sizes(prompt=16, decode=64, warm=2, pp=512, pp_reps=2, batch_steps=16, profiled=8, n_ctx=1024)
TINY_SIZES = Sizes(prompt=4, decode=1, warm=1, pp=8, pp_reps=1, batch_steps=1, profiled=1, n_ctx=64)

# each type's float16 fields: (byte offset, multiple of d); Q4_K's dmin = 7.5 d centres its values
HALF_FIELDS = {"Q4_K": ((0, 1.0), (2, 7.5)), "Q6_K": ((208, 1.0),)}
# the standard deviation of a weight of random blocks per unit of d (sub-block scales and quants uniform)
UNIT_STD = {"Q4_K": 245.0, "Q6_K": 1370.0}


def more_bits(il: int, n_layer: int) -> bool:
    """Q4_K_M's layers whose attn_v and ffn_down get Q6_K (llama.cpp's use_more_bits rule)."""
    return il < n_layer // 8 or il >= 7 * n_layer // 8 or (il - n_layer // 8) % 3 == 2


def q4_k_m_tensors(s: Shape) -> list[tuple[str, list[int], str]]:
    """(name, ggml ne, type) of a Llama model stored as Q4_K_M, in file order."""
    kv = s.n_embd // s.n_head * s.n_head_kv
    out = [("token_embd.weight", [s.n_embd, s.n_vocab], "Q4_K")]
    for il in range(s.n_layer):
        hi = "Q6_K" if more_bits(il, s.n_layer) else "Q4_K"
        p = f"blk.{il}."
        out += [(p + "attn_norm.weight", [s.n_embd], "F32"), (p + "attn_q.weight", [s.n_embd, s.n_embd], "Q4_K"),
                (p + "attn_k.weight", [s.n_embd, kv], "Q4_K"), (p + "attn_v.weight", [s.n_embd, kv], hi),
                (p + "attn_output.weight", [s.n_embd, s.n_embd], "Q4_K"), (p + "ffn_norm.weight", [s.n_embd], "F32"),
                (p + "ffn_gate.weight", [s.n_embd, s.n_ff], "Q4_K"), (p + "ffn_up.weight", [s.n_embd, s.n_ff], "Q4_K"),
                (p + "ffn_down.weight", [s.n_ff, s.n_embd], hi)]
    return out + [("output_norm.weight", [s.n_embd], "F32"), ("output.weight", [s.n_embd, s.n_vocab], "Q6_K")]


def random_tensor(name: str, ne: list[int], type_name: str, gen, device: str):
    """uint8 bytes of one tensor: norms 1.0 (F32), blocks of random bits whose float16 scales
    give the weights a standard deviation of 1/sqrt(row length)."""
    import torch
    from torchggml.types import Type, type_traits
    if type_name == "F32":
        return torch.ones(ne, dtype=torch.float32).numpy()
    tr = type_traits(Type[type_name])
    n_blocks = ne[0] * ne[1] // tr.blck_size
    blocks = torch.randint(0, 256, (n_blocks, tr.type_size), dtype=torch.uint8, device=device, generator=gen)
    d = 1.0 / (UNIT_STD[type_name] * ne[0] ** 0.5)
    for offset, factor in HALF_FIELDS[type_name]:
        half = torch.full((n_blocks,), d * factor, dtype=torch.float16, device=device)
        blocks[:, offset:offset + 2] = half.view(torch.uint8).view(n_blocks, 2)
    return blocks.cpu().numpy()


def write_llama(path: Path, s: Shape, device: str, seed: int = 0) -> Path:
    """A Q4_K_M Llama GGUF of random blocks (torchggml.gguf.writer.stream: no `gguf` needed), its
    bytes made on `device` ("cuda" makes an 8B file in seconds)."""
    import torch
    from torchggml.gguf.writer.stream import StreamWriter, kv_record
    from torchggml.types import Type, type_traits
    head_dim = s.n_embd // s.n_head
    a = "llama."
    kvs = [kv_record("general.architecture", "string", "llama"),
           kv_record("general.name", "string", f"gpu_check random llama {s.n_embd}x{s.n_layer} Q4_K_M"),
           kv_record("general.file_type", "uint32", 15),  # MOSTLY_Q4_K_M
           kv_record(a + "context_length", "uint32", 8192), kv_record(a + "embedding_length", "uint32", s.n_embd),
           kv_record(a + "block_count", "uint32", s.n_layer), kv_record(a + "feed_forward_length", "uint32", s.n_ff),
           kv_record(a + "attention.head_count", "uint32", s.n_head),
           kv_record(a + "attention.head_count_kv", "uint32", s.n_head_kv),
           kv_record(a + "rope.dimension_count", "uint32", head_dim),
           kv_record(a + "attention.layer_norm_rms_epsilon", "float32", 1e-5),
           kv_record(a + "rope.freq_base", "float32", 500000.0), kv_record(a + "vocab_size", "uint32", s.n_vocab),
           kv_record("tokenizer.ggml.model", "string", "none")]
    tensors = q4_k_m_tensors(s)

    def nbytes(ne, type_name):
        tr = type_traits(Type[type_name])
        return ne[0] * (ne[1] if len(ne) > 1 else 1) // tr.blck_size * tr.type_size

    tmp = path.with_suffix(".tmp")
    w = StreamWriter(tmp, kvs, [(n, ne, int(Type[t]), nbytes(ne, t)) for n, ne, t in tensors])
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, ne, type_name in tensors:
        w.write(random_tensor(name, ne, type_name, gen, device))
    w.close()
    os.replace(tmp, path)
    return path


def model_file(ctx: Ctx) -> Path:
    """The stage's model (made once per run, in the scratch folder)."""
    shape = ctx.shape
    path = ctx.work / f"llama-{shape.n_embd}x{shape.n_layer}-Q4_K_M.gguf"
    if not path.exists():
        write_llama(path, shape, "cpu" if ctx.sim else "cuda")
    return path


# ---------------------------------------------------------------- timing a model

def tokens(n: int, n_vocab: int, seed: int) -> list[int]:
    import torch
    return torch.randint(0, n_vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def decode(model, z: Sizes) -> tuple[float, object]:
    """Seconds per decode token over z.decode steps after a prompt and z.warm untimed steps, and
    the last step's logits."""
    model.reset()
    model.eval(tokens(z.prompt, model.n_vocab, seed=3), logits="last")
    steps = tokens(z.warm + z.decode, model.n_vocab, seed=1)
    for t in steps[:z.warm]:
        model.eval([t], logits="last")
    start = time.perf_counter()
    for t in steps[z.warm:]:
        logits = model.eval([t], logits="last")
    return (time.perf_counter() - start) / z.decode, logits


def prompt_rate(model, z: Sizes) -> float:
    """Tokens/s of a z.pp-token prompt (last logits only, as llama-bench), median of z.pp_reps
    after one untimed."""
    prompt = tokens(z.pp, model.n_vocab, seed=2)
    times = []
    for _ in range(z.pp_reps + 1):
        model.reset()
        start = time.perf_counter()
        model.eval(prompt, logits="last")
        times.append(time.perf_counter() - start)
    return z.pp / statistics.median(times[1:])


def batch_rate(model, n_seq: int, z: Sizes) -> float:
    """Tokens/s of decode steps of n_seq sequences in one batch, after their prompts (one batch)."""
    model.reset()
    ids = list(range(n_seq))
    model.eval_batch([tokens(z.prompt, model.n_vocab, seed=10 + s) for s in ids], ids, logits="last")
    rows = [tokens(z.warm + z.batch_steps, model.n_vocab, seed=20 + s) for s in ids]
    for j in range(z.warm):
        model.eval_batch([[r[j]] for r in rows], ids, logits="last")
    start = time.perf_counter()
    for j in range(z.warm, z.warm + z.batch_steps):
        model.eval_batch([[r[j]] for r in rows], ids, logits="last")
    return n_seq * z.batch_steps / (time.perf_counter() - start)


def plan_capture(model) -> dict:
    """How the last graph's splits ran: captured as a device graph, eager, or not a captured plan."""
    sched = model.last_graph.sched or model.sched
    kinds = {"captured": 0, "eager": 0, "compiled": 0}
    errors = []
    for split in sched.splits:
        plan = split.plan
        if plan is None or not hasattr(plan, "device_graph"):
            kinds["compiled"] += 1
        elif plan.device_graph is not None:
            kinds["captured"] += 1
        else:
            kinds["eager"] += 1
            if plan.capture_error:
                errors.append(plan.capture_error)
    return {**kinds, "errors": errors[:3]}


def profile(fn, trace: Path, cuda: bool):
    """Run fn under torch.profiler (CPU, and CUDA activity on a GPU); the chrome trace to `trace`."""
    import torch
    from torch.profiler import ProfilerActivity
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace))
    return json.loads(trace.read_text())


def intervals(trace: dict, keep) -> list[tuple[float, float]]:
    """Merged [start, end) microsecond intervals of the trace's complete events that `keep` accepts."""
    spans = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in trace.get("traceEvents", [])
                   if e.get("ph") == "X" and keep(e))
    merged = []
    for s, e in spans:
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged


def covered(spans) -> float:
    return sum(e - s for s, e in spans)


def overlap(a, b) -> float:
    """Microseconds where both merged interval lists are busy."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def is_kernel(e) -> bool:
    return e.get("cat") == "kernel"


def is_copy(e) -> bool:
    return e.get("cat") in ("gpu_memcpy", "gpu_memset")


def is_cpu_split(e) -> bool:
    return str(e.get("name", "")).startswith("ggml:split:CPU")


# ---------------------------------------------------------------- stage: model

MODEL_COLUMNS = {"decode_tok_s": "decode tok/s", "ms_per_token": "ms/token", "host_ms_per_token": "host ms/token",
                 "gpu_busy_ms": "GPU busy ms/token", "pp_tok_s": "prompt tok/s", "batch4_tok_s": "4 seqs tok/s",
                 "batch8_tok_s": "8 seqs tok/s"}


def stage_model(ctx: Ctx) -> Result:
    from torchggml.models.placement import find_device
    path = model_file(ctx)
    dev = find_device(ctx.device)
    can_capture = dev.graph_capture is not None
    runs = ["CUDA graphs", "no CUDA graphs"] if can_capture else ["no graph capture"]
    data, logits = {"file_mib": round(path.stat().st_size / 2**20), "graph_capture": can_capture}, {}
    for label in runs:
        data[label], logits[label] = measure_model(ctx, path, dev, graphs=label == "CUDA graphs",
                                                   full=label == runs[0], progress=lambda e: ctx.progress(
                                                       "model", {**data, label: e}))
    head = "| run | " + " | ".join(MODEL_COLUMNS.values()) + " | plans |\n|---|" + "---:|" * len(MODEL_COLUMNS) + "---|"
    rows = [f"| {label} | " + " | ".join(f"{data[label][c]:.2f}" if c in data[label] else "n/a" for c in MODEL_COLUMNS)
            + " | {captured} captured, {eager} eager, {compiled} compiled |".format(**data[label]["plans"])
            for label in runs]
    tables = ["\n".join([head, *rows]), "host ms/token: the part of a decode step the GPU was idle (the step's "
              "wall time less the GPU's busy time in a profiled run of the same steps)."]
    first = data[runs[0]]
    summary = f"{path.name} ({data['file_mib']} MiB): decode {first['decode_tok_s']:.1f} tok/s ({runs[0]})"
    if not can_capture:
        return Result("passed", summary + f" ({ctx.device} cannot capture device graphs)", data, tables)
    diff = data["graphs_vs_eager_max_abs_diff"] = float((logits[runs[0]] - logits[runs[1]]).abs().max())
    data["target_decode_400"] = first["decode_tok_s"] >= 400
    summary += f", {data[runs[1]]['decode_tok_s']:.1f} tok/s without; logits differ by at most {diff:.2g}"
    if first["plans"]["captured"] == 0:
        return Result("failed", summary, data, tables, reason=f"no plan was captured: {first['plans']['errors']}")
    return Result("passed", summary, data, tables)


def measure_model(ctx: Ctx, path: Path, dev, graphs: bool, full: bool, progress) -> tuple[dict, object]:
    """The model on ctx.device, its plans captured as device graphs or not: decode rate and the
    last step's logits; with `full` also host and GPU time per token, the prompt rate and batches.
    progress(entry) is called with each new figure."""
    from torchggml.models import load_model
    z = ctx.sizes
    if not graphs:
        dev.graph_capture = None  # this device object's plans compile without capture until restored
    try:
        model = load_model(path, devices=[ctx.device], n_ctx=z.n_ctx, n_seq_max=8, progress=False)
        try:
            per_token, logits = decode(model, z)
            entry = {"decode_tok_s": 1 / per_token, "ms_per_token": per_token * 1e3, "plans": plan_capture(model)}
            progress(entry)
            if full:
                gpu = gpu_busy_per_token(model, ctx)
                if gpu is not None:  # the part of a step the GPU waits for the host
                    entry.update(gpu_busy_ms=gpu * 1e3, host_ms_per_token=max(0.0, per_token - gpu) * 1e3)
                entry["pp_tok_s"], entry["prompt_tokens"] = prompt_rate(model, z), z.pp
                progress(entry)
                for n_seq in (4, 8):
                    entry[f"batch{n_seq}_tok_s"] = batch_rate(model, n_seq, z)
                    progress(entry)
        finally:
            model.close()
    finally:
        vars(dev).pop("graph_capture", None)  # back to the class's capability
    return entry, logits


def gpu_busy_per_token(model, ctx: Ctx) -> float | None:
    """Seconds per decode token that the GPU's kernels and copies kept it busy (a profiled run
    after the timed ones: the profiler slows the host, not the device); None without CUDA."""
    if ctx.sim:
        return None
    z = ctx.sizes
    steps = tokens(z.warm + z.profiled, model.n_vocab, seed=4)
    model.reset()
    model.eval(tokens(z.prompt, model.n_vocab, seed=3), logits="last")
    for t in steps[:z.warm]:
        model.eval([t], logits="last")

    def run():
        for t in steps[z.warm:]:
            model.eval([t], logits="last")
    trace = profile(run, ctx.work / "decode_trace.json", cuda=True)
    busy = intervals(trace, lambda e: is_kernel(e) or is_copy(e))
    return covered(busy) * 1e-6 / z.profiled


# ---------------------------------------------------------------- stage: mixed

WARM_DONE = "warm_cpu.done"


def warm_cpu(work: Path) -> None:
    """Compile the CPU kernels the mixed stage runs (Q4_K and Q6_K blocks read in place, a prompt
    and a decode step) on a tiny model. The parent starts this in the background at the start
    of the run, while the GPU stages leave the CPU idle: on the GPU machine's cold numba cache the
    mixed stage would otherwise spend its time compiling."""
    from torchggml.models import load_model
    path = write_llama(work / "warm-cpu.gguf", TINY, "cpu")
    model = load_model(path, devices=["CPU"], repack=False, n_ctx=64, progress=False)
    try:
        model.eval(tokens(2 * FULL_SIZES.prompt, model.n_vocab, seed=7), logits="last")
        model.eval([1], logits="last")
    finally:
        model.close()
    (work / WARM_DONE).write_text("done\n")


def wait_for_warm_cpu(ctx: Ctx, limit: float) -> bool:
    """Wait (at most `limit` seconds) for the background compile, so the two do not compile the
    same kernels side by side; True when it finished."""
    end = time.monotonic() + limit
    while not (ctx.work / WARM_DONE).exists() and time.monotonic() < end:
        time.sleep(0.5)
    return (ctx.work / WARM_DONE).exists()


def stage_mixed(ctx: Ctx) -> Result:
    from torchggml.models import load_model
    path = model_file(ctx)
    warm = wait_for_warm_cpu(ctx, ctx.left() / 3)
    shape, z = ctx.shape, ctx.sizes
    n_gpu = shape.n_layer // 2
    # the CPU's weights read in place (repack=False): a load without the repacking copy
    model = load_model(path, devices=[ctx.device], n_gpu_layers=n_gpu, n_ctx=z.n_ctx, repack=False, progress=False)
    try:
        per_token, _ = decode(model, dataclasses.replace(z, decode=max(1, z.decode // 4)))
        devices = sorted({d.get_name() for d in model.placement.devices})
        n_splits = len((model.last_graph.sched or model.sched).splits)

        def run():  # a prompt (its input rows cross between the devices) and a few decode steps
            model.reset()
            model.eval(tokens(2 * z.prompt, model.n_vocab, seed=5), logits="last")
            for t in tokens(min(3, z.profiled), model.n_vocab, seed=6):
                model.eval([t], logits="last")
        trace_path = ctx.work / "trace.json"
        trace = profile(run, trace_path, cuda=not ctx.sim)
    finally:
        model.close()
    with open(trace_path, "rb") as src, gzip.open(ctx.out / "trace.json.gz", "wb") as dst:
        dst.write(src.read())
    kernels, copies, cpu = (intervals(trace, k) for k in (is_kernel, is_copy, is_cpu_split))
    data = {"n_gpu_layers": n_gpu, "n_layer": shape.n_layer, "devices": devices, "splits_per_step": n_splits,
            "cpu_kernels_compiled_ahead": warm,
            "decode_tok_s": 1 / per_token, "kernel_ms": covered(kernels) / 1e3, "copy_ms": covered(copies) / 1e3,
            "copy_overlapping_kernels_ms": overlap(copies, kernels) / 1e3, "cpu_split_ms": covered(cpu) / 1e3,
            "cpu_split_overlapping_kernels_ms": overlap(cpu, kernels) / 1e3,
            "trace_mib": round((ctx.out / "trace.json.gz").stat().st_size / 2**20, 2)}
    table = "| what | value |\n|---|---|\n" + "\n".join(
        f"| {k} | {v:.2f} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in data.items())
    summary = (f"{n_gpu} of {shape.n_layer} layers on {ctx.device}, the rest on the CPU: decode "
               f"{data['decode_tok_s']:.2f} tok/s, {n_splits} splits a step; trace: copies "
               f"{data['copy_ms']:.1f} ms ({data['copy_overlapping_kernels_ms']:.1f} ms under kernels), CPU splits "
               f"{data['cpu_split_ms']:.1f} ms ({data['cpu_split_overlapping_kernels_ms']:.1f} ms under kernels)")
    if ctx.sim:
        summary += " (SIM: no CUDA activity in the trace)"
    return Result("passed", summary, data, [table])


# ---------------------------------------------------------------- stage: meta_dist

META_TOKENS = [1, 5, 9, 200, 3, 77, 40, 12, 0, 255, 128, 64]  # ids of TINY's vocabulary


def stage_meta_dist(ctx: Ctx) -> Result:
    import numpy as np
    import torch
    from torchggml.models import load_model
    path = ctx.work / "meta-llama-Q4_K_M.gguf"
    if not path.exists():
        write_llama(path, TINY, "cpu")
    out = ctx.work / "meta_logits.npy"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", "-m", "torchggml", "eval", str(path),
           "--tensor-parallel", "dist", "--tokens", ",".join(map(str, META_TOKENS)), "-o", str(out)]
    ran = run_limited(cmd, ctx.work / "meta_dist.log", ctx.left() - 15, ctx.env(OMP_NUM_THREADS="4"))
    if ran.returncode != 0:
        why = "stopped at its time limit" if ran.timed_out else f"torchrun exited {ran.returncode}"
        return Result("failed", reason=why, log_tail=ran.tail())
    # the rank's device: CUDA<local rank> with NCCL where torch has CUDA, else the CPU with gloo
    device, backend = ("CUDA0", "nccl") if torch.cuda.is_available() else ("CPU", "gloo")
    model = load_model(path, devices=[device], progress=False)
    try:
        ref = model.eval(META_TOKENS).numpy()
    finally:
        model.close()
    got = np.load(out)
    err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    data = {"process_group": backend, "device": device, "relative_l2": err}
    summary = f"Meta({device}) over {backend}, one process, vs {device} alone: relative L2 {err:.2e}"
    if ctx.sim:
        summary += " (SIM run: no CUDA here, so gloo on the CPU)"
    return Result("passed" if err <= 1e-3 else "failed", summary, data,
                  reason="" if err <= 1e-3 else f"relative L2 {err:.2e} > 1e-3")


# ---------------------------------------------------------------- the table of stages

@dataclasses.dataclass(frozen=True)
class Stage:
    fn: object
    budget: float  # seconds of the default 420 (scaled with --budget); what it leaves passes on
    what: str


STAGES = {
    "env": Stage(stage_env, 15, "versions, the device, copy bandwidth"),
    "pytest": Stage(stage_pytest, 110, "device tests, pass/fail per test"),
    "test_ops": Stage(stage_test_ops, 60, "torchggml test-ops on the device"),
    "bench_kernels": Stage(stage_bench_kernels, 60, "Triton matvec / GEMM against copy bandwidth and bf16"),
    "model": Stage(stage_model, 95, "Llama-3-8B-shaped Q4_K_M: decode, graphs, pp512, batches"),
    "mixed": Stage(stage_mixed, 55, "half the layers on the CPU, profiler trace"),
    "meta_dist": Stage(stage_meta_dist, 25, "meta device over torch.distributed, one process"),
}


def run_stage_here(name: str, ctx: Ctx) -> Result:
    """The child's side: run one stage, turning an exception into a failed result."""
    start = time.monotonic()
    try:
        result = STAGES[name].fn(ctx)
    except Exception as e:
        result = Result("failed", reason=f"{type(e).__name__}: {e}".splitlines()[0][:300],
                        log_tail="\n".join(traceback.format_exc().splitlines()[-TAIL_LINES:]))
    result.seconds = time.monotonic() - start
    return result


def run_stage_process(name: str, ctx: Ctx, deadline: float, argv_base: list[str]) -> Result:
    """The parent's side: the stage as a child process that must end by `deadline` (monotonic)."""
    left = deadline - time.monotonic()
    if left < 5:
        return skipped("the run's time budget was spent before this stage")
    result_path, partial_path = ctx.work / f"{name}.json", ctx.work / f"{name}.partial.json"
    result_path.unlink(missing_ok=True)
    partial_path.unlink(missing_ok=True)
    # the child aims to end `grace` seconds early (it then writes its result); it is killed at the
    # deadline. Its deadline crosses as wall-clock time (the processes' monotonic clocks differ).
    grace = min(10.0, left / 4)
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv_base, "--stage", name,
           "--deadline", str(time.time() + left - grace)]
    ran = run_limited(cmd, ctx.work / f"{name}.log", left, child_env(ctx.device))
    if result_path.exists():
        return Result(**json.loads(result_path.read_text()))
    why = (f"killed at its time limit ({left:.0f} s)" if ran.timed_out
           else f"the stage's process exited {ran.returncode} without a result")
    partial = json.loads(partial_path.read_text()) if partial_path.exists() else {}
    return Result("failed", reason=why, data={"partial": partial} if partial else {}, seconds=ran.seconds,
                  log_tail=ran.tail())


# ---------------------------------------------------------------- the report

def write_report(out: Path, meta: dict, results: dict[str, Result]) -> None:
    report = {**meta, "stages": {n: dataclasses.asdict(r) for n, r in results.items()}}
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    lines = [f"# torchggml GPU check: {meta['device']}", "",
             f"{meta['started']} UTC; torchggml at {meta['commit']}; budget {meta['budget_s']:.0f} s, "
             f"took {meta['seconds']:.0f} s{'; tiny shapes' if meta['tiny'] else ''}.", "",
             "| stage | status | seconds | summary |", "|---|---|---:|---|"]
    for name, r in results.items():
        text = r.summary or r.reason
        if r.status != "passed" and r.reason and r.summary:
            text = f"{r.summary} ({r.reason})"
        lines.append(f"| {name} | {r.status} | {r.seconds:.0f} | {text.replace('|', '/')} |")
    for name, r in results.items():
        lines += ["", f"## {name}: {STAGES[name].what}", ""]
        if r.status == "skipped":
            lines.append(f"Skipped: {r.reason}")
        for t in r.tables:
            lines += [t, ""]
        if r.log_tail:
            lines += ["Last lines:", "", "```", r.log_tail, "```"]
    (out / "report.md").write_text("\n".join(lines) + "\n")


def start_warm_cpu(argv_base: list[str], device: str, work: Path):
    """warm_cpu in a background process of its own group (stop_warm_cpu ends it)."""
    log = open(work / "warm_cpu.log", "w")
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *argv_base, "--warm-cpu"], stdout=log,
                            stderr=subprocess.STDOUT, env=child_env(device), cwd=ROOT, start_new_session=True)
    return proc, log


def stop_warm_cpu(warm) -> str:
    if warm is None:
        return "not run"
    proc, log = warm
    code = proc.poll()
    if code is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    log.close()
    if code is None:
        return "still compiling at the end: stopped"
    tail = (Path(log.name).read_text(errors="replace").strip().splitlines() or [""])[-1]
    return "finished" if code == 0 else f"exited {code}: {tail}"


def commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        device = check_device(args.device)
        names = check_stages(args.stages)
        if args.budget <= 0:
            raise UsageError(f"--budget {args.budget:g}: expected a positive number of seconds")
        out = Path(args.out)
        if out.exists() and not out.is_dir():
            raise UsageError(f"--out {out}: exists and is not a folder")
    except UsageError as e:
        print(f"gpu_check.py: {e}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    tiny = args.tiny or is_sim(device)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="gpu_check-"))
    work.mkdir(parents=True, exist_ok=True)

    if args.warm_cpu:
        warm_cpu(work)
        return 0
    if args.stage:  # a child: one stage, its result as JSON in the scratch folder
        deadline = time.monotonic() + (args.deadline - time.time() if args.deadline else args.budget)
        result = run_stage_here(args.stage, Ctx(device, tiny, out, work, deadline))
        (work / f"{args.stage}.json").write_text(json.dumps(dataclasses.asdict(result), default=str))
        return 0

    start, started = time.monotonic(), time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    scale = args.budget / sum(STAGES[n].budget for n in names)  # the chosen stages share the whole budget
    argv_base = ["--out", str(out), "--device", device, "--work", str(work), "--budget", str(args.budget)]
    argv_base += ["--tiny"] if tiny else []
    ctx = Ctx(device, tiny, out, work, start + args.budget)
    warm = start_warm_cpu(argv_base, device, work) if "mixed" in names else None
    results, cumulative = {}, 0.0
    for name in names:
        cumulative += STAGES[name].budget * scale
        deadline = min(start + cumulative, start + args.budget)
        print(f"[gpu_check] {name}: {STAGES[name].what} (until +{deadline - start:.0f} s)", flush=True)
        results[name] = run_stage_process(name, ctx, deadline, argv_base)
        r = results[name]
        print(f"[gpu_check] {name}: {r.status} in {r.seconds:.0f} s: {r.summary or r.reason}", flush=True)
    meta = {"device": device, "tiny": tiny, "started": started, "commit": commit(), "budget_s": args.budget,
            "seconds": time.monotonic() - start, "cpu_warmup": stop_warm_cpu(warm)}
    write_report(out, meta, results)
    if not args.work:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    print(f"[gpu_check] wrote {out / 'report.md'} and {out / 'report.json'}", flush=True)
    return 1 if any(r.status == "failed" for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
