"""OpenMP's wait policy chosen at import (torchggml/openmp.py): PASSIVE where the process starts on
a busy machine, the runtime's default elsewhere, the user's own settings always kept."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchggml import openmp

# (TORCHGGML_OMP_WAIT, the environment, 1-minute load, CPUs, runtime loaded, the policy set)
CASES = [
    ("", {}, 0.1, 2, False, None),                           # quiet: OpenMP's default
    ("auto", {}, 1.0, 2, False, "PASSIVE"),                  # one busy program on two CPUs
    ("", {}, 3.0, 16, False, None),                          # a few on sixteen
    ("", {}, 12.0, 16, False, "PASSIVE"),
    ("passive", {}, 0.0, 2, False, "PASSIVE"),
    ("default", {}, 9.0, 2, False, None),
    ("", {"OMP_WAIT_POLICY": "ACTIVE"}, 9.0, 2, False, None),  # the user's choice stands
    ("passive", {"GOMP_SPINCOUNT": "10000"}, 9.0, 2, False, None),
    ("", {}, 9.0, 2, True, None),                            # torch imported first: too late
]


@pytest.mark.parametrize("choice,environ,load,cpus,loaded,policy", CASES)
def test_wait_policy(choice, environ, load, cpus, loaded, policy):
    assert openmp.wait_policy(choice, environ, load, cpus, loaded) == policy


@pytest.mark.parametrize("samples, others", [
    (["0.10 0.20 0.30 1/80 100"] * 5, 0.0),                    # only this process
    (["2.00 1.50 1.00 2/80 100"] * 5, 1.0),                    # one busy program beside it
    (["2.00 1.50 1.00 1/80 100"] * 3 + ["2.00 1.50 1.00 4/80 100"] * 2, 0.0),  # the median
    (["0.00 0.00 0.00 0/80 100"], 0.0),                        # never below zero
])
def test_runnable_others(samples, others):
    assert openmp.runnable_others(samples) == others


def test_a_busy_program_is_seen_now():
    """A spinning program beside this one counts at once (the 1-minute average lags a minute
    after one ends, which left a quiet start under the busy policy)."""
    if not os.path.exists("/proc/loadavg"):
        pytest.skip("no /proc/loadavg on this system")
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        import time
        time.sleep(0.5)
        samples = [open("/proc/loadavg").read() for _ in range(5)]
        assert openmp.runnable_others(samples) >= 1, samples
    finally:
        spin.kill()
        spin.wait()


def test_a_bad_choice_names_the_variable():
    with pytest.raises(ValueError, match="TORCHGGML_OMP_WAIT"):
        openmp.wait_policy("spin", {}, 0.0, 2, False)


def test_import_sets_it_before_torch_loads():
    """`import torchggml` in a fresh process with TORCHGGML_OMP_WAIT=passive sets the policy before
    torch loads (the face loads torch on first use of a name): its OpenMP runtime reads PASSIVE."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(TORCHGGML_OMP_WAIT="passive", PYTHONPATH=str(Path(__file__).parents[1]))
    code = ("import sys, os, torchggml; print(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules); "
            "torchggml.Type; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["PASSIVE", "False", "True"], out.stderr[-2000:]


def test_float_products_are_the_same_at_any_thread_count():
    """torch's F32 GEMMs (MKL) give the bits of one thread at two after `import torchggml`
    (MKL_CBWR set at import): threads.py changes the count between computes on a busy machine."""
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    env.update(PYTHONPATH=str(Path(__file__).parents[1]))
    code = ("import torchggml, torch\n"
            "torch.manual_seed(0)\n"
            "same = []\n"
            "for m, k, n in [(9, 256, 768), (9, 768, 256), (128, 576, 1536)]:\n"
            "    a, b = torch.randn(m, k), torch.randn(n, k)\n"
            "    r = []\n"
            "    for t in (1, 2):\n"
            "        torch.set_num_threads(t); r.append(a @ b.T)\n"
            "    same.append(torch.equal(*r))\n"
            "print(same)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["[True,", "True,", "True]"], out.stderr[-2000:]
