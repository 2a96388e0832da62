"""The continuous-batching engine in-process: prompts in chunks beside running decodes, slots
freed and reused, cancellation, the queue bound."""
from __future__ import annotations

import os
import threading
import time

import pytest

from torchggml.models.generation import Generation
from torchggml.models.sampling import SamplingParams
from torchggml.server.engine import Engine, Job, QueueFull, SlotError


@pytest.fixture(scope="module")
def model():
    from torchggml.gguf.writer.demo import demo_model_path
    from torchggml.models import load_model
    m = load_model(demo_model_path(), n_ctx=256, n_batch=8, progress=False)
    yield m
    m.close()


class Collector:
    def __init__(self, n: int):
        self.events, self.left, self.done = [], n, threading.Event()

    def __call__(self, event):
        self.events.append(event)
        if event[0] in ("done", "error"):
            self.left -= 1
            if not self.left:
                self.done.set()

    def text(self, job) -> str:
        return "".join(e[2] for e in self.events if e[1] is job and e[0] in ("token", "done"))


def _job(model, prompt, emit, max_tokens=6):
    ids = model.tokenize(prompt)
    return Job(ids, emit, Generation(model.tokenizer, ids, SamplingParams(temperature=0), max_tokens))


def test_prompts_join_beside_decodes_and_slots_are_reused(model):
    engine = Engine(model, parallel=2, max_queue=8)
    try:
        out = Collector(3)
        short = _job(model, "Once", out, max_tokens=48)
        engine.submit([short])
        while short.gen.n_generated < 2:  # it is decoding ...
            threading.Event().wait(0.01)
        long = _job(model, "The scheduler cuts the graph where the device changes, and copies", out)
        third = _job(model, "A graph", out)
        engine.submit([long, third])  # ... when a long prompt (more than n_batch=8 tokens) joins
        assert out.done.wait(120)
        assert all(e[0] != "error" for e in out.events)
        assert engine.stats.mixed_steps > 0  # prompt chunks ran beside the decode
        for job in (short, long, third):
            assert job.gen.finish_reason == "length" and out.text(job)
        assert third.seq_id in (0, 1) and engine.free_slots == [0, 1]
        assert model.n_past == sum(map(len, engine.slot_tokens.values()))  # idle slots keep their cells
    finally:
        engine.stop()


def test_cancel_and_queue_bound(model):
    engine = Engine(model, parallel=1, max_queue=1)
    try:
        out = Collector(1)
        running = _job(model, "Once", out, max_tokens=200)
        engine.submit([running])
        waiting = _job(model, "A graph", out)
        engine.submit([waiting])
        with pytest.raises(QueueFull):
            engine.submit([_job(model, "x", out)])
        running.cancel()
        assert out.done.wait(120)  # the waiting one ran once the cancelled one left
        assert waiting.gen.finish_reason == "length" and running.gen.n_generated < 200
        assert engine.stats.sequences_finished["cancelled"] == 1
        assert model.n_past == len(engine.slot_tokens[0]) == len(waiting.prompt)  # the cancelled one's cells went
    finally:
        engine.stop()


def _conversation(model, engine, turns, cache_prompt):
    """Each turn's prompt is the last one, its reply and the next text: (replies, cached counts)."""
    replies, cached, ids = [], [], []
    for turn in turns:
        ids = ids + turn
        out = Collector(1)
        job = Job(ids, out, Generation(model.tokenizer, ids, SamplingParams(temperature=0), 6),
                  cache_prompt=cache_prompt)
        engine.submit([job])
        assert out.done.wait(120)
        replies.append([c.token for c in job.gen.choices])
        cached.append(job.n_cached)
        ids = ids + [c.token for c in job.gen.choices]
    return replies, cached


def test_the_prompt_cache_reuses_a_slots_prefix_and_changes_no_token(model):
    """Turn k's prompt holds turn k-1's: with the cache only the new tokens are evaluated, and the
    replies equal those without it (temperature 0). (Recurrent and hybrid memories cannot drop a
    tail: test_recurrent_and_hybrid_slots_keep_the_prompts_state.)"""
    turns = [[5, 9, 13, 2, 7], [11, 4, 6], [8, 3, 10]]
    results = {}
    for cache_prompt in (True, False):
        engine = Engine(model, parallel=2)
        try:
            results[cache_prompt] = _conversation(model, engine, turns, cache_prompt)
        finally:
            engine.stop()
    (with_cache, cached), (without, none) = results[True], results[False]
    assert with_cache == without and none == [0, 0, 0]
    # turn k finds turn k-1's prompt (its reply is evaluated again: the cache changes no token)
    assert cached == [0, 5, 5 + 6 + 3]


