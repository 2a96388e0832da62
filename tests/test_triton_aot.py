"""GPU readiness without a GPU: every Triton kernel and autotune config in torchggml.devices.triton/
compiled ahead of time for sm_80 and sm_90 (triton.compile with an explicit GPUTarget and the
ptxas of Triton's wheel), failing on a register spill or on shared memory over the
architecture's limit (scripts/aot_report.py, in a process without TRITON_INTERPRET).

One weight type and the fp32-activation variants by default, to keep the suite fast
(TORCHGGML_AOT_TYPES: a comma-separated list, or "all"; TORCHGGML_AOT_X_DTYPES=fp32,bf16 adds
the bf16 tensor-core variants, same configs)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TYPES = os.environ.get("TORCHGGML_AOT_TYPES", "Q4_K")
X_DTYPES = os.environ.get("TORCHGGML_AOT_X_DTYPES", "fp32")


def test_every_kernel_and_config_compiles_for_sm80_and_sm90_without_spills():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "aot_report.py"), "--types", TYPES,
                           "--arch", "80,90", "--x-dtypes", X_DTYPES, "-j", "2"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=1200)
    if proc.returncode == 3:  # no compiler toolchain in this triton: say why
        pytest.skip(proc.stderr.strip())
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-2000:]
    summary = re.search(r"(\d+) compilations .* (\d+) failed to compile, (\d+) over a limit", out)
    assert summary and summary.group(2) == "0" and summary.group(3) == "0", out[-2000:]
    for kernel in ("dequantize_rows", "matvec", "gemm", "mul_mat_id"):
        for arch in (80, 90):
            assert re.search(rf"^{kernel}\s+sm_{arch}\s+\d+", out, re.M), f"{kernel} sm_{arch} missing"
    assert int(summary.group(1)) >= 2 * 40  # every config of the four kernels, for both targets


def test_specs_cover_every_autotune_config():
    """The AOT list holds each kernel's configs (after the wrappers' pruning) for each variant."""
    code = ("from torchggml.devices.triton import aot, matmul, dequant; from torchggml.types import Type;"
            "s = aot.specs([Type.Q4_0]);"
            "n = lambda k: sum(1 for x in s if x.kernel == k);"
            "print(n('dequantize_rows'), n('matvec'), n('gemm'), n('mul_mat_id'),"
            " len(dequant._dequantize_rows_kernel.configs), len(matmul._gemm_kernel.configs),"
            " len(matmul._matvec_kernel.configs))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    dq, mv, gemm, mmid, n_dq, n_gemm, n_mv = map(int, proc.stdout.split())
    assert dq == 2 * n_dq            # dequantize and get_rows
    assert gemm == 2 * n_gemm        # fp16 and bf16 tensor-core operands
    assert mmid == n_mv              # one program per row: every matvec config
    assert n_mv < mv <= 3 * n_mv     # M == 1 (all) and M = 2..16 (those tl.dot takes), fp32 and bf16
