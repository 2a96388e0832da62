"""Logits for chosen tokens only (Model.eval(..., logits="last"), llama.cpp's inp_out_ids): for every
architecture (the tiny models of tests/data/archs) and the golden models, the last token's logits
equal the last row of logits="all", the KV cache ends bit-identical, decode steps afterwards are
identical, in one micro-batch or several; eval_batch's last rows equal each sequence alone; the
graph really computes the output head for one row; non-finite logits are still caught.

Tolerances. With float32 weights the two graphs differ only in how many rows the last layer's FFN
and the head multiply (1 instead of n): float32 rounding, held to 1e-5 relative to the largest
logit (measured <= 3e-7). With F16 or quantized weights the CPU takes another kernel for one row
than for many (activations quantized to Q8 or rounded to half for the row-count's path, as
llama.cpp's CPU backend does too: here dequantize + GEMM from 4 rows, Q8 activations below, and
bf16 activations for repacked Q4_0), so the last token's logits move by that rounding: measured
<= 1.7e-2 relative L2 on the tiny models (Q4_0 repacked; Q8_0 <= 1e-2, F16 3e-4, MXFP4 2e-7);
held to 3e-2 (under the golden threshold 4e-2) with the same argmax. The cache
and decode steps do not depend on the outputs and are compared exactly.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from torchggml.backend.tensor_io import backend_tensor_get, backend_tensor_set
from torchggml.enums import Op
from torchggml.models import load_model
from torchggml.models.model import NonFiniteLogitsError

from test_archs import MANIFEST as ARCH_MANIFEST, tiny_model_path

GOLDEN = Path(os.environ.get("TORCHGGML_GOLDEN", Path(__file__).resolve().parents[2] / "shared" / "golden"))
GOLDEN_MANIFEST = json.loads((GOLDEN / "manifest.json").read_text()) if (GOLDEN / "manifest.json").exists() else []
needs_golden = pytest.mark.skipif(not GOLDEN_MANIFEST, reason=f"golden data not found at {GOLDEN}")

FLOAT_RTOL = 1e-5          # float32 weights: max |difference| / max |logit|
ROUNDED_MAX_REL_L2 = 3e-2  # F16 / quantized weights: relative L2 (see the module doc)

# every architecture in float32, and the product paths of some quantized types
ARCH_KEYS = sorted(k for k in ARCH_MANIFEST if ARCH_MANIFEST[k]["weights"] == "F32") + \
    ["gemma3-Q4_0", "gemma3-F16", "llama-moe-Q8_0", "gpt-oss-MXFP4"]
# gemma3n's 22 AltUp layers take seconds a shape here: with pytest --slow
SLOW_KEYS = {"gemma3n-F32"}
ARCH_KEYS = [pytest.param(k, marks=pytest.mark.slow) if k in SLOW_KEYS else k for k in ARCH_KEYS]

# (prompt length, n_batch): one micro-batch; a single token (no selection at all); micro-batches
# without outputs, then a last one of 1 token (no selection) or of 2 (GET_ROWS of one)
PROMPTS = [(18, 512), (1, 512), (13, 6), (14, 6)]
DECODE_STEPS = 2


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def assert_same_logits(last: torch.Tensor, ref: torch.Tensor, weights: str, what: str) -> None:
    """`last` [1, n_vocab] against `ref`, the same token's row of logits="all"."""
    assert last.shape == ref.shape == (1, ref.shape[1]), what
    if weights == "F32":
        scale = float(ref.abs().max())
        err = float((last - ref).abs().max())
        assert err <= FLOAT_RTOL * scale, f"{what}: max |difference| {err:.2e} (largest logit {scale:.2f})"
    else:
        err = rel_l2(last, ref)
        assert err <= ROUNDED_MAX_REL_L2 and int(last.argmax()) == int(ref.argmax()), \
            f"{what}: relative L2 {err:.2e}, argmax {int(last.argmax())} vs {int(ref.argmax())}"


def cache_contents(model) -> list[torch.Tensor]:
    return [backend_tensor_get(t).clone() for t in model.memory.tensors()]


def run(model, tokens, n_prompt: int, logits: str):
    """The prompt with `logits`, then DECODE_STEPS single tokens: (prompt logits, cache after the
    prompt, decode logits)."""
    model.reset()
    prompt = model.eval(tokens[:n_prompt], logits=logits)
    cache = cache_contents(model)
    steps = torch.cat([model.eval([t]) for t in tokens[n_prompt: n_prompt + DECODE_STEPS]])
    return prompt, cache, steps