def test_chat_prompt_uses_the_file_template_or_chatml(model, monkeypatch):
    pytest.importorskip("fastapi", reason="the server extra is not installed")
    from torchggml.server.app import ServerState
    from torchggml.server.protocol import ChatRequest
    engine = Engine(model, parallel=1)
    try:
        state = ServerState(model, engine, "demo")
        req = ChatRequest.model_validate({"messages": [{"role": "user", "content": "Hi"}]})
        tok = model.tokenizer
        assert tok.chat_template is None  # the demo has none: llama.cpp's chatml
        ids, stops = state.chat_prompt(req)
        text = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        assert ids == model.tokenize(text, parse_special=True) and stops == ["<|im_end|>"]
        monkeypatch.setattr(tok, "chat_template", "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{% endfor %}")
        ids, stops = state.chat_prompt(req)
        assert ids == model.tokenize("[user] Hi", parse_special=True) and stops == []
    finally:
        engine.stop()


@pytest.mark.parametrize("n_seqs", [1, 4])
def test_a_decode_step_of_n_sequences_is_one_micro_batch_of_n_rows(model, monkeypatch, n_seqs):
    """The decode loop's step evaluates every decoding sequence's next token in one graph
    computation (so each weight is read once for all of them), not one a sequence."""
    from torchggml.models.batch_generator import BatchGenerator
    model.reset()
    batch = BatchGenerator(model)
    for i in range(n_seqs):
        ids = model.tokenize(f"Once {i}")
        batch.add(Generation(model.tokenizer, ids, SamplingParams(temperature=0), 4), i, model.n_ctx // n_seqs)
    while any(seq.prefilling for seq in batch.active):
        batch.step()
    micro_batches = []  # the tokens of each graph computed
    real = model._compute
    monkeypatch.setattr(model, "_compute", lambda g, *a: (micro_batches.append(g.n_tokens), real(g, *a))[1])
    updates = batch.step()
    assert micro_batches == [n_seqs] and len(updates) == n_seqs


# ---------------------------------------------------------------- slots over one unified cache

def _gen_job(model, ids, emit, max_tokens=6, cache_prompt=True, tokenizer=None, ignore_eos=False):
    gen = Generation(tokenizer or model.tokenizer, ids, SamplingParams(temperature=0), max_tokens,
                     ignore_eos=ignore_eos)
    return Job(list(ids), emit, gen, cache_prompt=cache_prompt)


def _run(engine, jobs):
    """Submit the jobs together and wait for them: their generated tokens."""
    out = Collector(len(jobs))
    for j in jobs:
        j.emit = out
    engine.submit(jobs)
    assert out.done.wait(120)
    assert all(e[0] != "error" for e in out.events), [e for e in out.events if e[0] == "error"]
    return [[c.token for c in j.gen.choices] for j in jobs]


CONVERSATIONS = [[5, 9, 13, 2, 7, 21], [30, 4, 6, 8], [17, 17, 3, 40, 41, 42, 43], [60, 61]]
NEXT_TURN = [11, 4, 6]


def _second_turns(first_prompts, first_replies):
    return [p + r + NEXT_TURN for p, r in zip(first_prompts, first_replies)]


@pytest.fixture(scope="module")
def reference(model):
    """Each conversation's two replies, every prompt evaluated whole, one sequence at a time."""
    engine = Engine(model, parallel=1)
    try:
        first = [_run(engine, [_gen_job(model, p, None, cache_prompt=False)])[0] for p in CONVERSATIONS]
        second = [_run(engine, [_gen_job(model, p, None, cache_prompt=False)])[0]
                  for p in _second_turns(CONVERSATIONS, first)]
    finally:
        engine.stop()
    return first, second


@pytest.mark.parametrize("parallel, cache_ram, concurrent", [
    (1, 0, False), (4, 0, False), (1, 1 << 20, False), (4, 1 << 20, False),
    (4, 0, True), (1, 1 << 20, True), (4, 1 << 20, True)])
def test_conversations_with_the_caches_give_the_same_replies(model, reference, parallel, cache_ram, concurrent):
    """Four conversations' two turns, one after another or submitted together: each reply equals the
    reference's (temperature 0). Turn 2 finds turn 1's prompt in a slot or, where one slot cannot hold
    four, in the host-memory cache; without it, one slot keeps only the last prompt."""
    first_ref, second_ref = reference
    engine = Engine(model, parallel=parallel, cache_ram=cache_ram)
    try:
        batches = [[p] for p in CONVERSATIONS] if not concurrent else [CONVERSATIONS]
        first = [r for b in batches for r in _run(engine, [_gen_job(model, p, None) for p in b])]
        jobs = [_gen_job(model, p, None) for p in _second_turns(CONVERSATIONS, first)]
        second = [r for b in ([jobs] if concurrent else [[j] for j in jobs]) for r in _run(engine, b)]
        assert (first, second) == (first_ref, second_ref)
        cached = [j.n_cached for j in jobs]
        if parallel == 4 or cache_ram:
            assert cached == [len(p) for p in CONVERSATIONS]
        else:  # one slot, no host cache: only the last first turn is still there
            assert cached[:-1] == [0, 0, 0] and cached[-1] in (0, len(CONVERSATIONS[-1]))
        if cache_ram and parallel == 1:  # each second turn found its first in the host cache
            assert engine.prompt_cache.hits == 4 and engine.prompt_cache.restored_tokens == sum(cached)
        assert engine.stats.cached_prompt_tokens == sum(cached)
    finally:
        engine.stop()


def test_a_slot_may_use_the_whole_context(model):
    """With 4 slots over 256 cells a request may hold far more than 256 / 4 of them."""
    engine = Engine(model, parallel=4)
    try:
        job = _gen_job(model, list(range(3, 150)), None, max_tokens=60, ignore_eos=True)
        _run(engine, [job])
        assert job.gen.n_generated == 60 and job.gen.finish_reason == "length"
    finally:
        engine.stop()


def test_a_request_that_does_not_fit_now_waits_for_the_cells(model):
    """Two requests that each reserve more than half the cells run one after the other, and one behind
    them waits its turn (first come, first served), though slots are free."""
    engine = Engine(model, parallel=4)
    try:
        times = {}
        out = Collector(3)

        def emit(event):
            times.setdefault((event[1], event[0]), time.perf_counter())
            out(event)
        jobs = [_gen_job(model, list(range(3, 123)), emit, max_tokens=10, ignore_eos=True),
                _gen_job(model, list(range(4, 124)), emit, max_tokens=10, ignore_eos=True),
                _gen_job(model, [60, 61], emit, max_tokens=4, ignore_eos=True)]
        engine.submit(jobs)
        assert out.done.wait(120)
        assert times[(jobs[1], "token")] > times[(jobs[0], "done")]
        assert times[(jobs[2], "token")] > times[(jobs[0], "done")]
        assert all(j.gen.n_generated == j.gen.max_tokens for j in jobs)
    finally:
        engine.stop()


def test_a_request_that_can_never_fit_is_refused(model):
    engine = Engine(model, parallel=4)
    try:
        with pytest.raises(ValueError, match=r"needs 257 cells .* n_ctx=256"):
            engine.submit([_gen_job(model, [5, 9, 13], None, max_tokens=254)])
    finally:
        engine.stop()


# ---------------------------------------------------------------- slot files

def _action(engine, slot, action, path=None):
    return engine.slot_action(slot, action, path).result(timeout=60)


@pytest.mark.parametrize("parallel, into", [(1, 0), (4, 0), (4, 3)])
def test_a_restored_slot_serves_a_prompt_cache_hit(model, reference, tmp_path, parallel, into):
    """Save a slot to a file, erase it, restore it (into another slot too): the next turn finds the
    prompt there and replies as without any cache."""
    first_ref, second_ref = reference
    engine = Engine(model, parallel=parallel)
    try:
        job = _gen_job(model, CONVERSATIONS[0], None)
        _run(engine, [job])
        path = str(tmp_path / "conv.slot")
        saved = _action(engine, job.seq_id, "save", path)
        assert saved["n_saved"] == len(CONVERSATIONS[0]) and saved["n_written"] == os.path.getsize(path)
        assert saved["filename"] == "conv.slot" and saved["timings"]["save_ms"] >= 0
        assert _action(engine, job.seq_id, "erase") == {"id_slot": job.seq_id, "n_erased": len(CONVERSATIONS[0])}
        assert model.n_past == 0
        restored = _action(engine, into, "restore", path)
        assert (restored["n_restored"], restored["n_read"]) == (len(CONVERSATIONS[0]), saved["n_written"])
        second = _gen_job(model, _second_turns(CONVERSATIONS[:1], first_ref[:1])[0], None)
        assert _run(engine, [second]) == [second_ref[0]]
        assert second.seq_id == into and second.n_cached == len(CONVERSATIONS[0])
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def other_model(tmp_path_factory):
    from torchggml.gguf.writer.tiny import write_tiny_model
    from torchggml.models import load_model
    names = ("llama-moe", "mamba2", "granitehybrid")
    d = tmp_path_factory.mktemp("tiny")
    models = {n: load_model(write_tiny_model(d / f"{n}.gguf", n), n_ctx=64, progress=False) for n in names}
    yield models
    for m in models.values():
        m.close()


def _damage(path, how):
    data = open(path, "rb").read()
    if how == "truncated":
        data = data[:-5]
    elif how == "not a slot file":
        data = b"GGUF" + data[4:]
    elif how == "header":
        data = data[:12] + b"[" + data[13:]
    open(path, "wb").write(data)


@pytest.mark.parametrize("how, message", [
    ("truncated", "is truncated or damaged"), ("not a slot file", "is not a torchggml slot file"),
    ("header", "its header is damaged"), ("missing", "does not exist"),
    ("another model", r"was saved from another model or cache type \(differs in n_vocab, row_bytes, fingerprint\): "
                      r"llama f16 cache, fingerprint \w{12}; this server: llama f16")])
def test_a_slot_file_that_does_not_belong_is_refused(model, other_model, tmp_path, how, message):
    engine = Engine(model, parallel=2)
    other = Engine(other_model["llama-moe"], parallel=1) if how == "another model" else engine
    try:
        _run(engine, [_gen_job(model, CONVERSATIONS[1], None)])
        path = str(tmp_path / "s.slot")
        _action(engine, 0, "save", path)
        if how == "missing":
            os.remove(path)
        elif how != "another model":
            _damage(path, how)
        with pytest.raises(SlotError, match="Unable to restore slot: .*" + message) as e:
            _action(other, 1 if other is engine else 0, "restore", path)
        assert e.value.status == 400
    finally:
        engine.stop()
        if other is not engine:
            other.stop()


@pytest.mark.parametrize("slot, action, status, message", [
    (4, "save", 400, "Invalid slot ID 4"), (-1, "erase", 400, "Invalid slot ID"),
    (0, "bogus", 400, "Invalid action 'bogus'")])
def test_slot_action_errors(model, slot, action, status, message):
    engine = Engine(model, parallel=4)
    try:
        with pytest.raises(SlotError, match=message) as e:
            engine.slot_action(slot, action, "/nonexistent/x")
        assert e.value.status == status
    finally:
        engine.stop()


# ---------------------------------------------------------------- recurrent and hybrid memories

@pytest.mark.parametrize("name", ["mamba2", "granitehybrid"])
def test_recurrent_and_hybrid_slots_keep_the_prompts_state(model, other_model, name, tmp_path):
    """Their states cannot go back, so a slot keeps a copy of its memory at the prompt's end: turn 2,
    which begins with the whole turn-1 prompt, evaluates only the rest and replies as evaluated
    whole; a prompt diverging inside it starts over; save, erase and restore (into another slot)
    give the same turn 2 from the file's state; the host cache holds none of these."""
    m = other_model[name]
    first = [5, 9, 13, 2]

    def job(ids, cache=True):
        return _gen_job(m, ids, None, tokenizer=model.tokenizer, cache_prompt=cache)
    engine = Engine(m, parallel=2, cache_ram=1 << 20)
    try:
        one = job(first)
        _run(engine, [one])
        second = first + [c.token for c in one.gen.choices] + NEXT_TURN
        whole = job(second, cache=False)
        expect = _run(engine, [whole])[0]
        assert whole.n_cached == 0
        two = job(second)
        assert _run(engine, [two]) == [expect] and two.n_cached == len(first) and two.seq_id == one.seq_id
        diverging = job(first[:2] + [40, 41])
        _run(engine, [diverging])
        assert diverging.n_cached == 0 and not engine.prompt_cache.entries
        # the slot of `two` now holds its prompt's state: save it, erase it, restore it into the other slot
        slot = two.seq_id
        path = str(tmp_path / f"{name}.slot")
        saved = _action(engine, slot, "save", path)
        assert saved["n_saved"] == len(second) and saved["n_written"] == os.path.getsize(path)
        assert _action(engine, slot, "erase")["n_erased"] == len(second)
        assert _action(engine, 1 - slot, "restore", path)["n_restored"] == len(second)
        third = second + [c.token for c in two.gen.choices] + NEXT_TURN
        again, reference_ = job(third), job(third, cache=False)
        assert _run(engine, [again]) == _run(engine, [reference_])
        assert again.n_cached == len(second) and again.seq_id == 1 - slot
    finally:
        engine.stop()


def test_a_recurrent_state_loads_only_whole(other_model):
    m = other_model["mamba2"]
    m.reset()
    m.eval([5, 9, 13], seq_id=0)
    saved = m.save_seq(0)
    assert saved.n == 3 and saved.state and not saved.rows
    with pytest.raises(ValueError, match="after all its 3 positions"):
        m.load_seq(1, saved, 2)
    m.load_seq(1, saved)
    assert m.memory.seq_len(1) == 3
    m.reset()


# ---------------------------------------------------------------- the host-memory prompt cache

class _Cells:
    def __init__(self, n):
        self.n = n

    def nbytes(self):
        return 100 * self.n


@pytest.mark.parametrize("limit, adds, kept", [
    (10_000, [[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 5]]),
    (10_000, [[1, 2], [1, 2, 3]], [[1, 2, 3]]),              # an entry it extends is dropped
    (10_000, [[1, 2, 3], [1, 2]], [[1, 2, 3]]),              # one that an entry holds is not stored
    (700, [[1, 2, 3], [4, 5, 6], [7]], [[4, 5, 6], [7]]),    # least recently used out past the limit
    (300, [[1, 2, 3, 4]], []),                               # larger than the whole limit: not kept
])
def test_the_host_cache_keeps_what_fits_least_recently_used_out(limit, adds, kept):
    from torchggml.server.prompt_cache import PromptCache
    cache = PromptCache(limit)
    for tokens in adds:
        cache.add(tokens, _Cells(len(tokens)))
    assert [e.tokens for e in cache.entries.values()] == kept and cache.nbytes <= limit


@pytest.mark.parametrize("prompt, n, tokens_left", [
    ([1, 2, 3, 9], 3, [[4, 5, 6]]),      # a whole entry goes back to a slot: it leaves the cache
    ([1, 2, 8], 2, [[4, 5, 6], [1, 2, 3]]),  # a part of one: it stays, most recently used
    ([9], 0, [[1, 2, 3], [4, 5, 6]]),    # nothing shared
])
def test_the_host_cache_gives_the_longest_prefix(prompt, n, tokens_left):
    from torchggml.server.prompt_cache import PromptCache
    cache = PromptCache(10_000)
    for tokens in ([1, 2, 3], [4, 5, 6]):
        cache.add(tokens, _Cells(len(tokens)))
    entry, got = cache.best(prompt)
    assert got == n
    if entry is not None:
        cache.take(entry, got)
    assert [e.tokens for e in cache.entries.values()] == tokens_left


def test_a_failure_while_taking_a_slot_fails_that_request_only(model, monkeypatch):
    """Copying a host-cache entry back fails: that request gets the error, its slot is cleared and
    the engine serves the next request."""
    engine = Engine(model, parallel=1, cache_ram=1 << 20)
    try:
        _run(engine, [_gen_job(model, CONVERSATIONS[0], None)])
        _run(engine, [_gen_job(model, CONVERSATIONS[1], None)])  # the first prompt goes to the host cache

        def broken(*args, **kwargs):
            raise RuntimeError("no room")
        monkeypatch.setattr(model, "load_seq", broken)
        out = Collector(1)
        engine.submit([_gen_job(model, CONVERSATIONS[0] + NEXT_TURN, out)])
        assert out.done.wait(60) and out.events[-1][0] == "error" and "no room" in out.events[-1][2]
        monkeypatch.undo()
        assert engine.free_slots == [0] and not engine.slot_tokens
        assert _run(engine, [_gen_job(model, CONVERSATIONS[2], None)])[0]
    finally:
        engine.stop()


# ---------------------------------------------------------------- --cache-reuse: KV shifts

SHIFT_TEXT = "Once upon a time there was a small model that read numbers and wrote words"


def _k_rows(kv, seq, il=0):
    import numpy as np
    import torch
    from torchggml.backend.tensor_io import backend_tensor_get
    cells = np.flatnonzero(kv.cell_seq == seq)
    cells = cells[np.argsort(kv.cell_pos[cells])]
    t = kv.k[il]
    raw = torch.empty((kv.n_ctx, t.nb[1]), dtype=torch.uint8)
    backend_tensor_get(t, raw.view(-1), 0, raw.numel())
    return kv.cell_pos[cells].tolist(), raw.view(torch.float32)[cells]


def test_a_shifted_k_is_the_k_rotated_at_its_new_position():
    """Layer 0's K depends on its token alone: after dropping B from A + B + C and shifting C, its
    rows equal A + C evaluated fresh (F32 cache: to the rotation's float32 rounding)."""
    from torchggml.gguf.writer.demo import demo_model_path
    from torchggml.models import load_model
    m = load_model(demo_model_path(), n_ctx=128, kv_type="f32", progress=False)
    try:
        ids = m.tokenize(SHIFT_TEXT)
        a, b, c = ids[:4], ids[4:9], ids[9:]
        m.eval(a + b + c, seq_id=0)
        m.eval(a + c, seq_id=1)
        m.remove(0, len(a), len(a + b))
        m.shift(0, len(a + b), len(ids), -len(b))
        (pos0, k0), (pos1, k1) = _k_rows(m.memory.attention, 0), _k_rows(m.memory.attention, 1)
        assert pos0 == pos1 == list(range(len(a + c)))
        assert (k0 - k1).abs().max() < 1e-5
    finally:
        m.close()


def test_a_shift_continues_as_llama_cpps(demo_path, llama_cpp):
    """The same drop and shift in llama.cpp (llama_memory_seq_rm / seq_add, its K shift) and here,
    then the same new tokens: the logits agree (the reused cells keep their old context in both)."""
    import torch
    from torchggml.models import load_model
    m = load_model(demo_path, n_ctx=64, progress=False)
    llm = llama_cpp.Llama(model_path=demo_path, n_ctx=64, logits_all=True, verbose=False)
    try:
        ids = m.tokenize(SHIFT_TEXT)
        a, b, c, d = ids[:3], ids[3:8], ids[8:13], ids[13:]
        m.eval(a + b + c)
        llm.eval(a + b + c)
        m.remove(0, len(a), len(a + b))
        m.shift(0, len(a + b), len(a + b + c), -len(b))
        mem = llama_cpp.llama_get_memory(llm._ctx.ctx)
        llama_cpp.llama_memory_seq_rm(mem, 0, len(a), len(a + b))
        llama_cpp.llama_memory_seq_add(mem, 0, len(a + b), -1, -len(b))
        llm.n_tokens = len(a + c)
        llm.eval(d)
        ours = m.eval(d, logits="all")
        theirs = torch.tensor(llm.scores[len(a + c): len(a + c + d)])
        assert (ours - theirs).abs().max() < 1e-2  # (the same tokens evaluated plainly differ by 3.5e-3 here)
        assert ours.argmax(-1).tolist() == theirs.argmax(-1).tolist()
    finally:
        m.close()
        llm.close()


def test_cache_reuse_moves_the_runs_that_continue_the_prompt(model, demo_path):
    """A prompt A + C + D after a slot held A + B + C: with cache_reuse 2 the slot's C is moved (not
    evaluated again: n_cached = |A| + |C|), and the reply is the one the model gives after the same
    drop and shift and D (greedy, same chunks); without it only A is reused."""
    from torchggml.models import load_model
    ids = model.tokenize(SHIFT_TEXT)
    a, b, c, d = ids[:3], ids[3:8], ids[8:13], ids[13:]
    ref = load_model(demo_path, n_ctx=256, n_batch=8, progress=False)
    try:
        ref.eval(a + b + c)
        ref.remove(0, len(a), len(a + b))
        ref.shift(0, len(a + b), len(a + b + c), -len(b))
        expect, logits = [], ref.eval(d, logits="last")[-1]
        for _ in range(6):
            expect.append(int(logits.argmax()))
            logits = ref.eval(expect[-1:], logits="last")[-1]
    finally:
        ref.close()
    for reuse, cached in ((2, len(a + c)), (0, len(a))):
        engine = Engine(model, parallel=1, cache_reuse=reuse)
        try:
            _run(engine, [_gen_job(model, a + b + c, None, ignore_eos=True)])
            second = _gen_job(model, a + c + d, None, ignore_eos=True)
            got = _run(engine, [second])[0]
            assert second.n_cached == cached and engine.stats.reused_tokens == cached - len(a)
            if reuse:
                assert got == expect
        finally:
            engine.stop()


def test_cache_reuse_is_off_where_k_cannot_shift(other_model):
    engine = Engine(other_model["mamba2"], parallel=1, cache_reuse=4)
    try:
        assert engine.cache_reuse == 0 and "not a KV cache alone" in engine.cache_reuse_off
    finally:
        engine.stop()
