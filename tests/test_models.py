"""Models end to end against llama.cpp: every golden model's logits, evaluated in one batch and as
a prompt followed by single-token steps, on the CPU and on a simulated accelerator; flash
attention, quantized KV caches, micro-batches, mixed placements through the scheduler; the
Python API (eval/reset/generate, vocab_only), the built-in demo model and the CLI commands."""
from __future__ import annotations

import re

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from torchggml.models import load_model, plan_placement, sample_token
from torchggml.models.placement import find_device

GOLDEN = Path(os.environ.get("TORCHGGML_GOLDEN", Path(__file__).resolve().parents[2] / "shared" / "golden"))
HAVE_GOLDEN = (GOLDEN / "manifest.json").exists()
needs_golden = pytest.mark.skipif(not HAVE_GOLDEN, reason=f"golden data not found at {GOLDEN}")
MANIFEST = json.loads((GOLDEN / "manifest.json").read_text()) if HAVE_GOLDEN else []

# the thresholds of issue 6 (llama.cpp keeps its KV cache in F16 and quantizes activations)
MAX_ERR_FLOAT, MAX_ERR_QUANT, MIN_ARGMAX = 2e-3, 4e-2, 0.9
# Quantized models on the SIM device run the Triton kernels in the interpreter: about a minute
# per model. Q4_0 always runs there (the Triton path end to end); the other quantized models run
# on SIM with pytest --slow (their kernels are covered by test_triton_kernels.py, and all of them
# run on the CPU device); the float models always run on SIM.
ALWAYS_ON_SIM = {"Q4_0"}


def sim_available() -> bool:
    try:
        find_device("SIM0")
        return True
    except ValueError:
        return False


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))


def argmax_agreement(ours: np.ndarray, ref: np.ndarray) -> float:
    return float((ours.argmax(1) == ref.argmax(1)).mean())


def check_logits(ours: torch.Tensor, entry: dict, max_err: float | None = None, min_argmax: float = MIN_ARGMAX):
    ref = np.load(GOLDEN / entry["logits"])
    assert ours.dtype == torch.float32 and tuple(ours.shape) == ref.shape
    quantized = entry["weights"] not in ("F32", "F16")
    max_err = max_err if max_err is not None else (MAX_ERR_QUANT if quantized else MAX_ERR_FLOAT)
    err, agree = rel_err(ours.numpy(), ref), argmax_agreement(ours.numpy(), ref)
    assert err <= max_err and agree >= min_argmax, \
        f"{entry['model']}: relative L2 error {err:.2e} (max {max_err:.0e}), argmax agreement {agree:.2f}"


def eval_steps(model, tokens, n_prompt: int = 8) -> torch.Tensor:
    """A prompt in one call, then one token per call (decode steps against the KV cache)."""
    model.reset()
    rows = [model.eval(tokens[:n_prompt])] + [model.eval([t]) for t in tokens[n_prompt:]]
    assert model.n_past == len(tokens)
    return torch.cat(rows)


_models: dict = {}


def golden_model(entry, device="CPU", **kw):
    """Loaded models, shared between the tests of this module (loading is the slow part)."""
    key = (entry["model"], device, tuple(sorted(kw.items())))
    if key not in _models:
        _models[key] = load_model(GOLDEN / entry["model"], devices=[device], progress=False, **kw)
    model = _models[key]
    model.reset()
    return model


def golden_cases():
    cases = []
    for entry in MANIFEST:
        quantized = entry["weights"] not in ("F32", "F16")
        for device in ("CPU", "SIM0"):
            marks = []
            if device == "SIM0" and quantized and entry["weights"] not in ALWAYS_ON_SIM:
                marks = [pytest.mark.slow]  # Triton in the interpreter
            cases.append(pytest.param(entry, device, id=f"{Path(entry['model']).stem}-{device}", marks=marks))
    return cases


# ---------------------------------------------------------------- llama.cpp's logits

@needs_golden
@pytest.mark.parametrize("entry,device", golden_cases())
def test_golden_logits(entry, device):
    if device != "CPU" and not sim_available():
        pytest.skip("SIM device not available")
    assert entry["chunks"] == [len(entry["tokens"])]  # the references were made in one batch
    model = golden_model(entry, device)
    check_logits(model.eval(entry["tokens"]), entry)  # one batch
    # prompt, then decode steps; a quantized model's steps on SIM run Triton's matvec in the
    # interpreter (seconds a step, whatever the position): there the last two tokens are steps
    interpreted = device != "CPU" and entry["weights"] not in ("F32", "F16")
    n_prompt = len(entry["tokens"]) - 2 if interpreted else 8
    check_logits(eval_steps(model, entry["tokens"], n_prompt), entry)