def check_last_equals_all(model, tokens, n_prompt: int, weights: str, what: str) -> torch.Tensor:
    every, cache_all, steps_all = run(model, tokens, n_prompt, "all")
    last, cache_last, steps_last = run(model, tokens, n_prompt, "last")
    assert every.shape == (n_prompt, model.n_vocab)
    assert_same_logits(last, every[-1:], weights, what)
    assert all(torch.equal(a, b) for a, b in zip(cache_all, cache_last)), f"{what}: KV cache differs"
    assert torch.equal(steps_all, steps_last), f"{what}: decode steps differ"
    return last


_models: dict = {}


def cached_model(path, **options):
    key = (str(path), repr(sorted(options.items())))
    if key not in _models:
        _models[key] = load_model(path, progress=False, **options)
    return _models[key]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("archs")


def teardown_module():
    for m in _models.values():
        m.close()
    _models.clear()


@pytest.mark.parametrize("n_prompt,n_batch", PROMPTS, ids=[f"p{p}-b{b}" for p, b in PROMPTS])
@pytest.mark.parametrize("key", ARCH_KEYS)
def test_last_logits_equal_the_last_row_of_all(key, n_prompt, n_batch, model_dir):
    entry = ARCH_MANIFEST[key]
    model = cached_model(tiny_model_path(key, entry, model_dir), n_ctx=entry["n_ctx"], n_batch=n_batch)
    assert n_prompt + DECODE_STEPS <= len(entry["tokens"])
    if getattr(model.arch, "encoder_decoder", False):  # t5: the decoder reads an encoded input
        model.encode(entry["tokens"][:min(8, n_batch)])
    check_last_equals_all(model, entry["tokens"], n_prompt, entry["weights"], f"{key} p{n_prompt} b{n_batch}")


# (golden model, n_batch): one micro-batch, and 16 tokens as 5, 5, 5, 1 / 7, 7, 2
GOLDEN_CASES = [("llama-F32", 512), ("llama-F32", 5), ("qwen2-F32", 7), ("qwen3-F16-tied", 512),
                ("llama-Q4_0", 512), ("llama-Q4_K_M", 7)]


@needs_golden
@pytest.mark.parametrize("name,n_batch", GOLDEN_CASES, ids=[f"{n}-b{b}" for n, b in GOLDEN_CASES])
def test_golden_last_logits(name, n_batch):
    """As above, and the last token's logits still match llama.cpp's (the golden thresholds)."""
    entry = next(e for e in GOLDEN_MANIFEST if Path(e["model"]).stem == name)
    model = cached_model(GOLDEN / entry["model"], n_batch=n_batch)
    tokens = entry["tokens"]
    n_prompt = len(tokens) - DECODE_STEPS
    last = check_last_equals_all(model, tokens, n_prompt, entry["weights"], f"{name} b{n_batch}")
    ref = torch.from_numpy(np.load(GOLDEN / entry["logits"]))[n_prompt - 1: n_prompt]
    max_err = 2e-3 if entry["weights"] in ("F32", "F16") else 4e-2  # tests/test_models.py's thresholds
    assert rel_l2(last, ref) <= max_err and int(last.argmax()) == int(ref.argmax())


@needs_golden
@pytest.mark.parametrize("n_batch", [512, 7, 4])
def test_eval_batch_last_equals_each_sequence_alone(n_batch):
    """Each sequence's last row of a batch (micro-batches cut across sequences) equals the batch's
    logits="all" row, and that sequence evaluated alone with logits="last"; the cache is the same."""
    entry = next(e for e in GOLDEN_MANIFEST if Path(e["model"]).stem == "llama-F32")
    t = entry["tokens"]
    model = cached_model(GOLDEN / entry["model"], n_batch=n_batch)
    prompts, seq_ids = [t[:10], t[2:8], [t[3]], t[5:14]], [4, 0, 1, 2]
    model.reset()
    every = model.eval_batch(prompts, seq_ids=seq_ids)
    cache_all = cache_contents(model)
    model.reset()
    last = model.eval_batch(prompts, seq_ids=seq_ids, logits="last")
    assert all(torch.equal(a, b) for a, b in zip(cache_all, cache_contents(model)))
    step = model.eval_batch([[t[10]], [t[8]]], seq_ids=[4, 2], logits="last")
    assert [tuple(x.shape) for x in step] == [(1, model.n_vocab)] * 2
    assert model.n_past == 10 + 6 + 1 + 9 + 2
    for prompt, rows, every_rows in zip(prompts, last, every):
        model.reset()
        alone = model.eval(prompt, logits="last")
        assert rows.shape == (1, model.n_vocab)
        # other micro-batch cuts change every layer's product shapes: the tolerance of
        # tests/test_models.py's eval_batch test
        assert rel_l2(rows, alone) < 1e-4
        assert_same_logits(rows, every_rows[-1:], "F32", "eval_batch last vs all")


