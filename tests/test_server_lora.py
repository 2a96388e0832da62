"""LoRA adapters in the server (serve --lora, GET/POST /lora-adapters, a request's `lora` scales)
and id_slot, on the demo model served in this process: each answer equals Model.generate on a
reference copy carrying the same adapters at the same scales (models/lora.py's LoraSet); requests
with different scales at once each get their own."""
from __future__ import annotations

import concurrent.futures

import pytest
import torch

from conftest import serving
from torchggml.models import load_model
from torchggml.models.lora import LoraAdapter, LoraSet

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def adapters(demo_path, tmp_path_factory):
    """Two adapter files for the demo with nonzero B (rank 4, seeded)."""
    d, paths = tmp_path_factory.mktemp("lora"), []
    m = load_model(demo_path, progress=False)
    for seed in (1, 2):
        adapter = m.add_lora(4, seed=seed)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, view in adapter.parameters().items():
                if name.endswith("lora_b"):
                    view.copy_(torch.randn(view.shape, generator=g) * 0.5)
        paths.append(adapter.save(d / f"a{seed}.gguf"))
    m.close()
    return paths


@pytest.fixture(scope="module")
def served(demo_path, adapters):
    model, reference = (load_model(demo_path, progress=False) for _ in range(2))
    with serving(model, parallel=2, loras=[(adapters[0], 1.0), (adapters[1], 0.0)]) as client:
        yield client, reference
    model.close()
    reference.close()


def expected(ref, paths, scales) -> str:
    ref.set_lora(LoraSet(LoraAdapter.load(ref, p, s) for p, s in zip(paths, scales)) if any(scales) else None)
    ref.reset()
    return "".join(ref.generate(PROMPT, max_tokens=8, temperature=0))


def complete(client, **fields) -> dict:
    r = client.post("/completion", json={"prompt": PROMPT, "n_predict": 8, "temperature": 0, **fields})
    assert r.status_code == 200, r.text
    return r.json()


CASES = [  # (the request's lora field, the scales it runs with)
    (None, (1.0, 0.0)),                                  # the server's (--lora-scaled)
    ([], (0.0, 0.0)),                                    # none listed: all 0
    ([{"id": 0, "scale": 0.5}], (0.5, 0.0)),
    ([{"id": 1, "scale": 1.0}], (0.0, 1.0)),
    ([{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.7}], (1.0, 0.7)),
]


@pytest.mark.parametrize("lora,scales", CASES)
def test_request_scales(served, adapters, lora, scales):
    client, ref = served
    got = complete(client, **({} if lora is None else {"lora": lora}))["content"]
    assert got == expected(ref, adapters, scales)


def test_adapters_change_the_output(served, adapters):
    _, ref = served
    assert expected(ref, adapters, (1.0, 0.0)) != expected(ref, adapters, (0.0, 0.0))


def test_different_scales_at_once(served, adapters):
    """Sequences with other scales wait for the running ones (not batched together) and get theirs."""
    client, ref = served
    asks = [[{"id": 0, "scale": 1.0}], [], [{"id": 1, "scale": 1.0}], [{"id": 0, "scale": 1.0}]]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda lora: complete(client, lora=lora)["content"], asks))
    scales = {0: (1.0, 0.0), 1: (0.0, 0.0), 2: (0.0, 1.0), 3: (1.0, 0.0)}
    assert got == [expected(ref, adapters, scales[i]) for i in range(4)]


def test_lora_adapters_endpoint(served, adapters):
    client, ref = served
    assert client.get("/lora-adapters").json() == [{"id": 0, "path": adapters[0], "scale": 1.0},
                                                   {"id": 1, "path": adapters[1], "scale": 0.0}]
    try:
        r = client.post("/lora-adapters", json=[{"id": 1, "scale": 0.5}])
        assert r.status_code == 200 and [a["scale"] for a in r.json()] == [0.0, 0.5]
        assert complete(client)["content"] == expected(ref, adapters, (0.0, 0.5))
        chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                          "max_tokens": 2, "lora": [{"id": 0, "scale": 1}]})
        assert chat.status_code == 200, chat.text
    finally:
        client.post("/lora-adapters", json=[{"id": 0, "scale": 1.0}])


def test_id_slot(served):
    client, _ = served
    assert [complete(client, id_slot=s)["id_slot"] for s in (1, 0, 1)] == [1, 0, 1]


BAD = [  # (path, body, param, the message's words)
    ("/completion", {"prompt": "x", "lora": [{"id": 2, "scale": 1}]}, "lora", "no LoRA adapter 2"),
    ("/completion", {"prompt": "x", "lora": [{"id": 0}]}, "lora", ""),
    ("/v1/completions", {"prompt": "x", "id_slot": 2}, "id_slot", "slots 0..1"),
    ("/completion", {"prompt": "x", "id_slot": -2}, "id_slot", ""),
    ("/lora-adapters", [{"id": 5, "scale": 1}], "body", "no LoRA adapter 5"),
    ("/lora-adapters", {"id": 0}, None, ""),
]


@pytest.mark.parametrize("path,body,param,words", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input(served, path, body, param, words):
    r = served[0].post(path, json=body)
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    assert param is None or r.json()["error"]["param"] == param


def test_no_adapters(demo_path):
    m = load_model(demo_path, progress=False)
    try:
        with serving(m) as client:
            assert client.get("/lora-adapters").json() == []
            assert client.post("/lora-adapters", json=[]).status_code == 400
            r = client.post("/completion", json={"prompt": "x", "n_predict": 1, "lora": [{"id": 0, "scale": 1}]})
            assert r.status_code == 400 and "serve with --lora" in r.json()["error"]["message"]
    finally:
        m.close()
