"""Reliability (issue 10): one regression test per finding, and the stress tests.

1. the scheduler leaves the caller's graph intact, so a reused graph computes correctly;
2. a Model shared by threads gives every thread the single-thread result, and reset() /
   a non-finite eval cannot leave old or NaN values in the cache;
3. GGUF: counts, lengths and data ranges are checked before anything is allocated;
4. hyper-parameters of the wrong type or value raise GGUFError naming file and key;
5. use after free / close raises a named error;
plus a scheduler stress test (split, reset, re-reserve, recompute with parallel copies over
CPU+SIM0+SIM1) and a bounded run of the GGUF fuzzer.
"""
from __future__ import annotations

import gc
import importlib.util
import math
import os
import random
import struct
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import torchggml as ggml
from torchggml.backend.buffer import BufferFreedError
from torchggml.gguf.loader import GGUFError, _entry_nbytes, open_gguf
from torchggml.gguf.reader import _Cursor, _read_value, scan_header
from torchggml.models import load_model
from torchggml.models.model import ModelClosedError, NonFiniteLogitsError

from test_sched import _sim_available, make_weights, mlp_graph, random_graph_pair, reference, run_sched

T = ggml.Type
ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(os.environ.get("TORCHGGML_GOLDEN", ROOT.parent / "shared" / "golden"))
F32_MODEL = GOLDEN / "models" / "llama-F32.gguf"
Q4_MODEL = GOLDEN / "models" / "llama-Q4_0.gguf"
needs_golden = pytest.mark.skipif(not F32_MODEL.exists(), reason=f"golden models not found at {GOLDEN}")
needs_sim = pytest.mark.skipif(not _sim_available(), reason="SIM devices not available (TORCHGGML_SIM_DEVICES unset)")
TOKENS = [1, 5, 9, 200, 3, 77, 400, 12]


@pytest.fixture(scope="module")
def backends():
    return ggml.backend_init_by_name("SIM0"), ggml.backend_init_by_name("SIM1"), ggml.backend_cpu_init()


# ---------------------------------------------------------------- 1. scheduler graph reuse

def _reserve_then_alloc(sched, graph):
    assert ggml.backend_sched_reserve(sched, graph)


def _split_then_alloc(sched, graph):
    ggml.backend_sched_split_graph(sched, graph)
    ggml.backend_sched_reset(sched)


def _compute_then_reset(sched, graph):
    assert ggml.backend_sched_alloc_graph(sched, graph)
    assert ggml.backend_sched_graph_compute(sched, graph) == ggml.Status.SUCCESS
    ggml.backend_sched_reset(sched)


@needs_sim
@pytest.mark.parametrize("before", [_reserve_then_alloc, _split_then_alloc, _compute_then_reset],
                         ids=["reserve", "split_graph", "compute+reset"])
@pytest.mark.parametrize("parallel", [False, True])
def test_reused_graph_computes_correctly_and_keeps_its_sources(backends, before, parallel):
    sim0, sim1, cpu = backends
    ws = [w for k, b in enumerate(backends) for w in make_weights(b, [(16, 16)], seed=k)[2]]
    sched = ggml.backend_sched_new([sim0, sim1, cpu], parallel=parallel)
    _, graph, x, out = mlp_graph(ws)
    sources = [list(n.src) for n in graph.nodes]
    before(sched, graph)
    for step in range(6):
        xv = torch.rand(4, 16) * 2 - 1
        got = run_sched(sched, graph, x, out, xv)
        assert ggml.backend_sched_get_n_splits(sched) == 3
        torch.testing.assert_close(got, reference(ws, xv), rtol=1e-5, atol=1e-5)
        assert [list(n.src) for n in graph.nodes] == sources  # the caller's graph is intact
        if step % 2:
            # computing the allocated graph again, without a new alloc, reads the copies again
            # (inputs are set before every compute: the allocator may reuse their memory)
            ggml.backend_tensor_set(x, xv)
            assert ggml.backend_sched_graph_compute(sched, graph) == ggml.Status.SUCCESS
            torch.testing.assert_close(ggml.backend_tensor_get(out), got)
        ggml.backend_sched_reset(sched)