@needs_golden
@pytest.mark.parametrize("n_prompt,n_batch,n_outputs", [(16, 512, 1), (16, 5, 1), (1, 512, 1)])
def test_the_head_runs_for_the_output_rows_only(n_prompt, n_batch, n_outputs):
    """The graph of the final micro-batch multiplies output.weight (and the last layer's ffn_down)
    by n_outputs columns; a micro-batch without outputs ends at the cache writes (no head)."""
    entry = next(e for e in GOLDEN_MANIFEST if Path(e["model"]).stem == "llama-F32")
    model = cached_model(GOLDEN / entry["model"], n_batch=n_batch)
    model.reset()
    model.eval(entry["tokens"][:n_prompt], logits="last")
    g = model.last_graph
    assert (g.n_tokens, g.n_outputs) == (n_prompt - (n_prompt - 1) // n_batch * n_batch, n_outputs)
    assert tuple(g.logits.ne[:2]) == (model.n_vocab, n_outputs)
    last_down = model.weights.layers[-1].ffn_down
    products = {id(n.src[0]): n for n in g.graph.nodes if n.op == Op.MUL_MAT}
    assert products[id(model.weights.output)].ne[1] == n_outputs and products[id(last_down)].ne[1] == n_outputs
    assert (g.out_ids is None) == (n_outputs == g.n_tokens)
    if n_batch < n_prompt:  # an earlier micro-batch: its graph for 0 outputs has no head
        empty = model.build_graph(model._ctx, n_batch, g.n_kv, n_outputs=0)
        assert empty.logits is None
        weights = {id(n.src[0]) for n in empty.graph.nodes if n.op == Op.MUL_MAT}
        assert id(model.weights.output) not in weights and id(last_down) not in weights
        assert id(model.weights.layers[-1].attn_k) in weights  # the last layer's K and V are still written


@needs_golden
def test_logits_choice_is_checked():
    entry = next(e for e in GOLDEN_MANIFEST if Path(e["model"]).stem == "llama-F32")
    model = cached_model(GOLDEN / entry["model"])
    model.reset()
    with pytest.raises(ValueError, match=r"eval: logits='first'; choose 'all' .* or 'last'"):
        model.eval([1, 2], logits="first")
    with pytest.raises(ValueError, match=r"eval_batch: logits=True"):
        model.eval_batch([[1, 2]], logits=True)
    assert model.n_past == 0
    assert model.eval([], logits="last").shape == (0, model.n_vocab)


@needs_golden
def test_non_finite_last_logits_raise_and_leave_the_cache_as_it_was():
    """NaN in layer 0's K/V of every micro-batch reaches the one computed row: caught, named by
    its token, the cache restored."""
    entry = next(e for e in GOLDEN_MANIFEST if Path(e["model"]).stem == "llama-F32")
    model = cached_model(GOLDEN / entry["model"], n_batch=3)
    tokens = entry["tokens"][:8]
    model.reset()
    model.eval(tokens[:4])
    want = model.eval(tokens[4:], logits="last")
    norm = model.weights.layers[0].attn_norm
    saved = backend_tensor_get(norm).clone()
    model.reset()
    model.eval(tokens[:4])
    backend_tensor_set(norm, torch.full_like(saved, float("nan")))
    try:
        with pytest.raises(NonFiniteLogitsError, match=r"first at token 3, position 7\); the cache was restored to 4"):
            model.eval(tokens[4:], logits="last")
        assert model.n_past == 4
    finally:
        backend_tensor_set(norm, saved)
    assert torch.equal(model.eval(tokens[4:], logits="last"), want)


# placements: an accelerator (the SIM device's kernel table), layers split over CPU and SIM0
# through the scheduler (the output rows cross devices), tensor parallelism over a meta device
PLACEMENTS = {"SIM0": dict(devices=["SIM0"]), "CPU+SIM0": dict(devices=["CPU", "SIM0"]),
              "Meta(SIM0,SIM1)": dict(tensor_parallel=["SIM0", "SIM1"])}


@needs_golden
@pytest.mark.parametrize("n_batch", [512, 6])
@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
def test_last_logits_on_other_placements(placement, n_batch):
    from torchggml.models.placement import find_device
    try:
        find_device("SIM1")
    except ValueError:
        pytest.skip("SIM devices not available")
    entry = next(e for e in GOLDEN_MANIFEST if Path(e["model"]).stem == "llama-F32")
    model = cached_model(GOLDEN / entry["model"], n_batch=n_batch, **PLACEMENTS[placement])
    check_last_equals_all(model, entry["tokens"], len(entry["tokens"]) - DECODE_STEPS, "F32", placement)
