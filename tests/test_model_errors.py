"""A model's misuse answered with a named error: options and sampling values out of range, token ids
that are not one sequence of integers, a KV cache too large, threads interleaving one sequence,
non-finite logits, use after free or close."""
from __future__ import annotations

import gc
import math
import os
import threading
from pathlib import Path

import pytest
import torch

import torchggml as ggml
from torchggml.backend.buffer import BufferFreedError
from torchggml.models import load_model
from torchggml.models.model import FINITE_CHECK_VALUES, ModelClosedError, NonFiniteLogitsError, all_finite
from torchggml.models.sequences import InterleavedSequenceError
from test_sched import _sim_available

T = ggml.Type
ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(os.environ.get("TORCHGGML_GOLDEN", ROOT.parent / "shared" / "golden"))

F32_MODEL = GOLDEN / "models" / "llama-F32.gguf"

Q4_MODEL = GOLDEN / "models" / "llama-Q4_0.gguf"

needs_golden = pytest.mark.skipif(not F32_MODEL.exists(), reason=f"golden models not found at {GOLDEN}")

TOKENS = [1, 5, 9, 200, 3, 77, 400, 12]


@pytest.fixture(scope="module")
def golden_model():
    if not F32_MODEL.exists():
        pytest.skip(f"golden models not found at {GOLDEN}")
    model = load_model(F32_MODEL, n_ctx=64, progress=False)
    yield model
    model.close()


def _fresh_logits(model, *batches):
    with model.lock:
        model.reset()
        return [model.eval(b) for b in batches]


@pytest.fixture(scope="module")
def demo_model():
    from torchggml.gguf.writer.demo import demo_model_path
    model = load_model(demo_model_path(), n_ctx=64, progress=False)
    yield model
    model.close()


def test_two_threads_sharing_a_model_get_the_single_thread_results(demo_model):
    m = demo_model
    prompts = [TOKENS[:5], TOKENS[2:], [7, 8, 9]]
    single_eval = [_fresh_logits(m, p) for p in prompts]
    single_gen = [list(m.generate(p, max_tokens=4, temperature=0)) for p in prompts]
    results, errors = [], []

    def worker(k):
        try:
            for i in range(6):
                j = (k + i) % len(prompts)
                if (k + i) % 2:
                    results.append((_fresh_logits(m, prompts[j]), single_eval[j]))
                else:
                    results.append((list(m.generate(prompts[j], max_tokens=4, temperature=0)), single_gen[j]))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 12
    for got, want in results:
        if isinstance(want, list) and want and isinstance(want[0], torch.Tensor):
            assert all(torch.equal(g, w) for g, w in zip(got, want))
        else:
            assert got == want


@needs_golden
def test_reset_zeroes_the_cells_so_old_values_cannot_leak(golden_model):
    m = golden_model
    (want,) = _fresh_logits(m, TOKENS[:3])
    m.reset()
    m.eval(TOKENS)
    for t in (*m.memory.k, *m.memory.v):  # NaN in every written cell, as a failed batch would leave them
        ggml.backend_tensor_memset(t, 0xFF, 0, len(TOKENS) * t.nb[1])
    m.reset()
    got = m.eval(TOKENS[:3])
    assert torch.equal(got, want)  # masked cells are read too: they must be zero


@needs_golden
@pytest.mark.parametrize("new", [TOKENS[4:], TOKENS[4:5]], ids=["batch", "decode step"])
def test_non_finite_logits_raise_and_leave_the_cache_as_it_was(golden_model, new):
    m = golden_model
    want = _fresh_logits(m, TOKENS[:4], new)
    norm = m.weights.layers[0].attn_norm
    saved = ggml.backend_tensor_get(norm).clone()
    m.reset()
    m.eval(TOKENS[:4])
    ggml.backend_tensor_set(norm, torch.full_like(saved, float("nan")))  # NaN into layer 0's K/V
    try:
        with pytest.raises(NonFiniteLogitsError, match=r"llama-F32\.gguf: eval produced non-finite logits "
                                                        r"\(first at token 0, position 4\); the cache was "
                                                        r"restored to 4 tokens"):
            m.eval(new)
        assert m.n_past == 4
        written = [ggml.backend_tensor_get(t)[4: 4 + len(new)] for t in m.memory.k]
        assert not any(bool(rows.any()) for rows in written)  # the cells it wrote (NaN) are zeroed
    finally:
        ggml.backend_tensor_set(norm, saved)
    assert torch.equal(m.eval(new), want[1])  # the NaN cells were zeroed


@pytest.mark.parametrize("size, bad_at, bad", [(0, None, None), (7, None, None), (7, 6, float("nan")),
                                               (FINITE_CHECK_VALUES + 3, None, None),
                                               (FINITE_CHECK_VALUES + 3, FINITE_CHECK_VALUES - 1, float("inf")),
                                               (FINITE_CHECK_VALUES + 3, FINITE_CHECK_VALUES, float("-inf")),
                                               (FINITE_CHECK_VALUES + 3, FINITE_CHECK_VALUES + 2, float("nan"))])