@needs_sim
def test_double_alloc_says_how_to_allocate_again(backends):
    sim0, _, cpu = backends
    _, _, ws = make_weights(sim0, [(16, 16)])
    sched = ggml.backend_sched_new([sim0, cpu])
    _, graph, _, _ = mlp_graph(ws)
    assert ggml.backend_sched_alloc_graph(sched, graph)
    with pytest.raises(RuntimeError, match=r"already allocated: compute it, or call backend_sched_reset "
                                           r"before allocating a graph \(the same one included\) again"):
        ggml.backend_sched_alloc_graph(sched, graph)


ACTIONS = ["alloc+compute", "async+sync", "recompute", "reset", "reserve", "split_graph"]


@needs_sim
@pytest.mark.parametrize("parallel", [False, True])
def test_stress_same_graph_split_reset_reserved_and_recomputed(backends, parallel):
    """Random graphs over CPU+SIM0+SIM1, each driven through a random sequence of scheduler
    calls on the same graph object; every result equals the CPU-only run."""
    sim0, sim1, cpu = backends
    weights = [make_weights(b, [(16, 16)] * 3, seed=k)[2] for k, b in enumerate(backends)]
    cpu_weights = [make_weights(cpu, [(16, 16)] * 3, seed=k)[2] for k in range(3)]
    sched = ggml.backend_sched_new([sim0, sim1, cpu], parallel=parallel)
    ref_sched = ggml.backend_sched_new([cpu])
    rng = random.Random(77 + parallel)
    checked = multi_split = 0
    for _ in range(8):
        n_tokens = rng.choice([1, 3, 8])
        graph, x, out, ref_graph, ref_x, ref_out = random_graph_pair(rng, weights, cpu_weights, n_tokens)
        sources = [list(n.src) for n in graph.nodes]
        allocated = False
        for _ in range(10):
            action = rng.choice(ACTIONS)
            if action in ("reset", "reserve", "split_graph"):
                ggml.backend_sched_reset(sched)
                allocated = False
                if action == "reserve":
                    assert ggml.backend_sched_reserve(sched, graph)
                elif action == "split_graph":
                    ggml.backend_sched_split_graph(sched, graph)
                    ggml.backend_sched_reset(sched)
                assert [list(n.src) for n in graph.nodes] == sources
                continue
            if action != "recompute" or not allocated:  # recompute: the allocated graph again
                ggml.backend_sched_reset(sched)
                assert ggml.backend_sched_alloc_graph(sched, graph)
                allocated = True
            xv = torch.rand(n_tokens, 16) * 2 - 1
            ggml.backend_tensor_set(x, xv)
            if action == "async+sync":
                assert ggml.backend_sched_graph_compute_async(sched, graph) == ggml.Status.SUCCESS
                ggml.backend_sched_synchronize(sched)
            else:
                assert ggml.backend_sched_graph_compute(sched, graph) == ggml.Status.SUCCESS
            expected = run_sched(ref_sched, ref_graph, ref_x, ref_out, xv)
            ggml.backend_sched_reset(ref_sched)
            torch.testing.assert_close(ggml.backend_tensor_get(out).reshape(expected.shape), expected,
                                       rtol=1e-5, atol=1e-5)
            assert [list(n.src) for n in graph.nodes] == sources
            checked += 1
            multi_split += ggml.backend_sched_get_n_splits(sched) > 1
        ggml.backend_sched_reset(sched)
    assert checked >= 30 and multi_split >= 10, (checked, multi_split)


# ---------------------------------------------------------------- 2. threads, reset, non-finite

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
def test_non_finite_logits_raise_and_leave_the_cache_as_it_was(golden_model):
    m = golden_model
    want = _fresh_logits(m, TOKENS[:4], TOKENS[4:])
    norm = m.weights.layers[0].attn_norm
    saved = ggml.backend_tensor_get(norm).clone()
    m.reset()
    m.eval(TOKENS[:4])
    ggml.backend_tensor_set(norm, torch.full_like(saved, float("nan")))  # NaN into layer 0's K/V
    try:
        with pytest.raises(NonFiniteLogitsError, match=r"llama-F32\.gguf: eval produced non-finite logits "
                                                        r"\(first at token 0, position 4\); the cache was "
                                                        r"restored to 4 tokens"):
            m.eval(TOKENS[4:])
        assert m.n_past == 4
    finally:
        ggml.backend_tensor_set(norm, saved)
    assert torch.equal(m.eval(TOKENS[4:]), want[1])  # the NaN cells were zeroed


# ---------------------------------------------------------------- GGUF rewriting helpers