def entry_named(name: str) -> dict:
    return next(e for e in MANIFEST if Path(e["model"]).stem == name)


# (model, load_model options, max error (None: the model's default), min argmax agreement)
VARIANTS = [
    ("llama-F32", dict(flash_attn=True), None, MIN_ARGMAX),
    ("qwen2-F32", dict(flash_attn=True), None, MIN_ARGMAX),
    ("qwen3-F16-tied", dict(flash_attn=True), None, MIN_ARGMAX),
    ("llama-Q4_0", dict(flash_attn=True), None, MIN_ARGMAX),
    ("llama-F32", dict(n_batch=5), None, MIN_ARGMAX),  # 16 tokens in micro-batches 5, 5, 5, 1
    ("llama-F32", dict(kv_type="f32"), None, MIN_ARGMAX),
    ("llama-F32", dict(flash_attn=True, kv_type="q8_0"), MAX_ERR_QUANT, MIN_ARGMAX),
    # a 4-bit K/V cache on random-weight activations: measured 7e-2 and 0.88
    ("llama-F32", dict(flash_attn=True, kv_type="q4_0"), 1.5e-1, 0.75),
    ("llama-F32", dict(flash_attn=True, kv_type="iq4_nl"), 1.5e-1, 0.75),
    ("qwen3-F16-tied", dict(flash_attn=True, kv_type="q8_0"), MAX_ERR_QUANT, MIN_ARGMAX),
]


@needs_golden
@pytest.mark.parametrize("name,options,max_err,min_argmax", VARIANTS,
                         ids=[f"{v[0]}-{'-'.join(f'{k}={x}' for k, x in v[1].items())}" for v in VARIANTS])
def test_golden_logits_variants(name, options, max_err, min_argmax):
    entry = entry_named(name)
    model = golden_model(entry, **options)
    check_logits(model.eval(entry["tokens"]), entry, max_err, min_argmax)
    check_logits(eval_steps(model, entry["tokens"]), entry, max_err, min_argmax)


# mixed placements run through the scheduler (several devices in one graph)
PLACEMENTS = [
    ("llama-F32", dict(n_gpu_layers=1)),                             # CPU layer 0, SIM layer 1
    ("qwen3-F16-tied", dict(n_gpu_layers=99, flash_attn=True)),     # input on the CPU, the rest on SIMs
    ("qwen2-F32", dict(devices=["SIM0", "SIM1"], tensor_split=[1, 1])),
    ("llama-F16", dict(devices=["SIM0", "CPU"])),
]


@needs_golden
@pytest.mark.parametrize("name,options", PLACEMENTS, ids=[f"{p[0]}-{i}" for i, p in enumerate(PLACEMENTS)])
def test_golden_logits_mixed_placement(name, options):
    if not sim_available():
        pytest.skip("SIM device not available")
    entry = entry_named(name)
    model = load_model(GOLDEN / entry["model"], progress=False, **options)
    assert not model.placement.single and model.sched is not None
    check_logits(model.eval(entry["tokens"]), entry)
    check_logits(eval_steps(model, entry["tokens"]), entry)
    model.close()


# ---------------------------------------------------------------- placement rules

def test_placement_rules():
    cpu = find_device("CPU")
    p = plan_placement(4)
    assert p.single and p.devices == [cpu] and p.layers == [cpu] * 4
    if not sim_available():
        pytest.skip("SIM device not available")
    s0, s1 = find_device("SIM0"), find_device("SIM1")
    p = plan_placement(4, devices=["SIM0"])
    assert (p.input, p.layers, p.output) == (s0, [s0] * 4, s0)
    p = plan_placement(4, devices=["SIM0", "SIM1"], tensor_split=[3, 1])
    assert (p.input, p.layers, p.output) == (s0, [s0, s0, s0, s1], s1) and p.devices == [s0, s1]
    p = plan_placement(4, devices=["SIM0"], n_gpu_layers=2)
    assert (p.input, p.layers, p.output) == (cpu, [cpu, cpu, s0, s0], cpu) and p.devices == [s0, cpu]
    p = plan_placement(4, devices=["SIM0"], n_gpu_layers=5)
    assert p.output is s0
    p = plan_placement(4, devices=["SIM0", "SIM1"], n_gpu_layers=99)
    assert p.layers == [s0, s0, s1, s1] and p.input is cpu and p.output is s1
    with pytest.raises(ValueError, match="unknown device 'NOPE0'"):
        plan_placement(4, devices=["NOPE0"])
    with pytest.raises(ValueError, match="tensor_split"):
        plan_placement(4, devices=["SIM0", "SIM1"], tensor_split=[1])


