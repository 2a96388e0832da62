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
        assert third.seq_id in (0, 1) and engine.free_slots == [0, 1] and model.n_past == 0
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
        assert engine.stats.sequences_finished["cancelled"] == 1 and model.n_past == 0
    finally:
        engine.stop()


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
