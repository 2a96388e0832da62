"""The continuous-batching engine in-process: prompts in chunks beside running decodes, slots
freed and reused, cancellation, the queue bound."""
from __future__ import annotations

import threading

import pytest

from torchggml.models.generation import Generation
from torchggml.models.sampling import SamplingParams
from torchggml.server.engine import Engine, Job, QueueFull


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
    tail, so they never reuse: tests/test_recurrent_memory.py.)"""
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
    micro_batches = []
    real = model._eval_ubatch
    monkeypatch.setattr(model, "_eval_ubatch", lambda ids, *a, **k: (micro_batches.append(len(ids)), real(ids, *a, **k))[1])
    updates = batch.step()
    assert micro_batches == [n_seqs] and len(updates) == n_seqs