# ---------------------------------------------------------------- the Python API

@needs_golden
def test_eval_appends_to_the_cache_and_checks_its_input():
    entry = entry_named("llama-F32")
    model = golden_model(entry, n_ctx=20)
    assert model.n_ctx == 20 and model.n_past == 0
    assert model.eval([]).shape == (0, model.n_vocab)
    first = model.eval(entry["tokens"][:10])
    assert model.n_past == 10
    with pytest.raises(ValueError, match=r"KV cache is full: 10 tokens cached \+ 11 new > n_ctx=20"):
        model.eval(entry["tokens"][:11])
    with pytest.raises(ValueError, match=r"token id 512 is outside the vocabulary \[0, 512\)"):
        model.eval([1, 512])
    assert model.n_past == 10  # a rejected call leaves the cache alone
    model.reset()
    assert torch.equal(model.eval(torch.tensor(entry["tokens"][:10])), first)


@needs_golden
def test_quantized_kv_cache_needs_flash_attention():
    with pytest.raises(ValueError, match="kv_type 'q8_0' needs flash_attn=True"):
        load_model(GOLDEN / "models" / "llama-F32.gguf", kv_type="q8_0")
    with pytest.raises(ValueError, match="kv_type 'iq2_xxs' is not supported"):
        load_model(GOLDEN / "models" / "llama-F32.gguf", kv_type="iq2_xxs")
    with pytest.raises(ValueError, match="head size 32 is not a multiple of Q4_K's block size 256"):
        load_model(GOLDEN / "models" / "llama-F32.gguf", kv_type="q4_k", flash_attn=True)


@needs_golden
def test_vocab_only():
    path = GOLDEN / "vocab" / "ggml-vocab-llama-spm.gguf"
    model = load_model(path, vocab_only=True)
    ids = model.tokenize("Hello world")
    assert ids[0] == model.tokenizer.bos_id and model.detokenize(ids[1:]) == "Hello world"
    with pytest.raises(RuntimeError, match="vocab_only=True"):
        model.eval(ids)


@pytest.fixture(scope="module")
def demo_path(tmp_path_factory):
    from torchggml.gguf.writer.demo import demo_model_path
    return demo_model_path(str(tmp_path_factory.mktemp("demo")))


@pytest.fixture(scope="module")
def demo(demo_path):
    return load_model(demo_path)


def test_demo_vocabulary_round_trips(demo):
    text = "Once upon a time, 3 tokens came quickly: \"ok\" (yes) — ünïcode!"
    ids = demo.tokenize(text, add_special=False)
    assert len(ids) < len(text.encode())  # the trained merges do something
    assert demo.detokenize(ids) == text
    assert demo.tokenize(text)[0] == demo.tokenizer.bos_id


def test_generate_is_seeded_and_greedy_matches_eval(demo):
    a = "".join(demo.generate("Once upon a time", max_tokens=8, seed=5))
    b = "".join(demo.generate("Once upon a time", max_tokens=8, seed=5))
    assert a == b and demo.timings.gen_tokens == 8 and demo.timings.prompt_tokens > 0
    greedy = "".join(demo.generate("Once upon a time", max_tokens=6, temperature=0))
    demo.reset()
    ids = demo.tokenize("Once upon a time")
    logits = demo.eval(ids)[-1]
    out = []
    for _ in range(6):
        out.append(int(logits.argmax()))
        logits = demo.eval(out[-1:])[0]
    assert greedy == b"".join(demo.tokenizer.token_to_piece_bytes(i) for i in out).decode("utf-8", "replace")


