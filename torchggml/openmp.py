"""OpenMP's wait policy, chosen before torch loads its OpenMP runtime (torchggml/__init__.py
calls apply() first): the runtime reads OMP_WAIT_POLICY once, when it loads.

OpenMP's default (workers spin a while between parallel regions, then sleep) is the faster one
on a machine the process has to itself. On a busy machine the spinning workers compete for the
cores with the other programs, and the scheduler counts their spinning as work, so the thread
every barrier waits on is often not running: decode and prompts fell to a small fraction of
their speed, where OMP_WAIT_POLICY=PASSIVE (workers sleep at once) kept them. So with
TORCHGGML_OMP_WAIT=auto (the default), a process that starts on a busy machine (other programs
runnable on half its CPUs or more, both now and in the 1-minute load average: the average alone
still counts a minute after a busy program ended) sleeps its workers at once; a quiet one keeps the runtime's
default, and the CPU backend's thread counts (devices/cpu/threads.py) handle load that comes
later. The user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT always stands, and so does the policy
of a runtime already loaded (torch imported before torchggml).

The same start sets MKL_CBWR=AUTO,STRICT where the user has not set it: MKL's float GEMMs (torch's
products of F32 and BF16 rows on the CPU) then give the same bits at any thread count, as ggml's
CPU products do. Without it a plan's result changed with the thread count threads.py picks on a
busy machine. MKL reads it at its first call (a torch import before torchggml's is still in time).
"""
from __future__ import annotations

import os
import sys

from . import config

ENV = "TORCHGGML_OMP_WAIT"
REPRODUCIBLE_MKL = "AUTO,STRICT"
BUSY_LOAD = 0.5  # a 1-minute load average of this many runnable programs per CPU or more: busy


def wait_policy(choice: str, environ, load: float, cpus: int, runtime_loaded: bool) -> str | None:
    """The OMP_WAIT_POLICY to set ("PASSIVE"), or None to leave the environment as it is, for
    TORCHGGML_OMP_WAIT's text `choice`."""
    choice = (choice or "auto").strip().lower()
    if choice not in ("auto", "passive", "default"):
        raise ValueError(f"{ENV}={choice!r}: expected auto, passive or default")
    if choice == "default" or runtime_loaded or "OMP_WAIT_POLICY" in environ or "GOMP_SPINCOUNT" in environ:
        return None
    return "PASSIVE" if choice == "passive" or load >= BUSY_LOAD * cpus else None


def runnable_others(samples: list[str]) -> float:
    """Other programs runnable now, from /proc/loadavg texts ("0.52 0.41 0.30 3/812 4242": the
    fourth field's running count includes this process): the median over the samples."""
    counts = sorted(int(text.split()[3].split("/")[0]) - 1 for text in samples)
    return float(max(counts[len(counts) // 2], 0))


def _load_seen() -> float:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    try:
        samples = []
        for _ in range(5):
            with open("/proc/loadavg") as f:
                samples.append(f.read())
        return min(load, runnable_others(samples))
    except (OSError, IndexError, ValueError):
        return load


def apply() -> None:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    load = _load_seen()
    policy = wait_policy(config.text(ENV), os.environ, load, cpus, "torch" in sys.modules)
    if policy is not None:
        os.environ["OMP_WAIT_POLICY"] = policy
    os.environ.setdefault("MKL_CBWR", REPRODUCIBLE_MKL)