def test_all_finite_checks_every_slice(size, bad_at, bad):
    """The logits' check goes a slice of FINITE_CHECK_VALUES at a time (no mask as large as a
    micro-batch's logits): a bad value on either side of a slice boundary is found."""
    import numpy as np
    values = np.ones(size, np.float32)
    if bad_at is not None:
        values[bad_at] = bad
    assert all_finite(values.reshape(1, -1)) == (bad_at is None)


def _freed_tensor():
    ctx = ggml.init(no_alloc=True)
    t = ggml.set_name(ggml.new_tensor_1d(ctx, T.F32, 8), "t")
    buf = ggml.backend_alloc_ctx_tensors(ctx, ggml.backend_cpu_init())
    ggml.backend_tensor_set(t, torch.arange(8.0))
    view = ggml.to_torch(t)
    ggml.backend_buffer_free(buf)
    return t, buf, view


USE_AFTER_FREE = [
    ("set", lambda t, buf: ggml.backend_tensor_set(t, torch.zeros(8)), r"backend_tensor_set: .*'t'.* freed"),
    ("get", lambda t, buf: ggml.backend_tensor_get(t), r"backend_tensor_get: .*'t'.* freed"),
    ("memset", lambda t, buf: ggml.backend_tensor_memset(t, 0), r"backend_tensor_memset: .*freed"),
    ("to_torch", lambda t, buf: ggml.to_torch(t), r"tensor view: .*'t'.* freed"),
    ("clear", lambda t, buf: ggml.backend_buffer_clear(buf, 0), r"backend_buffer_clear: buffer .* freed"),
]


@pytest.mark.parametrize("use,pattern", [u[1:] for u in USE_AFTER_FREE], ids=[u[0] for u in USE_AFTER_FREE])
def test_use_after_free_raises_a_named_error(use, pattern):
    t, buf, _ = _freed_tensor()
    with pytest.raises(BufferFreedError, match=pattern):
        use(t, buf)


@pytest.mark.parametrize("planned", [False, True], ids=["graph_compute", "graph_plan_compute"])
def test_compute_after_free_raises_a_named_error(planned):
    cpu = ggml.backend_cpu_init()
    ctx = ggml.init(no_alloc=True)
    a = ggml.set_name(ggml.new_tensor_1d(ctx, T.F32, 8), "a")
    out = ggml.set_name(ggml.scale(ctx, a, 2.0), "out")
    graph = ggml.new_graph(ctx)
    ggml.build_forward_expand(graph, out)
    buf = ggml.backend_alloc_ctx_tensors(ctx, cpu)
    plan = ggml.backend_graph_plan_create(cpu, graph) if planned else None
    ggml.backend_buffer_free(buf)
    with pytest.raises(BufferFreedError, match=r"(tensor view|CPU: graph plan compute): .*'a'.* freed"):
        if planned:
            ggml.backend_graph_plan_compute(cpu, plan)
        else:
            ggml.backend_graph_compute(cpu, graph)


def test_a_view_taken_before_free_keeps_its_memory_but_not_the_buffer():
    t, buf, view = _freed_tensor()
    assert buf.freed and view.tolist() == list(range(8))  # documented: the view owns its memory
    view.zero_()  # writes stay in the view's own memory and never reach ggml
    with pytest.raises(BufferFreedError):
        ggml.backend_tensor_get(t)


def _open_handles(path: Path) -> tuple[int, int]:
    fds = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds += os.readlink(f"/proc/self/fd/{fd}") == str(path.resolve())
        except OSError:
            pass
    with open("/proc/self/maps") as f:
        maps = sum(str(path.resolve()) in line for line in f)
    return fds, maps


@needs_golden
@pytest.mark.parametrize("devices", [None, ["SIM0", "CPU"]], ids=["cpu", "sim0+cpu"])
def test_close_releases_the_file_and_later_calls_raise(tmp_path, devices):
    if devices and not _sim_available():
        pytest.skip("SIM devices not available")
    path = tmp_path / "model.gguf"
    path.write_bytes(Q4_MODEL.read_bytes())
    model = load_model(path, devices=devices, n_ctx=32, progress=False)
    model.eval([1, 2, 3])
    assert _open_handles(path) != (0, 0)
    model.close()
    gc.collect()
    assert _open_handles(path) == (0, 0)
    for call in (lambda: model.eval([1]), model.reset, lambda: list(model.generate([1], max_tokens=1))):
        with pytest.raises(ModelClosedError, match=r"model\.gguf was closed"):
            call()
    model.close()  # twice is fine


def _conversation(model, prompt, seq_id=0):
    model.reset(seq_id)
    out = [model.eval(prompt, seq_id)]
    for token in (3, 4, 5):
        out.append(model.eval([token], seq_id))
    return out