@pytest.mark.parametrize("top_k,top_p", [(1, 1.0), (0, 1e-6), (3, 1.0), (0, 0.5)])
def test_sampling_stays_within_top_k_and_top_p(top_k, top_p):
    logits = torch.tensor([0.0, 3.0, 1.0, 2.5, -1.0, 2.0])
    order = torch.argsort(logits, descending=True).tolist()
    probs = torch.softmax(logits, 0)[order]
    n_top_p = int((torch.cumsum(probs, 0) - probs < top_p).sum())
    allowed = set(order[: min(top_k or len(order), n_top_p)])
    gen = torch.Generator().manual_seed(0)
    seen = {sample_token(logits, 1.0, top_k, top_p, gen) for _ in range(200)}
    assert seen <= allowed and (len(allowed) == 1 or len(seen) > 1)
    assert sample_token(logits, 0.0) == 1  # temperature 0: greedy


def test_demo_architectures(tmp_path):
    """The demo writer's qwen2 (biases) and qwen3 (q/k norms, tied output) files load and run."""
    from dataclasses import replace
    from torchggml.gguf.writer.demo import DEMO_CONFIG, write_model
    for arch, tied in (("qwen2", False), ("qwen3", True)):
        cfg = replace(DEMO_CONFIG, arch=arch, n_layer=1, tied_output=tied)
        model = load_model(write_model(tmp_path / f"{arch}.gguf", cfg, "F16"))
        assert model.hp.arch == arch and (model.weights.output is model.weights.token_embd) == tied
        logits = model.eval(model.tokenize("hello"))
        assert torch.isfinite(logits).all()


def test_rope_scaling_and_frequency_factors(tmp_path):
    """rope_freqs.weight divides each pair's frequency: all 2s equal linear scaling by 2, which
    differs from no scaling; all 1s change nothing."""
    from dataclasses import replace
    from torchggml.gguf.writer.demo import DEMO_CONFIG, write_model
    cfg = replace(DEMO_CONFIG, n_layer=1)
    half = cfg.n_embd // cfg.n_head // 2
    files = {"plain": {}, "linear2": dict(rope_scaling_factor=2.0),
             "freqs2": dict(rope_freqs=np.full(half, 2.0)), "freqs1": dict(rope_freqs=np.ones(half))}
    ids = list(range(3, 40))
    logits = {}
    for name, extra in files.items():
        model = load_model(write_model(tmp_path / f"{name}.gguf", cfg, "F32", **extra))
        logits[name] = model.eval(ids).numpy()
    assert rel_err(logits["freqs1"], logits["plain"]) < 1e-6
    assert rel_err(logits["freqs2"], logits["linear2"]) < 1e-5
    assert rel_err(logits["linear2"], logits["plain"]) > 1e-3


# ---------------------------------------------------------------- the CLI commands

def run_cli(*argv):
    from torchggml.cli.models import main
    return main([str(a) for a in argv])


def test_cli_run_with_the_demo_model(demo_path, capsys, monkeypatch):
    monkeypatch.setenv("TORCHGGML_CACHE", str(Path(demo_path).parent))
    assert run_cli("run", "-p", "Once upon", "-n", "4", "-s", "1") == 0
    out, err = capsys.readouterr()
    assert out.startswith("Once upon") and "built-in demo model" in err
    # llama_perf_context_print's lines; the warm-up's time is in the load's, not the prompt's
    assert re.search(r"load time += +[\d.]+ ms \(warm-up [\d.]+ ms", err)
    assert re.search(r"prompt eval time = +\d+ tokens in +[\d.]+ ms", err)
    assert "eval time        =     4 runs" in err and "tokens per second" in err


@needs_golden
def test_cli_eval_writes_the_logits(tmp_path, capsys):
    entry = entry_named("llama-F32")
    out = tmp_path / "logits.npy"
    tokens = ",".join(str(t) for t in entry["tokens"])
    assert run_cli("eval", GOLDEN / entry["model"], "--tokens", tokens, "--chunks", "10,1,1", "--out", out) == 0
    logits = np.load(out)
    ref = np.load(GOLDEN / entry["logits"])
    assert logits.shape == ref.shape and rel_err(logits, ref) <= MAX_ERR_FLOAT
    assert "16 tokens in 4 calls" in capsys.readouterr().err


@needs_golden
def test_cli_info(capsys):
    assert run_cli("info", GOLDEN / "models" / "llama-Q4_K_M.gguf") == 0
    out = capsys.readouterr().out
    assert "general.architecture = 'llama'" in out and "llama.block_count = 2" in out
    assert "blk.1.ffn_down.weight" in out and "q6_K" in out and "bits per weight" in out


