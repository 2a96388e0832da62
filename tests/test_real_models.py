"""Two real trained models, as a user meets them: SmolLM2-135M-Instruct Q4_1 (llama, 49k
vocabulary, a chat template) and Gemma 3 270M Q4_K_M (gemma3, 262k vocabulary, tied Q8_0 head,
Q5_0 / Q4_K / Q6_K layers, no chat template), fetched by scripts/fetch_real_models.py (.ci/run
runs it first).

Against llama.cpp's outputs recorded by scripts/make_real_model_refs.py
(tests/data/real_models/llama_cpp.json): token ids, greedy continuations, perplexity of a fixed
text, chat prompts. Against a float64 forward pass of the dequantized weights
(tests/real_model_reference.py, kept in the models' cache folder once computed): every
position's logits. Skipped, with the fetch's reason, when the files could not be fetched.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data" / "real_models"
REFS = json.loads((DATA / "llama_cpp.json").read_text(encoding="utf-8"))
SMOL, GEMMA = "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"
MODELS = [SMOL, GEMMA]
N_CTX = 256  # the perplexity windows' size too (REFS[...]["perplexity"]["n_ctx"])


def _fetch_module():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import fetch_real_models
    finally:
        sys.path.pop(0)
    return fetch_real_models


def model_path(file: str) -> Path:
    """The fetched file, or a skip with the reason the fetch left."""
    fetch = _fetch_module()
    root = fetch.cache_dir()
    path = root / file
    if not path.is_file():
        status = root / fetch.STATUS_FILE
        reason = status.read_text().strip() if status.is_file() else "run scripts/fetch_real_models.py"
        pytest.skip(f"real model {file} not fetched: {reason}")
    return path


@pytest.fixture(scope="module")
def real(request):
    """(file name, path, loaded model) of request.param (parametrized indirectly)."""
    from torchggml.models import load_model
    path = model_path(request.param)
    model = load_model(path, n_ctx=N_CTX, progress=False)
    yield request.param, path, model
    model.close()


def _by_model(cases):
    return [(m, c) for m in MODELS for c in cases(m)]


each_model = pytest.mark.parametrize("real", MODELS, indirect=True)


# ---------------------------------------------------------------- loading

@pytest.mark.parametrize("file, arch, n_vocab, n_layer", [(SMOL, "llama", 49152, 30), (GEMMA, "gemma3", 262144, 18)])
def test_loads(file, arch, n_vocab, n_layer):
    from torchggml.models import load_model
    model = load_model(model_path(file), n_ctx=64, progress=False)
    try:
        assert (model.file.arch, model.n_vocab, model.hp.n_layer) == (arch, n_vocab, n_layer)
        assert model.eval(model.tokenize("Hi"), logits="last").shape == (1, n_vocab)
    finally:
        model.close()


# ---------------------------------------------------------------- tokens

@pytest.mark.parametrize("real, prompt", _by_model(lambda m: list(REFS[m]["tokens"])), indirect=["real"])
def test_tokens_equal_llama_cpp(real, prompt):
    name, _, model = real
    assert model.tokenize(prompt) == REFS[name]["tokens"][prompt]


# ---------------------------------------------------------------- logits against float64

# relative (Frobenius) error bounds of every position's logits; llama.cpp's own on the same
# prompt, which rounds activations to 8 bits: 0.050 (SmolLM2), 0.044 (Gemma)
LOGIT_BOUNDS = {SMOL: 0.03, GEMMA: 0.042}
LOGIT_PROMPT = "The capital of France is"


def reference_logits(path: Path, tokens: list[int]) -> np.ndarray:
    """float64 logits of the dequantized weights, computed once and kept beside the file."""
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        from real_model_reference import logits
    finally:
        sys.path.pop(0)
    key = hashlib.sha256(json.dumps([path.name, path.stat().st_size, tokens]).encode()).hexdigest()[:16]
    cached = path.with_name(f"{path.stem}.reference-{key}.npy")
    if cached.is_file():
        return np.load(cached)
    ref = logits(path, tokens)
    np.save(cached, ref)
    return ref


@each_model
def test_logits_close_to_float64_reference(real):
    name, path, model = real
    tokens = REFS[name]["tokens"][LOGIT_PROMPT]
    ref = reference_logits(path, tokens)
    model.reset()
    ours = model.eval(tokens).double().numpy()
    model.reset()
    err = np.linalg.norm(ours - ref) / np.linalg.norm(ref)
    assert err < LOGIT_BOUNDS[name], f"{name}: relative error {err:.4f}"
    assert (ours.argmax(axis=1) == ref.argmax(axis=1)).all()


# A prompt of 16 tokens and more runs the GEMMs, which round activations to 8 bits for some types
# (as ggml's Q8_0 and Q8_K do: docs/cpu.md): there llama.cpp's accuracy is the bound, with a margin
# for the order of the sums
LONG_MARGIN = 1.1


@each_model
def test_long_prompt_logits_as_close_to_float64_as_llama_cpps(real):
    name, path, model = real
    case = REFS[name]["long_prompt"]
    ref = reference_logits(path, case["tokens"])
    model.reset()
    ours = model.eval(case["tokens"]).double().numpy()
    model.reset()
    err = np.linalg.norm(ours - ref) / np.linalg.norm(ref)
    assert err < LONG_MARGIN * case["llama_cpp_error"], f"{name}: {err:.4f}, llama.cpp {case['llama_cpp_error']:.4f}"


# ---------------------------------------------------------------- greedy text

# two engines' logits differ by rounding (llama.cpp rounds activations to 8 bits): where the top
# two tokens are within NEAR_TIE logits of each other either may win
NEAR_TIE = 0.5


@pytest.mark.parametrize("real, prompt", _by_model(lambda m: list(REFS[m]["greedy"])), indirect=["real"])
def test_greedy_follows_llama_cpp(real, prompt):
    """Fed llama.cpp's greedy continuation, torchggml's argmax is llama.cpp's token at every
    step but near-ties (at most two of the steps); its own greedy text equals llama.cpp's up to
    the first near-tie where it chose the other token."""
    from torchggml.models import SamplingParams
    name, _, model = real
    expected = [t for t in REFS[name]["greedy"][prompt] if t not in model.tokenizer.eog_ids]
    ids = model.tokenize(prompt)
    model.reset()
    rows = model.eval(ids + expected).numpy()[len(ids) - 1: len(ids) - 1 + len(expected)]
    model.reset()
    gaps = [float(row.max() - row[t]) for row, t in zip(rows, expected)]
    assert all(g < NEAR_TIE for g in gaps), gaps
    assert sum(g > 0 for g in gaps) <= 2, gaps
    first_other = next((i for i, g in enumerate(gaps) if g > 0), len(expected))
    ours = [c.token for c in model.generate_tokens(ids, len(expected), SamplingParams(temperature=0.0))]
    assert ours[:first_other] == expected[:first_other], model.detokenize(ours)


# ---------------------------------------------------------------- perplexity

@each_model
def test_perplexity_within_half_a_percent_of_llama_cpp(real):
    from torchggml.tools.perplexity import perplexity
    name, _, model = real
    ref = REFS[name]["perplexity"]
    assert model.n_ctx == ref["n_ctx"]
    ours = perplexity(model, (DATA / "text.txt").read_text(encoding="utf-8"))
    assert ours.n_windows == ref["windows"]
    assert abs(ours.ppl - ref["ppl"]) / ref["ppl"] < 0.005, (ours.ppl, ref["ppl"])


# ---------------------------------------------------------------- chat

def test_chat_prompt_as_llama_cpp_renders_the_files_template():
    """SmolLM2's own template (with its default system message), as llama-cpp-python renders
    it; the special tokens of the prompt become single tokens."""
    from torchggml.models import load_model
    chat = REFS[SMOL]["chat"]
    model = load_model(model_path(SMOL), vocab_only=True)
    prompt = model.chat_prompt(chat["messages"])
    assert prompt == chat["prompt"]
    assert model.tokenize(prompt, add_special=False, parse_special=True) == chat["tokens"]


@pytest.mark.parametrize("name", ["chatml", "gemma"])
def test_builtin_chat_formats_equal_llama_cpps(name):
    """llama.cpp's built-in formats (llama_chat_apply_template), system message included."""
    from torchggml.text.chat import BUILTIN_TEMPLATES, render_chat
    chat = REFS["builtin_chat"]
    assert render_chat(BUILTIN_TEMPLATES[name], chat["messages"]) == chat[name]


def test_gemma_without_a_template_chats_in_chatml_as_llama_cpp():
    """Gemma's file has no tokenizer.chat_template: llama.cpp falls back to chatml (not an
    architecture's format) and so does torchggml, saying so; --chat-template gemma gives
    gemma's turns."""
    from torchggml.models import load_model
    model = load_model(model_path(GEMMA), vocab_only=True)
    chosen = model.chat_template()
    assert chosen.name == "chatml" and "has no tokenizer.chat_template: using chatml" in chosen.note
    messages = REFS["builtin_chat"]["messages"]
    assert model.chat_prompt(messages) == REFS["builtin_chat"]["chatml"]
    model.chat_template_override = "gemma"
    assert model.chat_prompt(messages) == REFS["builtin_chat"]["gemma"]
    assert model.chat_stops() == []  # <end_of_turn> is one of Gemma's tokens (an end of generation)
