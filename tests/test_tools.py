"""The llama.cpp-style tools: perplexity, bench, quantize, --version; compared with llama.cpp
(through llama-cpp-python) where it is installed."""
from __future__ import annotations

import ctypes
import io
import math
import os
import re
import sys
from contextlib import redirect_stdout
from dataclasses import replace

import numpy as np
import pytest
import torch

from torchggml.cli import main
from torchggml.gguf.loader import open_gguf
from torchggml.gguf.writer.demo import CORPUS, DEMO_CONFIG, demo_model_path, generated_model
from torchggml.tools.perplexity import score_window, summarize, windows
from torchggml.tools.quantize import FILE_TYPES, plan, quantize_file
from torchggml.types import Type

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _llama_cpp():
    return pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the llama.cpp comparisons)")


# ---------------------------------------------------------------- perplexity

def test_perplexity_windows_and_scoring():
    tokens = list(range(100, 150))
    ws = windows(tokens, 16, bos=1)
    assert [w[0] for w in ws] == [1, 1, 1] and ws[1][1:] == tokens[17:32]  # 50 // 16 windows, BOS first
    with pytest.raises(ValueError, match="at least 2 \\* n_ctx"):
        windows(tokens, 32, 1)
    # uniform logits: every token has probability 1/n_vocab, so PPL = n_vocab exactly
    w = ws[0]
    nll = score_window(torch.zeros(16, 200), w)
    assert nll.numel() == 16 - 1 - 8  # positions n_ctx/2 .. n_ctx-2
    assert summarize([nll, nll]).ppl == pytest.approx(200.0)


def test_perplexity_matches_llama_cpp():
    _llama_cpp()
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from perplexity_vs_llama_cpp import llama_cpp_perplexity
    from torchggml.models import load_model
    from torchggml.tools.perplexity import perplexity
    path, n_ctx, text = demo_model_path(), 64, CORPUS * 2
    ref, ref_tokens = llama_cpp_perplexity(path, text, n_ctx)
    model = load_model(path, n_ctx=n_ctx, progress=False)
    try:
        assert model.tokenize(text) == ref_tokens
        ours = perplexity(model, text)
    finally:
        model.close()
    assert ours.n_scored == ref.n_scored
    assert abs(ours.ppl - ref.ppl) / ref.ppl < 0.01


def test_perplexity_cli(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(CORPUS)
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["perplexity", demo_model_path(), "-f", str(text), "-c", "32", "--chunks", "2"]) == 0
    assert re.search(r"Final estimate: PPL = [\d.]+ \+/- [\d.]+ +\(2 windows, 30 tokens scored", out.getvalue())


# ---------------------------------------------------------------- bench and --version

def test_bench_table():
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["bench", demo_model_path(), "-p", "16", "-n", "4", "-r", "2"]) == 0
    rows = [line for line in out.getvalue().splitlines() if line.startswith("|")]
    assert rows[0].split("|")[1].strip() == "model" and len(rows) == 4
    for row, test in zip(rows[2:], ("pp16", "tg4")):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[5] == test and re.fullmatch(r"[\d.]+ ± [\d.]+", cells[6])


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and re.match(r"torchggml \S+ \(torch ", capsys.readouterr().out)


# ---------------------------------------------------------------- quantize

# the demo (4 layers): Q4_K_M gives attn_v and ffn_down Q6_K where llama.cpp's use_more_bits
# says so (layers 2 and 3 of 4), output.weight Q6_K, the rest Q4_K, norms F32
def test_q4_k_m_mix_on_the_demo():
    types = {name: new for name, _, new in plan(demo_model_path(), "Q4_K_M")}
    for il in range(4):
        more = Type.Q6_K if il in (2, 3) else Type.Q4_K
        assert types[f"blk.{il}.attn_v.weight"] == more and types[f"blk.{il}.ffn_down.weight"] == more
        assert types[f"blk.{il}.attn_q.weight"] == Type.Q4_K and types[f"blk.{il}.attn_norm.weight"] == Type.F32
    assert types["output.weight"] == Type.Q6_K and types["token_embd.weight"] == Type.Q4_K


def _llama_quantize(src, dst, ftype: str):
    llama_cpp = _llama_cpp()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FILE_TYPES[ftype][0]
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) == 0


# 8 layers and GQA 4 so the layer and GQA rules differ between tensors
MIX_MODEL = replace(DEMO_CONFIG, n_layer=8, n_head=8, n_head_kv=2, n_ff=256, n_ctx=64)