LLAMA_CPP_LOGITS = """
import sys, numpy as np, llama_cpp
path, text, out = sys.argv[1:]
llm = llama_cpp.Llama(model_path=path, n_ctx=64, n_batch=64, n_threads=2, logits_all=True, verbose=False)
ids = llm.tokenize(text.encode(), add_bos=True)
llm.eval(ids)
np.save(out, np.array(llm.scores[: len(ids)]))
print(",".join(map(str, ids)))
"""


def test_demo_model_matches_llama_cpp(demo_path, tmp_path):
    """When llama-cpp-python is installed: the demo file's tokens and logits agree with llama.cpp
    (run in a child process: llama.cpp's OpenMP threads would slow torch down in this one)."""
    import importlib.util
    import subprocess
    import sys
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (optional)")
    text = "Once upon a time there was a small program that wanted to run"
    out = subprocess.run([sys.executable, "-c", LLAMA_CPP_LOGITS, str(demo_path), text, str(tmp_path / "ref.npy")],
                         stdout=subprocess.PIPE, text=True, check=True).stdout
    ids = [int(i) for i in out.strip().splitlines()[-1].split(",")]
    ref = np.load(tmp_path / "ref.npy")
    model = load_model(demo_path, n_ctx=64)
    assert model.tokenize(text) == ids
    ours = model.eval(ids).numpy()
    assert rel_err(ours, ref) <= MAX_ERR_FLOAT and argmax_agreement(ours, ref) >= MIN_ARGMAX


# ---------------------------------------------------------------- one execution path, options

@needs_golden
@pytest.mark.parametrize("device", ["CPU", "SIM0"])
def test_one_device_is_one_split(device):
    """Every model runs through the scheduler; on one device its graph is one split (inputs are
    copied in from the CPU backend where the device is not the CPU)."""
    if device != "CPU" and not sim_available():
        pytest.skip("SIM device not available")
    from torchggml.backend.sched import backend_sched_get_n_splits
    entry = entry_named("llama-F32")
    model = golden_model(entry, device)
    model.eval(entry["tokens"][:4])
    assert backend_sched_get_n_splits(model.sched) == 1


def test_model_params_are_shared_and_checked():
    from torchggml.models import ModelParams
    from torchggml.cli.models import model_params
    import argparse
    p = ModelParams().with_options(n_ctx=64, flash_attn=True)
    assert (p.n_ctx, p.flash_attn, p.n_batch) == (64, True, 512)
    with pytest.raises(TypeError, match="unknown model option.*n_ctxx"):
        ModelParams().with_options(n_ctxx=64)
    with pytest.raises(ValueError, match="n_batch"):
        ModelParams(n_batch=0)
    args = argparse.Namespace(device="SIM0,CPU", n_gpu_layers=None, tensor_split=[1.0, 2.0], ctx_size=128,
                              batch_size=32, flash_attn=True, cache_type="q8_0", threads=2, repack=False)
    assert model_params(args) == ModelParams(devices=["SIM0", "CPU"], tensor_split=[1.0, 2.0], n_ctx=128,
                                             n_batch=32, flash_attn=True, kv_type="q8_0", n_threads=2, repack=False)


def cpu_kv_cache(n_ctx: int):
    from torchggml.models.kv_cache import KVCache
    from torchggml.types import Type
    return KVCache(1, n_ctx, 32, 32, 1, Type.F16, [find_device("CPU").get_buffer_type()])


@pytest.mark.parametrize("n_ctx, fresh_pages", [(16, False), (1 << 16, True)])  # 8 MiB: huge-page memory
def test_kv_cache_starts_at_zero_without_writing_fresh_pages(monkeypatch, n_ctx, fresh_pages):
    """Every cell starts at 0 (a masked score times NaN is not 0); a buffer of fresh anonymous
    pages, zero already, is not written at load (untouched pages cost no memory until used)."""
    import mmap
    from torchggml.models import kv_cache
    from torchggml.storage import tensor_bytes
    fresh_pages = fresh_pages and hasattr(mmap, "MADV_HUGEPAGE")
    cleared, clear = [], kv_cache.backend_buffer_clear
    monkeypatch.setattr(kv_cache, "backend_buffer_clear", lambda b, v: cleared.append(v) or clear(b, v))
    kv = cpu_kv_cache(n_ctx)
    assert [b.zero_filled for b in kv.buffers] == [fresh_pages]
    assert cleared == ([] if fresh_pages else [0])
    assert all(not tensor_bytes(t).any() for t in kv.k + kv.v)


