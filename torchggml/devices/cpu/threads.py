"""The CPU backend's thread policy: how many of its threads a plan's compute uses, chosen from
what each count achieves on this machine now (TORCHGGML_CPU_THREADS=fixed always uses them all).

The threads of a compute (torch's OpenMP team and numba's, which share it) meet at a barrier
after every parallel region, so a compute runs at the pace of its slowest thread: where another
busy process shares a core with one of them, that thread gets half the core in slices of
milliseconds and a decode step, hundreds of regions, waits on it every time (OpenMP's spinning
workers make it worse: the scheduler counts their spinning as work). One thread fewer then
runs faster than all of them. So each plan (a decode step's graph, a prompt micro-batch's)
keeps the time a compute took at the thread counts it has tried, runs at the fastest, and now
and then tries a neighbouring count (one more, one less), at once when a compute took much
longer than usual (the machine got busy), less often while the other count keeps losing. A new
plan starts at the count the latest move chose (a prompt after decode has learnt the machine)
and tries a neighbour right after its first timed compute. A due trial of fewer threads waits
MAX_INTERVAL computes instead where no other program is runnable (others_running): on a machine
the process has to itself all the threads win, and each trial is a slower compute. A compute
much slower than usual is a trial at once whatever the count says.
"""
from __future__ import annotations

import os

from ... import config

POLICY_ENV = "TORCHGGML_CPU_THREADS"
WARMUP = 1          # a plan's first compute (compiling, first touches) is not timed
MIN_INTERVAL = 8    # computes between trials of another count, doubled while trials lose
MAX_INTERVAL = 256
SLOWER = 1.5        # a compute this much slower than its count's usual time: try another at once
AVERAGE = 0.25      # weight of a new time in a count's running average


def adaptive() -> bool:
    """Whether the backend picks its thread count per plan (TORCHGGML_CPU_THREADS: adaptive, the
    default, or fixed)."""
    policy = config.value(POLICY_ENV).lower()
    if policy not in ("adaptive", "fixed"):
        raise ValueError(f"{POLICY_ENV}={policy!r}: expected adaptive or fixed")
    return policy == "adaptive"


def _running(stat: str) -> bool:
    """A /proc/<pid>/task/<tid>/stat text's state is R (after the name's closing parenthesis)."""
    return stat[stat.rindex(")") + 2] == "R"


def others_running() -> int | None:
    """Threads of other programs runnable now: /proc/loadavg's running count less this process's
    running threads (its OpenMP workers spin as R between parallel regions); None where /proc
    cannot tell."""
    try:
        with open("/proc/loadavg") as f:
            total = int(f.read().split()[3].split("/")[0])
        own = 0
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    own += _running(f.read())
            except OSError:  # a thread that ended meanwhile
                pass
        return max(total - own, 0)
    except (OSError, IndexError, ValueError):
        return None


class _PlanTimes:
    def __init__(self, n: int):
        self.n = n                        # the count computes run at
        self.times: dict[int, float] = {}  # count -> running average of a compute's seconds
        self.computes = 0
        self.interval = MIN_INTERVAL
        self.next_trial = WARMUP + 2  # its first trial right after its first timed compute
        self.down = True                  # the next trial's direction
        self.slower = False               # the latest compute took much longer than usual


class ThreadTuner:
    """Thread counts per plan for a backend of up to n_max threads. others: fn() -> the other
    programs' runnable threads now, or None (unknown: trials as on a busy machine)."""

    def __init__(self, n_max: int, others=None):
        self.n_max = n_max
        self.others = others or others_running
        self.plans: dict[int, _PlanTimes] = {}
        self.last = n_max  # the count the latest move chose: a new plan starts there

    def choose(self, key: int) -> int:
        """The count the plan's next compute runs at."""
        p = self.plans.get(key)
        if p is None:
            if len(self.plans) > 64:  # many plans seen (a changing graph): start over
                self.plans.clear()
            p = self.plans[key] = _PlanTimes(self.last)
        p.computes += 1
        if p.computes < p.next_trial or self.n_max == 1 or p.n not in p.times:  # (nothing to compare yet)
            return p.n
        trial = p.n - 1 if (p.down and p.n > 1) or p.n == self.n_max else p.n + 1
        if trial < p.n and not p.slower and self.others() == 0:  # a quiet machine: all the threads win
            if p.n == self.n_max:
                p.next_trial = p.computes + MAX_INTERVAL
                return p.n
            trial = p.n + 1
        p.down = not p.down
        return trial

    def record(self, key: int, n: int, seconds: float) -> None:
        p = self.plans[key]
        if p.computes <= WARMUP:
            return
        usual = p.times.get(n)
        if n != p.n:  # a trial (its count's time now, not an older one): move where it won
            p.times[n] = seconds
            if seconds < p.times[p.n]:
                p.n, p.interval, self.last = n, MIN_INTERVAL, n
            else:
                p.interval = min(2 * p.interval, MAX_INTERVAL)
            p.next_trial = p.computes + p.interval
            return
        p.times[n] = seconds if usual is None else (1 - AVERAGE) * usual + AVERAGE * seconds
        p.slower = usual is not None and seconds > SLOWER * usual
        if p.slower:
            p.next_trial = p.computes + 1  # the machine changed: look again now