@pytest.mark.parametrize("own_sequence", [False, True], ids=["one-sequence", "a-sequence-each"])
def test_threads_sharing_a_model_get_right_logits_or_a_named_error(demo_model, own_sequence):
    """Each thread: reset + prompt + decode steps. Sharing seq 0 used to give 22-25 wrong results
    of 25; now an interleaved thread raises InterleavedSequenceError, and with a seq_id each
    every result is right."""
    m, prompts = demo_model, ([1, 5, 9, 20, 30], [7, 8, 9, 10])
    want = [_conversation(m, p) for p in prompts]
    counts = {"right": 0, "wrong": 0, "interleaved": 0}

    def worker(k):
        for _ in range(15):
            try:
                got = _conversation(m, prompts[k], k if own_sequence else 0)
            except InterleavedSequenceError:
                counts["interleaved"] += 1
                continue
            # a sequence beside another one reads more (masked) cache cells: rounding differs
            right = all(torch.allclose(g, w, rtol=1e-3, atol=1e-3) for g, w in zip(got, want[k]))
            counts["right" if right else "wrong"] += 1

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counts["wrong"] == 0, counts
    assert counts["right"] + counts["interleaved"] == 30
    if own_sequence:
        assert counts["right"] == 30, counts


def _in_thread(fn):
    box = []
    t = threading.Thread(target=lambda: box.append(_capture(fn)))
    t.start()
    t.join()
    return box[0]


def _capture(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - the caller checks it
        return e


def test_a_thread_continuing_a_sequence_another_thread_reset_raises(demo_model):
    m = demo_model
    m.reset()
    m.eval([1, 2, 3])                                   # this thread's sequence 0 ...
    assert not isinstance(_in_thread(lambda: (m.reset(), m.eval([7, 8]))), Exception)  # ... replaced
    with pytest.raises(InterleavedSequenceError, match="sequence 0 was changed by another thread"):
        m.eval([4])
    with m.lock:                                        # holding the lock takes the sequence over
        m.eval([4])
    m.reset()
    m.eval([1, 2, 3])                                   # after a reset the sequence is this thread's


BAD_OPTIONS = [
    ("n_threads-0", dict(n_threads=0), ValueError, r"n_threads \(0\) must lie in \[1, "),
    ("n_threads-negative", dict(n_threads=-2), ValueError, r"n_threads \(-2\)"),
    ("n_ctx-2^40", dict(n_ctx=2**40), ValueError, r"n_ctx \(1099511627776\) must lie in \[0, 4294967295\]"),
    ("n_ctx-float", dict(n_ctx=1.5), TypeError, r"n_ctx must be an integer"),
    ("tensor_split-nan", dict(tensor_split=[math.nan, 1.0]), ValueError, r"tensor_split \[nan, 1\.0\]: every share"),
    ("tensor_split-zeros", dict(tensor_split=[0, 0]), ValueError, r"tensor_split \[0\.0, 0\.0\]: the shares sum to 0"),
]


@pytest.mark.parametrize("options,error,pattern", [c[1:] for c in BAD_OPTIONS], ids=[c[0] for c in BAD_OPTIONS])
def test_bad_options_name_the_option(options, error, pattern):
    from torchggml.models.params import ModelParams
    with pytest.raises(error, match=pattern):
        ModelParams(**options)


def test_a_kv_cache_too_large_names_n_ctx_and_the_bytes(tmp_path):
    from torchggml.gguf.writer.demo import demo_model_path
    with pytest.raises(MemoryError, match=r"KV cache: n_ctx=1073741824 needs 2199023255552 bytes"):
        load_model(demo_model_path(), n_ctx=2**30, progress=False)


BAD_SAMPLING = [
    ("temperature-nan", dict(temperature=math.nan), r"sampling: temperature=nan must be >= 0"),
    ("top_p-nan", dict(top_p=math.nan), r"sampling: top_p=nan must be in \[0, 1\]"),
]


@pytest.mark.parametrize("options,pattern", [c[1:] for c in BAD_SAMPLING], ids=[c[0] for c in BAD_SAMPLING])
def test_bad_sampling_values_name_the_option(demo_model, options, pattern):
    with pytest.raises(ValueError, match=pattern):
        list(demo_model.generate([1, 2, 3], max_tokens=2, **options))


BAD_TOKENS = [
    ("float-ids", [1.0, 2.5], TypeError, r"token ids must be integers, got 1\.0"),
    ("float-tensor", torch.tensor([1.0, 2.0]), TypeError, r"got a torch\.float32 tensor"),
    ("2-d-tensor", torch.tensor([[1, 2], [3, 4]]), ValueError, r"token ids must be 1-D, got a tensor of shape \(2, 2\)"),
    ("nested-list", [[1, 2], [3, 4]], TypeError, r"token ids must be integers, got a list"),
]


@pytest.mark.parametrize("tokens,error,pattern", [c[1:] for c in BAD_TOKENS], ids=[c[0] for c in BAD_TOKENS])
def test_token_ids_must_be_one_sequence_of_integers(demo_model, tokens, error, pattern):
    with pytest.raises(error, match=pattern):
        demo_model.eval(tokens)