def _kv_spans(data: bytes):
    """{key: (start, end)} of each metadata entry, and where the entries end."""
    cur = _Cursor("mem", data, "<")
    cur.pos = 24
    spans = {}
    for _ in range(struct.unpack_from("<Q", data, 16)[0]):
        start = cur.pos
        key = cur.string("key")
        _read_value(cur, cur.unpack("I", "type"), key)
        spans[key] = (start, cur.pos)
    return spans, cur.pos


def with_kv(data: bytes, key: str, type_id: int, value: bytes, append: bool = False, pad_to: int = 0) -> bytes:
    """A copy of GGUF `data` with metadata `key` set to the raw `value` of `type_id` (added when
    absent or `append`); the header is re-padded and the tensor data moved with it, so the file
    stays valid."""
    h = scan_header("mem", data, _entry_nbytes("mem"))
    spans, _ = _kv_spans(data)
    entry = struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", type_id) + value
    if key in spans and not append:
        a, b = spans[key]
        header = data[:a] + entry + data[b:h.header_end]
    else:
        _, end = _kv_spans(data)
        header = bytearray(data[:end] + entry + data[end:h.header_end])
        struct.pack_into("<Q", header, 16, struct.unpack_from("<Q", data, 16)[0] + 1)
        header = bytes(header)
    pad = -len(header) % (pad_to or h.alignment)
    return header + bytes(pad) + data[h.data_offset:]


def _tensor_entry_end(data: bytes, name: str) -> int:
    """Byte position of the (type, offset) fields of a tensor's table entry."""
    i = data.index(struct.pack("<Q", len(name)) + name.encode()) + 8 + len(name)
    n_dims = struct.unpack_from("<I", data, i)[0]
    return i + 4 + 8 * n_dims


def _patched(data: bytes, pos: int, fmt: str, value) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, pos, value)
    return bytes(b)


# ---------------------------------------------------------------- 3. GGUF validation

def _huge_array(data):
    # tokenizer.ggml.token_type claiming 2^32-1 int32 items (the gguf reader spins on this)
    return with_kv(data, "tokenizer.ggml.token_type", 9, struct.pack("<IQ", 5, 2**32 - 1) + bytes(16))