@pytest.mark.parametrize("n_tokens,n_batch,slices", [
    (1, 128, [(0, 1)]),                  # a decode step: one micro-batch, the whole batch
    (128, 128, [(0, 128)]),
    (130, 128, [(0, 128), (128, 130)]),  # the last one ends at the batch's end
    (6, 2, [(0, 2), (2, 4), (4, 6)]),
])
def test_kv_micro_batches_are_runs_of_n_batch_tokens(n_tokens, n_batch, slices):
    """slice(0, n) for a batch in one piece: the model then evaluates it without a second plan
    or a copy of its logits (a decode step's path)."""
    from torchggml.models.kv_cache import KVCache
    got = KVCache.ubatches(np.zeros(n_tokens, dtype=np.int64), n_batch)
    assert [(s.start, s.stop) for s in got] == slices


@pytest.mark.parametrize("n_past,n_tokens,n_swa,visible_last_row", [
    (0, 4, 0, [1, 1, 1, 1, 0, 0]),      # causal: the last token sees cells 0..3
    (0, 4, 2, [0, 0, 1, 1, 0, 0]),      # window 2: only cells 2..3
    (3, 2, 3, [0, 0, 1, 1, 1, 0]),      # position 4 sees cells 2..4
    (5, 1, 8, [1, 1, 1, 1, 1, 1]),      # a window wider than the past sees everything
])
def test_kv_mask_sliding_window(n_past, n_tokens, n_swa, visible_last_row):
    kv = cpu_kv_cache(6)
    if n_past:
        kv.commit(kv.plan(torch.zeros(n_past, dtype=torch.int64)))
    batch = kv.plan(torch.zeros(n_tokens, dtype=torch.int64))
    mask = kv.mask(batch, n_swa)[:, :6]
    assert mask.shape == (n_tokens, 6) and mask.dtype == torch.float16
    assert (mask[-1] == 0).int().tolist() == visible_last_row


def test_kv_cells_of_several_sequences():
    """Cells are taken first-free in order; a token sees only its own sequence's cells; clearing
    one sequence frees its cells for the next batch."""
    kv = cpu_kv_cache(8)
    b = kv.plan(torch.tensor([0, 0, 1, 1, 1]))
    assert b.cells.tolist() == [0, 1, 2, 3, 4] and b.positions.tolist() == [0, 1, 0, 1, 2]
    kv.commit(b)
    kv.clear(0)
    b = kv.plan(torch.tensor([1, 2]))
    assert b.cells.tolist() == [0, 1] and b.positions.tolist() == [3, 0]
    visible = (kv.mask(b)[:, :8] == 0).int().tolist()
    assert visible == [[1, 0, 1, 1, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0, 0, 0]]
    with pytest.raises(ValueError, match=r"KV cache is full: 3 tokens cached \+ 6 new > n_ctx=8"):
        kv.plan(torch.zeros(6, dtype=torch.int64))


@needs_golden
def test_eval_batch_equals_sequences_one_by_one():
    """Three sequences of different lengths in one batch, then one more token each: every row
    equals evaluating that sequence alone (and the first one matches llama.cpp)."""
    entry = entry_named("llama-F32")
    t = entry["tokens"]
    model = golden_model(entry, n_batch=7)  # micro-batches cut across sequences
    prompts, nexts = [t[:10], t[2:8], t[5:14]], [t[10], t[8], t[14]]
    batch = model.eval_batch(prompts, seq_ids=[4, 0, 2])
    steps = model.eval_batch([[x] for x in nexts], seq_ids=[4, 0, 2])
    assert model.n_past == 10 + 6 + 9 + 3
    model.reset(0)
    assert model.n_past == 10 + 9 + 2
    model.reset()
    for prompt, nxt, rows, step in zip(prompts, nexts, batch, steps):
        alone = model.eval(prompt + [nxt])
        model.reset()
        assert rel_err(torch.cat([rows, step]).numpy(), alone.numpy()) < 1e-4
    ref = np.load(GOLDEN / entry["logits"])[:11]
    assert rel_err(torch.cat([batch[0], steps[0]]).numpy(), ref) <= MAX_ERR_FLOAT
    with pytest.raises(ValueError, match="distinct seq_ids"):
        model.eval_batch([[1], [2]], seq_ids=[3, 3])


