"""The CPU backend's thread policy (devices/cpu/threads.py): each plan runs at the thread
count that has been fastest, trying its neighbours now and then and at once when the machine
changes."""
from __future__ import annotations

import pytest
import torch

import torchggml as ggml
from torchggml.devices.cpu import threads
from test_cpu_quant import random_blocks


def run(tuner, seconds_at, computes, key=1):
    """The counts `computes` computes of one plan ran at, each taking seconds_at(i, n)."""
    counts = []
    for i in range(computes):
        n = tuner.choose(key)
        counts.append(n)
        tuner.record(key, n, seconds_at(i, n))
    return counts


BUSY, QUIET = (lambda: 1), (lambda: 0)  # other programs' runnable threads, as threads.others_running says

# (case, n_max, seconds of a compute at n threads (compute i), the count most computes end at,
# other programs' runnable threads)
MACHINES = [
    ("quiet: every thread wins", 2, lambda i, n: 1.0 / n, 2, QUIET),
    ("others run, every thread still wins", 2, lambda i, n: 1.0 / n, 2, BUSY),
    ("unknown load, every thread wins", 2, lambda i, n: 1.0 / n, 2, lambda: None),
    ("one core busy: one thread fewer wins", 2, lambda i, n: 1.0 if n == 1 else 8.0, 1, BUSY),
    ("4 threads, one core busy", 4, lambda i, n: {4: 9.0, 3: 0.4, 2: 0.5, 1: 1.0}[n], 3, BUSY),
    ("one thread: nothing to choose", 1, lambda i, n: 1.0, 1, BUSY),
]