def _huge_string_array(data):
    return with_kv(data, "tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 2**40))


def _table_one_short(data):
    return _patched(data, 8, "<Q", struct.unpack_from("<Q", data, 8)[0] - 1)


def _overlap(data):
    # blk.0.attn_k.weight's data at blk.0.attn_q.weight's offset
    q = struct.unpack_from("<Q", data, _tensor_entry_end(data, "blk.0.attn_q.weight") + 4)[0]
    return _patched(data, _tensor_entry_end(data, "blk.0.attn_k.weight") + 4, "<Q", q)


def _type_changed(data):
    return _patched(data, _tensor_entry_end(data, "blk.0.attn_q.weight"), "<I", int(T.F16))


def _alignment(value):
    return lambda data: with_kv(data, "general.alignment", 4, struct.pack("<I", value), pad_to=value or 1)


GGUF_DAMAGE = [
    ("huge-array-count", _huge_array, r"'tokenizer\.ggml\.token_type' \(array count\): count 4294967295 needs"),
    ("huge-string-array", _huge_string_array, r"'tokenizer\.ggml\.tokens' \(array count\): count \d+ needs"),
    ("huge-block-count", lambda d: with_kv(d, "llama.block_count", 4, struct.pack("<I", 2**31 - 1)),
     r"'llama\.block_count' = 2147483647 is out of range"),
    ("block-count-over-tensors", lambda d: with_kv(d, "llama.block_count", 4, struct.pack("<I", 500)),
     r"'llama\.block_count' = 500 is more than the 21 tensors"),
    ("huge-tensor-count", lambda d: _patched(d, 8, "<Q", 2**62), r"tensor count: count \d+ needs"),
    ("huge-kv-count", lambda d: _patched(d, 16, "<Q", 2**40), r"metadata key count: count \d+ needs"),
    ("table-one-entry-short", _table_one_short, r"bytes after the last tensor's data are not described"),
    ("overlapping-data", _overlap, r"tensor 'blk\.0\.attn_k\.weight': data offset \d+ is not where the "
                                   r"previous tensor's data ends"),
    ("tensor-type-changed", _type_changed, r"tensor 'blk\.0\.attn_k\.weight': data offset \d+ is not where"),
    ("alignment-4096", _alignment(4096), r"data offset \d+ is not aligned to 4096 bytes"),
    ("alignment-not-power-of-two", _alignment(48), r"'general\.alignment' = 48 is not a power of two"),
    ("alignment-zero", _alignment(0), r"'general\.alignment' = 0 is not a power of two"),
    ("alignment-wrong-type", lambda d: with_kv(d, "general.alignment", 10, struct.pack("<Q", 32)),
     r"'general\.alignment' must be a uint32, not uint64"),
    ("duplicate-key", lambda d: with_kv(d, "llama.context_length", 4, struct.pack("<I", 256), append=True),
     r"'llama\.context_length': the key appears twice"),
    ("bad-utf8-key", lambda d: d.replace(b"general.file_type", b"general.file_ty\xff\xfe"),
     r"metadata key #\d+: the string is not valid UTF-8"),
]


@needs_golden
@pytest.mark.parametrize("damage,pattern", [d[1:] for d in GGUF_DAMAGE], ids=[d[0] for d in GGUF_DAMAGE])
def test_gguf_is_validated_before_anything_is_allocated(tmp_path, damage, pattern):
    path = tmp_path / "damaged.gguf"
    path.write_bytes(damage(Q4_MODEL.read_bytes()))
    with pytest.raises(GGUFError, match=pattern) as err:
        load_model(path, progress=False)
    assert str(path) in str(err.value)


@needs_golden
@pytest.mark.parametrize("alignment", [16, 32, 64])
def test_a_consistent_alignment_loads_the_same_model(tmp_path, alignment):
    """An explicit alignment that agrees with the layout is fine; one that moves the data
    fails above. Either way no file loads with shifted data."""
    path = tmp_path / "aligned.gguf"
    path.write_bytes(_alignment(alignment)(Q4_MODEL.read_bytes()))
    f, ref = open_gguf(path), open_gguf(Q4_MODEL)
    assert f.alignment == alignment
    for name, info in ref.tensors.items():
        assert np.array_equal(f.tensor_data(name), ref.tensor_data(name))


from torchggml.gguf.loader import _BLOCK_SCALES, check_tensor_values  # noqa: E402


@pytest.mark.parametrize("qtype,offset,size", [(t, off, size) for t, fields in _BLOCK_SCALES.items()
                                               for off, size in fields], ids=lambda v: getattr(v, "name", str(v)))
def test_block_scale_table_matches_the_reference_dequantize(qtype, offset, size):
    """A NaN written at each listed scale field makes the reference dequantize non-finite; the
    table is what check_tensors reads."""
    from torchggml.quants import dequantize
    from torchggml.types import type_traits
    blocks = torch.zeros(4, type_traits(qtype).type_size, dtype=torch.uint8)
    blocks[:, :] = 0x11  # finite scales, non-zero quants
    for off, sz in _BLOCK_SCALES[qtype]:
        blocks[:, off:off + sz] = torch.tensor([1.0], dtype=torch.float16 if sz == 2 else torch.float32).view(torch.uint8)
    assert bool(torch.isfinite(dequantize(qtype, blocks)).all())
    nan = torch.tensor([float("nan")], dtype=torch.float16 if size == 2 else torch.float32).view(torch.uint8)
    blocks[2, offset:offset + size] = nan
    assert not bool(torch.isfinite(dequantize(qtype, blocks)[2]).all())


@needs_golden
def test_check_tensors_rejects_a_type_swapped_for_one_of_the_same_size(tmp_path):
    """Q4_K and Q4_0 blocks of 256 values are both 144 bytes: the layout stays valid, and only
    the values can tell (the fuzzer found this one)."""
    data = (GOLDEN / "models" / "llama-Q4_K_M.gguf").read_bytes()
    path = tmp_path / "swapped.gguf"
    path.write_bytes(_patched(data, _tensor_entry_end(data, "blk.1.attn_k.weight"), "<I", int(T.Q4_0)))
    with pytest.raises(GGUFError, match=r"swapped\.gguf: tensor 'blk\.1\.attn_k\.weight' \(Q4_0\): block scale "
                                        r"at byte 0 #\d+ is not finite"):
        load_model(path, progress=False, check_tensors=True)
    f = open_gguf(GOLDEN / "models" / "llama-Q4_K_M.gguf")
    for name in f.tensors:  # a sound file passes
        check_tensor_values(f, name)


# ---------------------------------------------------------------- 4. hyper-parameters

def _u32(v):
    return 4, struct.pack("<I", v)


def _str(s):
    return 8, struct.pack("<Q", len(s)) + s.encode()


HPARAMS = [
    ("head-count-0", "llama.attention.head_count", _u32(0), r"'llama\.attention\.head_count' = 0 is out of range"),
    ("head-count-kv-0", "llama.attention.head_count_kv", _u32(0), r"head_count_kv' = 0 is out of range"),
    ("embedding-length-string", "llama.embedding_length", _str("256"),
     r"'llama\.embedding_length' must be a uint32, not string \('256'\)"),
    ("vocab-size-nan", "llama.vocab_size", (6, struct.pack("<f", math.nan)),
     r"'llama\.vocab_size' must be a uint32, not float32"),
    ("context-length-u64-max", "llama.context_length", (10, struct.pack("<Q", 2**64 - 1)),
     r"'llama\.context_length' must be a uint32, not uint64"),
    ("rms-eps-nan", "llama.attention.layer_norm_rms_epsilon", (6, struct.pack("<f", math.nan)),
     r"layer_norm_rms_epsilon' = nan is out of range"),
    ("rms-eps-0", "llama.attention.layer_norm_rms_epsilon", (6, struct.pack("<f", 0.0)), r"= 0\.0 is out of range"),
    ("freq-base-negative", "llama.rope.freq_base", (6, struct.pack("<f", -1.0)), r"freq_base' = -1\.0 is out of range"),
    ("block-count-bool", "llama.block_count", (7, b"\x01"), r"'llama\.block_count' must be a uint32, not bool"),
    ("head-count-per-layer-zero", "llama.attention.head_count", (9, struct.pack("<IQ", 4, 2) + bytes(8)),
     r"'llama\.attention\.head_count' is 0 for every layer"),
    ("ffn-string-array", "llama.feed_forward_length", (9, struct.pack("<IQ", 8, 1) + _str("x")[1]),
     r"'llama\.feed_forward_length' must be a uint32 or a per-layer int32/uint32 array, not array\[string\]"),
    ("rope-dims-odd", "llama.rope.dimension_count", _u32(31), r"dimension_count' = 31 must be even and at most "
                                                              r"the head size 32"),
    ("rope-dims-over-head", "llama.rope.dimension_count", _u32(64), r"dimension_count' = 64 must be even"),
    ("gqa-not-dividing", "llama.attention.head_count_kv", _u32(3), r"head_count_kv' = 3 does not divide "
                                                                   r"'llama\.attention\.head_count' = 8"),
    ("bos-token-float", "tokenizer.ggml.bos_token_id", (6, struct.pack("<f", 1.5)),
     r"'tokenizer\.ggml\.bos_token_id' must be a uint32 token id, not float32"),
]


@needs_golden
@pytest.mark.parametrize("key,value,pattern", [h[1:] for h in HPARAMS], ids=[h[0] for h in HPARAMS])
def test_bad_hyper_parameters_name_file_and_key(tmp_path, key, value, pattern):
    path = tmp_path / "hparams.gguf"
    path.write_bytes(with_kv(Q4_MODEL.read_bytes(), key, *value))
    with pytest.raises(GGUFError, match=pattern) as err:
        load_model(path, progress=False)
    assert str(path) in str(err.value)


# ---------------------------------------------------------------- 5. use after free / close

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


# ---------------------------------------------------------------- the fuzzer, bounded

def _fuzzer():
    spec = importlib.util.spec_from_file_location("fuzz_gguf", ROOT / "scripts" / "fuzz_gguf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_golden
def test_fuzz_a_few_hundred_mutants_without_failures():
    fuzz = _fuzzer()
    sources = [GOLDEN / "models" / n for n in ("llama-Q4_0.gguf", "llama-Q4_K_M.gguf", "qwen3-F16-tied.gguf")]
    summary = fuzz.run(200, seed=2026, workers=2, timeout=60, mem_cap_mb=2048, sources=sources, progress=False,
                       oracle=False)  # test_reliability_round3 runs the oracle
    outcomes = summary["outcomes"]
    assert summary["failures"] == 0, summary["examples"]
    assert sum(outcomes.values()) == 200
    # the mutants exercise both sides: files that still load and files rejected with a clear error
    assert outcomes["ok-unchecked"] >= 10 and outcomes["clear-error"] >= 100, outcomes