# every golden model whose weights the CPU's own kernels multiply (F32 weights go through torch's
# GEMM, whose sums depend on how many rows it is given), and llama-F32 converted to BF16
SEPARATE_ROWS_MODELS = [Path(e["model"]).stem for e in MANIFEST if e["weights"] != "F32"] + ["llama-BF16"]


@pytest.fixture(scope="module")
def llama_bf16(tmp_path_factory):
    from torchggml.tools.quantize import quantize_file
    path = tmp_path_factory.mktemp("bf16") / "llama-BF16.gguf"
    quantize_file(str(GOLDEN / entry_named("llama-F32")["model"]), str(path), "BF16")
    model = load_model(path, devices=["CPU"], progress=False)
    yield model
    model.close()


@needs_golden
@pytest.mark.parametrize("name", SEPARATE_ROWS_MODELS)
def test_batched_decode_step_equals_each_sequence_alone(name, request):
    """A decode step of ten sequences, one token each (more rows than any product or the fused
    attention keeps on its decode path for a prompt), gives each sequence bit for bit the logits
    of its own decode step, on every weight type; a prompt of as many tokens is not such a step."""
    t = entry_named("llama-F32")["tokens"]
    if name == "llama-BF16":
        model = request.getfixturevalue("llama_bf16")
        model.reset()
    else:
        t = entry_named(name)["tokens"]
        model = golden_model(entry_named(name))
    prompts, nexts = [t[i:i + 2 + i % 4] for i in range(10)], [t[-1 - i] for i in range(10)]
    model.eval_batch(prompts)
    together = model.eval_batch([[x] for x in nexts])
    assert model.last_graph.separate_rows
    model.reset()
    model.eval_batch(prompts)
    for i, (x, row) in enumerate(zip(nexts, together)):
        alone = model.eval([x], seq_id=i)
        assert torch.equal(alone, row), f"sequence {i}: {(alone - row).abs().max().item():.3g} off its own step"
    model.reset()
    model.eval(t[:10])
    assert not model.last_graph.separate_rows


BATCH_PROMPTS = ["Once upon a time", "The scheduler cuts", "Numbers 0 1 2"]
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
          "required": ["n", "ok"]}


@pytest.mark.parametrize("options", [
    {},
    {"repeat_penalty": 1.5, "frequency_penalty": 0.5, "presence_penalty": 0.3, "repeat_last_n": 8},
    {"stop": ["e", " t"]},
    {"schema": SCHEMA},
], ids=["plain", "penalties", "stop", "json-schema"])
def test_generate_batch_equals_generate(demo, options):
    """One decode loop: generate_batch gives each sequence what generate gives it alone, with
    every sampling option (temperature 0)."""
    options = dict(options, temperature=0)
    schema = options.pop("schema", None)
    if schema is not None:
        grammar = pytest.importorskip("torchggml.server.grammar")
        vocab = grammar.Vocabulary(demo.tokenizer)
        source = vocab.compile("json_schema", schema)
        constraint = lambda: grammar.Constraint(vocab, source)  # noqa: E731
    batch = demo.generate_batch(BATCH_PROMPTS, max_tokens=12, **options,
                                constraints=[constraint() for _ in BATCH_PROMPTS] if schema else None)
    alone = ["".join(demo.generate(p, max_tokens=12, **options, constraint=constraint() if schema else None))
             for p in BATCH_PROMPTS]
    assert batch == alone and len(set(batch)) > 1
    if schema is not None:
        assert all(text.startswith('{"n":') for text in batch), batch  # the schema held every sequence


def test_unsupported_architecture_is_named(tmp_path):
    import gguf
    from torchggml.gguf.loader import GGUFError
    w = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "rwkv9")
    w.add_tokenizer_model("none")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with pytest.raises(GGUFError, match="architecture 'rwkv9' is not supported"):
        load_model(tmp_path / "x.gguf")


def test_unknown_rope_scaling_is_refused(tmp_path):
    """YaRN and LongRoPE load (tests/test_archs.py); a scaling llama.cpp does not know is refused."""
    from torchggml.gguf.loader import GGUFError
    from torchggml.gguf.writer.tiny import TinyCase, write_tiny_model
    case = TinyCase("llama-dynamic", "llama", metadata=(("rope.scaling.type", "dynamic"), ("rope.scaling.factor", 2.0)))
    with pytest.raises(GGUFError, match="rope scaling 'dynamic' is not supported"):
        load_model(write_tiny_model(tmp_path / "x.gguf", case))