@pytest.mark.parametrize("name,n_max,seconds_at,settles_at,others", MACHINES, ids=[m[0] for m in MACHINES])
def test_each_plan_settles_at_the_fastest_count(name, n_max, seconds_at, settles_at, others):
    counts = run(threads.ThreadTuner(n_max, others), seconds_at, 600)
    assert counts[:threads.WARMUP] == [n_max] * threads.WARMUP  # untimed start at n_threads
    tail = counts[300:]
    assert tail.count(settles_at) >= len(tail) - len(tail) // threads.MAX_INTERVAL * 2 - 2, tail
    # trials of the losing neighbours thin out to one in MAX_INTERVAL each way
    assert sum(n != settles_at for n in tail) <= 2 * (len(tail) // threads.MAX_INTERVAL + 1)


# (case, seconds at n threads before compute 100 and from it on, the count after the change)
CHANGES = [
    ("another program takes a core", lambda n: 1.0 / n, lambda n: 1.0 if n == 1 else 8.0, 1),
    ("the core is free again", lambda n: 1.0 if n == 1 else 8.0, lambda n: 1.0 / n, 2),
]


@pytest.mark.parametrize("name,before,after,then", CHANGES, ids=[c[0] for c in CHANGES])
def test_a_changed_machine_moves_the_count(name, before, after, then):
    counts = run(threads.ThreadTuner(2, BUSY), lambda i, n: before(n) if i < 100 else after(n), 400)
    settle = counts[100:].index(then)
    if name.startswith("another"):  # a much slower compute: the other count is tried at once
        assert settle <= 2, counts[100:110]
    else:  # found by the next trial, within MAX_INTERVAL
        assert settle <= threads.MAX_INTERVAL + 1
    assert counts[100 + settle + 1:].count(then) > 0.9 * len(counts[100 + settle + 1:])


def test_a_new_plan_starts_at_the_count_the_machine_taught():
    """A prompt's plan after decode moved to one thread starts there, not at n_threads."""
    tuner = threads.ThreadTuner(2, BUSY)
    run(tuner, lambda i, n: 1.0 if n == 1 else 8.0, 20, key=1)
    assert run(tuner, lambda i, n: 1.0 if n == 1 else 8.0, 3, key=2)[0] == 1


def test_plans_are_timed_apart():
    """A prompt's plan and a decode step's keep their own times and counts."""
    tuner = threads.ThreadTuner(2, BUSY)
    decode = run(tuner, lambda i, n: 1.0 if n == 1 else 8.0, 100, key=1)
    prompt = run(tuner, lambda i, n: 1.0 / n, 100, key=2)
    assert decode[-1] == 1 and prompt[-1] == 2


# (case, n_max, other programs' runnable threads at each compute, seconds at n threads, the
# most computes (of 600) at fewer than the count the plan settles at, that count)
QUIET_CASES = [
    ("quiet: a trial of fewer threads every MAX_INTERVAL", 2, lambda i: 0, lambda i, n: 1.0 / n, 600 // 256 + 1, 2),
    ("a program starts at compute 300: found at once", 2, lambda i: 0 if i < 300 else 1,
     lambda i, n: 1.0 / n if i < 300 else (1.0 if n == 1 else 8.0), 302, 1),
    ("quiet after a move down: tries more threads", 4, lambda i: 1 if i < 50 else 0,
     lambda i, n: {4: 9.0, 3: 0.4, 2: 0.5, 1: 1.0}[n] if i < 50 else 1.0 / n, 50 + 2 * 256, 4),
]


@pytest.mark.parametrize("name,n_max,others_at,seconds_at,most_fewer,settles_at", QUIET_CASES,
                         ids=[c[0] for c in QUIET_CASES])
def test_a_quiet_machine_skips_trials_of_fewer_threads(name, n_max, others_at, seconds_at, most_fewer, settles_at):
    """Where no other program is runnable, trials of fewer threads (each a slower compute) wait
    MAX_INTERVAL computes, and a count below n_max tries more threads; a compute much slower
    than usual is still a trial at once."""
    at = [0]
    tuner = threads.ThreadTuner(n_max, lambda: others_at(at[0]))
    counts = []
    for i in range(600):
        at[0] = i
        n = tuner.choose(1)
        counts.append(n)
        tuner.record(1, n, seconds_at(i, n))
    assert sum(n < settles_at for n in counts) <= most_fewer, counts
    assert counts[-1] == settles_at


def test_others_running_reads_proc():
    """others_running counts the machine's runnable threads but this process's own (a number,
    or None where /proc is not there)."""
    seen = threads.others_running()
    assert seen is None or seen >= 0
    assert threads._running("12 (py (x) y) R 1 2") and not threads._running("12 (python) S 1 2")


@pytest.mark.parametrize("value,adaptive", [("", True), ("adaptive", True), ("fixed", False), ("FIXED", False),
                                            ("spin", ValueError)])
def test_policy_is_chosen_by_the_environment(value, adaptive, monkeypatch):
    monkeypatch.setenv("TORCHGGML_CPU_THREADS", value)
    if adaptive is ValueError:
        with pytest.raises(ValueError, match="TORCHGGML_CPU_THREADS"):
            threads.adaptive()
        return
    assert threads.adaptive() is adaptive
    backend = ggml.backend_cpu_init()
    assert (backend.tuner is not None) is adaptive


@pytest.mark.parametrize("rows", [1, 9], ids=["matvec", "int8-gemm"])
def test_plan_computes_run_at_the_chosen_count_with_the_same_results(rows, monkeypatch):
    """The backend sets torch's (and numba's) threads to the tuner's choice for each plan compute,
    and the quantized products do not depend on it (each row's dot on one thread; torch's own
    float GEMMs may split their sums by thread count)."""
    monkeypatch.setenv("TORCHGGML_CPU_THREADS", "adaptive")
    monkeypatch.setattr(threads, "MIN_INTERVAL", 1)  # a trial after every compute
    monkeypatch.setattr(threads, "MAX_INTERVAL", 1)
    monkeypatch.setattr(threads, "others_running", BUSY)  # the trials run on a quiet machine too
    before = torch.get_num_threads()
    backend = ggml.backend_cpu_init()
    ggml.backend_cpu_set_n_threads(backend, 2)
    ctx = ggml.init(mem_size=1 << 20, no_alloc=True)
    a = ggml.new_tensor_2d(ctx, ggml.Type.Q4_0, 256, 64)
    b = ggml.new_tensor_2d(ctx, ggml.Type.F32, 256, rows)
    out = ggml.mul_mat(ctx, a, b)
    graph = ggml.new_graph(ctx)
    ggml.build_forward_expand(graph, out)
    buf = ggml.backend_alloc_ctx_tensors(ctx, backend)
    ggml.backend_tensor_set(a, random_blocks(ggml.Type.Q4_0, 64, 256, seed=0).numpy())
    ggml.backend_tensor_set(b, torch.randn(rows, 256, generator=torch.Generator().manual_seed(1)))
    plan = ggml.backend_graph_plan_create(backend, graph)
    seen, results = [], []
    for _ in range(8):
        assert ggml.backend_graph_plan_compute(backend, plan) == ggml.Status.SUCCESS
        seen.append(torch.get_num_threads())
        results.append(torch.as_tensor(ggml.backend_tensor_get(out)).clone())
    ggml.backend_graph_plan_free(backend, plan)
    ggml.backend_buffer_free(buf)
    ggml.backend_cpu_set_n_threads(backend, before)
    assert set(seen) == {1, 2}, seen
    assert all(torch.equal(r, results[0]) for r in results)