@pytest.mark.parametrize("ftype", ["Q4_K_M", "Q4_K_S", "Q5_K_M", "Q3_K_M", "Q3_K_L", "Q2_K", "Q6_K",
                                   "Q4_0", "Q8_0", "IQ4_XS"])
def test_mix_matches_llama_quantize(tmp_path, ftype):
    src = generated_model(MIX_MODEL, "F32")
    dst = tmp_path / f"{ftype}.gguf"
    _llama_quantize(src, dst, ftype)
    theirs = {name: Type(t.type) for name, t in open_gguf(dst).tensors.items()}
    ours = {name: new for name, _, new in plan(src, ftype)}
    assert ours == theirs


def test_quantize_file_equals_llama_quantize(tmp_path):
    """Q8_0 (output.weight Q6_K): every tensor's bytes as llama-quantize writes them."""
    import gguf
    src = demo_model_path()
    _llama_quantize(src, tmp_path / "theirs.gguf", "Q8_0")
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["quantize", src, str(tmp_path / "ours.gguf"), "q8_0"]) == 0
    ours, theirs = gguf.GGUFReader(tmp_path / "ours.gguf"), gguf.GGUFReader(tmp_path / "theirs.gguf")
    by_name = {t.name: t for t in theirs.tensors}
    assert sorted(t.name for t in ours.tensors) == sorted(by_name)  # llama.cpp orders them by layer
    for t in ours.tensors:
        other = by_name[t.name]
        assert t.tensor_type == other.tensor_type, t.name
        assert np.array_equal(np.asarray(t.data).view(np.uint8), np.asarray(other.data).view(np.uint8)), t.name
    assert ours.get_field("general.file_type").contents() == FILE_TYPES["Q8_0"][0]
    # the result loads and runs
    from torchggml.models import load_model
    m = load_model(tmp_path / "ours.gguf", progress=False)
    assert math.isfinite(float(m.eval(m.tokenize("Once upon"))[-1].sum()))
    m.close()


def test_quantize_rejects_unknown_types(tmp_path, capsys):
    assert main(["quantize", demo_model_path(), str(tmp_path / "x.gguf"), "Q7_K"]) == 1
    assert "unknown type 'Q7_K'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown type"):
        quantize_file(demo_model_path(), tmp_path / "x.gguf", "nope")


FIRST_PROMPT_COMPILES = """
import sys
from numba.core import event
from torchggml.gguf.writer.tiny import TinyCase, write_tiny_model
from torchggml.models import load_model
compiled = []
class Listener(event.Listener):
    def on_start(self, e):
        compiled.append(e.data["dispatcher"].py_func.__qualname__)
    def on_end(self, e):
        pass
path = write_tiny_model(sys.argv[1], TinyCase("other-shape", "llama", n_embd=128, head_dim=32, n_ff=384), "Q4_0")
event.register("numba:compile", Listener())
model = load_model(path, progress=False, devices=["CPU"], n_ctx=512)
model.eval(list(range(1, 9)))
model.eval([9])
model.reset()
model.eval([1 + i % 50 for i in range(300)])  # a prompt whose softmax takes the threaded kernel
model.close()
wide = write_tiny_model(sys.argv[1] + "-wide", TinyCase("wide", "llama", n_embd=1024, head_dim=64, n_ff=2048), "Q4_0")
model = load_model(wide, progress=False, devices=["CPU"], n_ctx=512)
model.eval([1 + i % 50 for i in range(300)])  # rows of 1024 and 2048: norms and swiglu threaded too
print("compiled:", sorted(set(compiled)))
"""


def test_compile_kernels_leaves_nothing_for_the_first_prompt(tmp_path):
    """After `torchggml compile-kernels` (into an empty numba cache), a new process's first prompt
    and token of a model (another shape) compile nothing: every kernel comes from the cache."""
    pytest.importorskip("numba")
    import subprocess
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"),
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    ahead = subprocess.run([sys.executable, "-m", "torchggml", "compile-kernels", "--types", "Q4_0"],
                           env=env, capture_output=True, text=True, timeout=600)
    assert ahead.returncode == 0, ahead.stderr
    assert "compiling CPU kernels" in ahead.stderr  # the cache was empty: it compiled
    later = subprocess.run([sys.executable, "-c", FIRST_PROMPT_COMPILES, str(tmp_path / "m.gguf")],
                           env=env, capture_output=True, text=True, timeout=600)
    assert later.returncode == 0, later.stderr
    assert "compiled: []" in later.stdout, later.stdout
    assert "compiling CPU kernels" not in later.stderr
