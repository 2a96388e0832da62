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
from torchggml.tools.perplexity import SCORE_BYTES, score_rows, score_window, summarize, windows
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


@pytest.mark.parametrize("n_rows, n_vocab", [(0, 50), (1, 50), (37, 1000), (9, SCORE_BYTES // 8 - 1),
                                            (17, SCORE_BYTES // 16), (3, SCORE_BYTES // 4)])
def test_score_rows_equals_a_float64_log_softmax_of_all_rows(n_rows, n_vocab):
    """score_rows goes through a few rows at a time in reused buffers (about SCORE_BYTES of
    float64): each row's figure is the one a float64 log-softmax of every row at once gives,
    bit for bit, across the group boundaries (a group of 1, 2, 8 rows and a last partial one)."""
    g = torch.Generator().manual_seed(n_rows * 7 + n_vocab)
    logits = torch.randn(n_rows, n_vocab, generator=g) * 6
    targets = torch.randint(0, n_vocab, (n_rows,), generator=g)
    want = -torch.log_softmax(logits.double(), dim=-1).gather(1, targets[:, None])[:, 0]
    got = score_rows(logits, targets.tolist())
    assert got.dtype == torch.float64 and torch.equal(got, want)


def test_perplexity_scores_a_micro_batch_at_a_time():
    """perplexity evaluates each window n_batch tokens at a time and scores each piece's logits
    as it goes (the first half asks for none but its last): no window's full logits are held,
    and the figures equal score_window's over the whole window's logits."""
    from torchggml.models import load_model
    from torchggml.tools.perplexity import perplexity
    model = load_model(demo_model_path(), n_ctx=64, n_batch=16, progress=False)
    text = CORPUS * 2
    rows = []
    eval_once = model.eval

    def eval_recording(tokens, seq_id=0, logits="all"):
        out = eval_once(tokens, seq_id, logits)
        rows.append(out.shape[0])
        return out

    try:
        model.eval = eval_recording
        ours = perplexity(model, text, max_windows=2)
        model.eval = eval_once
        nlls = []
        for w in windows(model.tokenize(text), 64, model.tokenizer.bos_id)[:2]:
            model.reset()
            nlls.append(score_window(model.eval(w), w))
        model.reset()
    finally:
        model.close()
    assert max(rows) == 16 and rows.count(1) == 2 * 2  # pieces of n_batch; the first half's: the last row only
    assert ours.ppl == pytest.approx(summarize(nlls).ppl, rel=1e-9)


def test_eval_all_writes_each_micro_batch_into_the_result():
    """eval(logits="all") over several micro-batches: each one's logits are copied once, into
    the returned tensor (was: into a micro-batch tensor, then again into the result)."""
    from torchggml.models import load_model
    model = load_model(demo_model_path(), n_ctx=64, n_batch=8, progress=False)
    targets = []
    ubatch_once = model._eval_ubatch

    def ubatch_recording(ids, seq_ids, outputs, logits, *args, **kwargs):
        targets.append(logits.untyped_storage().data_ptr())
        return ubatch_once(ids, seq_ids, outputs, logits, *args, **kwargs)

    try:
        expected = model.eval(list(range(1, 21)))
        model.reset()
        model._eval_ubatch = ubatch_recording
        got = model.eval(list(range(1, 21)))
    finally:
        model.close()
    assert len(targets) == 3 and set(targets) == {got.untyped_storage().data_ptr()}
    assert torch.equal(got, expected)


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


def _llama_quantize(src, dst, ftype: str, imatrix=None, output_type=None, embedding_type=None, patterns=(),
                    pure=False, quantize_output=True):
    """llama_model_quantize with llama-quantize's options in its params struct (imatrix: {name:
    values} passed as llama-quantize's main passes the one it loaded)."""
    llama_cpp = _llama_cpp()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FILE_TYPES[ftype][0]
    params.pure, params.quantize_output_tensor = pure, quantize_output
    if output_type is not None:
        params.output_tensor_type = int(output_type)
    if embedding_type is not None:
        params.token_embedding_type = int(embedding_type)
    keep = []
    if imatrix:
        entries = (llama_cpp.llama_model_imatrix_data * (len(imatrix) + 1))()
        for i, (name, values) in enumerate(imatrix.items()):
            keep.append((name.encode(), np.ascontiguousarray(values, np.float32)))
            entries[i].name = keep[-1][0]
            entries[i].data = keep[-1][1].ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            entries[i].size = keep[-1][1].size
        params.imatrix = ctypes.cast(entries, type(params.imatrix))
    if patterns:
        overrides = (llama_cpp.llama_model_tensor_override * (len(patterns) + 1))()
        for i, (pattern, t) in enumerate(patterns):
            keep.append(pattern.encode())
            overrides[i].pattern = keep[-1]
            overrides[i].type = int(t)
        overrides[len(patterns)].pattern = None
        params.tt_overrides = ctypes.cast(overrides, type(params.tt_overrides))
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


def _ones_imatrix(src):
    """An importance matrix of ones for every blk.* weight (the mixes' imatrix rules apply)."""
    f = open_gguf(src)
    weights = {name: np.ones(t.ne[0], np.float32) for name, t in f.tensors.items()
               if name.startswith("blk.") and name.endswith(".weight") and len(t.ne) >= 2 and "norm" not in name}
    f.close()
    return weights


# the IQ mixes (which llama-quantize writes only with an importance matrix) and Q2_K_S, IQ3_XS, IQ3_M
@pytest.mark.parametrize("ftype", ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M", "IQ3_XXS", "IQ3_XS",
                                   "IQ3_S", "IQ3_M", "Q2_K_S"])
def test_iq_mix_matches_llama_quantize(tmp_path, ftype):
    src = generated_model(MIX_MODEL, "F32")
    dst = tmp_path / f"{ftype}.gguf"
    _llama_quantize(src, dst, ftype, imatrix=_ones_imatrix(src))
    theirs = {name: Type(t.type) for name, t in open_gguf(dst).tensors.items()}
    assert {name: new for name, _, new in plan(src, ftype, has_imatrix=True)} == theirs


# llama-quantize's per-tensor options, planned as llama_model_quantize plans them
@pytest.mark.parametrize("ftype, options", [
    ("Q4_K_M", {"output_type": Type.Q8_0, "embedding_type": Type.Q4_0}),
    ("Q4_K_M", {"patterns": [("attn_(q|k)", Type.Q8_0), ("blk\\.[0-3]\\.ffn_down", Type.Q5_0), ("ffn", Type.Q4_1)]}),
    ("Q3_K_M", {"pure": True}),
    ("Q3_K_M", {"pure": True, "patterns": [("attn_v", Type.Q6_K)]}),
    ("Q5_K_M", {"quantize_output": False}),
    ("IQ4_XS", {"output_type": Type.IQ4_NL, "embedding_type": Type.F16, "patterns": [("output", Type.Q8_0)]}),
], ids=["output-embedding", "tensor-types", "pure", "pure-tensor-type", "leave-output", "iq4_xs-all"])
def test_quantize_options_match_llama_quantize(tmp_path, ftype, options):
    src = generated_model(MIX_MODEL, "F32")
    dst = tmp_path / "theirs.gguf"
    _llama_quantize(src, dst, ftype, **options)
    theirs = {name: Type(t.type) for name, t in open_gguf(dst).tensors.items()}
    assert {name: new for name, _, new in plan(src, ftype, **options)} == theirs


def test_quantize_dry_run_writes_nothing(tmp_path):
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["quantize", demo_model_path(), str(tmp_path / "x.gguf"), "Q4_K_M", "--dry-run",
                     "--tensor-type", "attn_q=q8_0", "--output-tensor-type", "f16"]) == 0
    lines = out.getvalue().splitlines()
    assert not (tmp_path / "x.gguf").exists()
    assert any(re.match(r"blk\.0\.attn_q\.weight +F32 -> Q8_0$", line) for line in lines)
    assert any(re.match(r"output\.weight +F32 -> F16$", line) for line in lines)
    assert re.match(r"dry run: [\d.]+ MiB of tensors -> [\d.]+ MiB as Q4_K_M \(nothing written\)", lines[-1])


@pytest.mark.parametrize("argv, message", [
    (["Q7_K"], "unknown type 'Q7_K'; choose one of"),
    (["Q4_K_M", "--output-tensor-type", "q9_9"], "unknown --output-tensor-type 'q9_9'; choose one of F32"),
    (["Q4_K_M", "--tensor-type", "attn_q"], "--tensor-type 'attn_q': expected PATTERN=TYPE"),
    (["Q4_K_M", "--tensor-type", "attn_q=q3"], "unknown type in --tensor-type 'attn_q=q3' 'q3'"),
    (["Q4_K_M", "--tensor-type", "attn_(q=q8_0"], "bad regular expression"),
    (["IQ2_XS"], "blk.0.attn_q.weight would be IQ2_XS, which needs an importance matrix (no --imatrix given"),
    (["Q4_K_M", "--include-weights", "a", "--exclude-weights", "b"], "cannot be used together"),
])
def test_quantize_bad_options_are_one_line_errors(tmp_path, capsys, argv, message):
    with redirect_stdout(io.StringIO()):
        assert main(["quantize", demo_model_path(), str(tmp_path / "x.gguf"), *argv]) == 1
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "x.gguf").exists()


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


def _by_name_split(src, prefix, max_tensors):
    """src's tensors in name order (blk.0, blk.1, blk.10, ...: as some converters write them, and as
    llama-quantize's --keep-split then counts the layers), split by our gguf-split writer."""
    from torchggml.gguf.writer.split import split_gguf
    from torchggml.gguf.writer.stream import StreamWriter
    f = open_gguf(src)
    names = sorted(f.tensors)
    w = StreamWriter(f"{prefix}-whole.gguf", [f.kv_record(k) for k in f.metadata],
                     [(n, list(f.tensors[n].ne), int(f.tensors[n].type), f.tensors[n].nbytes) for n in names])
    for n in names:
        w.write(f.tensor_data(n))
    w.close()
    f.close()
    return split_gguf(f"{prefix}-whole.gguf", prefix, max_tensors)


@pytest.mark.parametrize("ftype", ["Q4_K_M", "Q8_0"])
def test_quantize_keep_split_equals_llama_quantize(tmp_path, ftype):
    """--keep-split: one output file per input file, each byte for byte llama-quantize's (its
    layer rules counted in the files' order)."""
    llama_cpp = _llama_cpp()
    parts = _by_name_split(generated_model(replace(MIX_MODEL, n_layer=12), "F16"), str(tmp_path / "in"), 40)
    assert len(parts) == 3
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.keep_split = FILE_TYPES[ftype][0], True
    assert llama_cpp.llama_model_quantize(parts[0].encode(), str(tmp_path / "theirs").encode(),
                                          ctypes.byref(params)) == 0
    with redirect_stdout(io.StringIO()):
        assert main(["quantize", parts[0], str(tmp_path / "ours.gguf"), ftype, "--keep-split"]) == 0
    for i in range(1, 4):
        ours, theirs = (tmp_path / f"{side}-{i:05d}-of-00003.gguf" for side in ("ours", "theirs"))
        assert ours.read_bytes() == theirs.read_bytes(), ours.name
    assert len(open_gguf(tmp_path / "ours-00001-of-00003.gguf").tensors) == len(open_gguf(parts[0]).tensors)


def test_quantize_rejects_unknown_types(tmp_path, capsys):
    assert main(["quantize", demo_model_path(), str(tmp_path / "x.gguf"), "Q7_K"]) == 1
    err = capsys.readouterr().err
    assert "unknown type 'Q7_K'; choose one of F32, F16" in err and "Q4_K (alias for Q4_K_M)" in err
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(ValueError, match="unknown type"):
        quantize_file(demo_model_path(), tmp_path / "x.gguf", "nope")


def test_quantize_names_the_alias_it_takes(tmp_path, capsys):
    """llama-quantize lists Q4_K as "alias for Q4_K_M": accepted, and said."""
    with redirect_stdout(io.StringIO()):
        assert main(["quantize", demo_model_path(), str(tmp_path / "x.gguf"), "q4_k"]) == 0
    assert "q4_k is an alias for Q4_K_M" in capsys.readouterr().err
    assert open_gguf(tmp_path / "x.gguf").get("general.file_type") == FILE_TYPES["Q4_K_M"][0]


@pytest.fixture(scope="module")
def q4_0_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("requant") / "q4_0.gguf"
    quantize_file(demo_model_path(), path, "Q4_0")
    return path


@pytest.mark.parametrize("flags, rc", [([], 1), (["--allow-requantize"], 0)])
def test_requantizing_needs_allow_requantize(q4_0_file, tmp_path, capsys, flags, rc):
    """As llama-quantize: a quantized tensor converted again only with --allow-requantize; no
    file is written without it."""
    out = tmp_path / "q8_0.gguf"
    with redirect_stdout(io.StringIO()):
        assert main(["quantize", str(q4_0_file), str(out), "Q8_0", *flags]) == rc
    err = capsys.readouterr().err
    if rc:
        assert re.search(r"is already (Q\w+): requantizing from type \1 is disabled \(--allow-requantize", err)
        assert not out.exists()
    else:
        assert open_gguf(out).get("general.file_type") == FILE_TYPES["Q8_0"][0]


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


@pytest.mark.slow  # compiles every kernel again into an empty cache
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


def _subcommand_parsers():
    from torchggml.cli import build_parser
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sorted(sub.choices.items())


@pytest.mark.parametrize("name, parser", _subcommand_parsers())
def test_help_shows_every_default(name, parser):
    """Each option whose default is a value (not None, not a flag) says it in --help."""
    import argparse
    text = parser.format_help()
    options = text[text.index("\noptions:"):]  # past the usage line
    for action in parser._actions:
        if (action.option_strings and action.default not in (None, False, [], argparse.SUPPRESS)
                and not isinstance(action, argparse._StoreConstAction)):
            # the option's entry: from its name to the next line that starts another option
            start = options.index("\n  " + action.option_strings[0])
            entry = re.split(r"\n  -", options[start + 3:])[0]
            assert "default" in entry, f"{name} {action.option_strings[-1]}: no default in --help"


HEAVY_MODULES = ("torch", "numpy", "numba", "triton", "fastapi", "uvicorn", "jinja2")
IMPORTS_OF = """
import sys
from torchggml.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print("imported:", sorted(m for m in {heavy!r} if m in sys.modules))
"""


@pytest.mark.parametrize("options, warm_up_with_the_prompt", [(["-p", "Hello world"], True),
                                                            (["--chat", "-p", "Hi"], False)])
def test_run_warms_up_with_its_prompts_length(monkeypatch, capsys, options, warm_up_with_the_prompt):
    """`run` with a plain prompt warms up with that prompt's length (its graph is the one the
    prompt then uses: built and planned once); other prompts, the default warm-up."""
    from torchggml.cli.models import main
    from torchggml.gguf.writer.demo import demo_model_path
    from torchggml.models import load_model, warmup
    lengths, real = [], warmup.warm_up
    monkeypatch.setattr(warmup, "warm_up", lambda model, n_prompt=None: lengths.append(n_prompt) or real(model, n_prompt))
    assert main(["run", demo_model_path(), "-n", "2", "--temp", "0", *options]) == 0
    model = load_model(demo_model_path(), progress=False)
    assert lengths == [len(model.tokenize("Hello world")) if warm_up_with_the_prompt else None]
    assert "prompt eval time =" in capsys.readouterr().err
    model.close()


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["run", "--help"], ["serve", "--help"],
                                  ["quantize", "--help"], ["test-ops", "--help"], ["perplexity", "--help"]])
def test_version_and_help_import_nothing_heavy(argv):
    """--version and --help parse and print without torch, numba, triton or the server stack
    (importing torch alone took seconds of CPU before every command)."""
    import subprocess
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", IMPORTS_OF.format(heavy=HEAVY_MODULES), *argv],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "imported: []" in done.stdout, done.stdout
    assert ("torchggml 0.1.0" in done.stdout) if argv == ["--version"] else ("usage: torchggml" in done.stdout)


LOAD_STATE = """
import gc, sys
import numpy as np
import torch
from torchggml.models import load_model
threads = max(1, torch.get_num_threads() - 1)
model = load_model(sys.argv[1], n_ctx=32, n_threads=threads, progress=False)
print("numba imported by the load:", "numba" in sys.modules)
model.eval([1, 2, 3])
print("imported by the first eval:", [m for m in ("scipy", "yaml", "torchggml.devices.rpc.client")
                                      if type(sys.modules.get(m)).__name__ == "module"])
print("after eval:", "scipy.linalg" in sys.modules, gc.isenabled(), gc.get_freeze_count() > 100000)
import numba
print("threads asked, numba's, torch's:", threads, numba.get_num_threads(), torch.get_num_threads())
dot = numba.njit(lambda a, b: np.dot(a, b))
print("dot:", dot(np.arange(3.0), np.arange(3.0)))
"""


def test_load_needs_no_numba_and_its_start_leaves_out_scipy_and_the_gc_on():
    """A load imports no numba (no kernel runs: the first one imports it); the first evaluation
    sets numba up without SciPy's linear algebra (numba imported it for np.convolve's BLAS
    choice: a third of a small model's load), with the thread count the load asked for
    (numba's, and torch's, which numba's OpenMP start resets) and with the imported modules'
    objects frozen out of the cyclic GC, which is on again after the load; numba's np.dot still
    compiles (importing SciPy then). Where numba's import was read for it
    (loader.LOADS_WITHOUT_REFRESH), neither SciPy nor YAML is imported (numba's version check
    and config file), nor the RPC client (the CPU's kernel table reads the RPC package's shape rules)."""
    from torchggml.devices.cpu.jit.loader import _loads_without_refresh
    import subprocess
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", LOAD_STATE, demo_model_path()], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "numba imported by the load: False" in done.stdout, done.stdout
    assert "after eval: False True True" in done.stdout and "dot: 5.0" in done.stdout, done.stdout
    asked = done.stdout.split("threads asked, numba's, torch's:")[1].split()[:3]
    assert len(set(asked)) == 1, done.stdout
    assert ("imported by the first eval: []" in done.stdout) == _loads_without_refresh(), done.stdout


def test_a_broken_numba_fails_the_first_kernel_with_one_clear_error(monkeypatch):
    """numba_available only finds numba (a load imports nothing of it): where its import then
    fails, the first kernel's load says so in one line."""
    from torchggml.devices.cpu.jit import loader

    def broken():
        raise ImportError("numpy.core.multiarray failed to import")
    monkeypatch.setattr(loader, "start_numba", broken)
    with pytest.raises(ImportError, match=r"CPU kernels need numba, and importing it failed: numpy\.core"):
        loader._load.__wrapped__("op_kernels")


def test_numba_reads_its_config_file_through_the_deferred_yaml(tmp_path):
    """numba's import reads a .numba_config.yaml in the working directory: loader.import_numba's
    stand-in for YAML imports it then."""
    import subprocess
    (tmp_path / ".numba_config.yaml").write_text("disable_performance_warnings: 1\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    script = ("from torchggml.devices.cpu.jit.loader import import_numba\n"
              "print(import_numba().config.DISABLE_PERFORMANCE_WARNINGS)\n")
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.split() == ["1"], done.stdout + done.stderr


def test_a_deferred_module_is_imported_on_first_use(monkeypatch):
    """loader._Deferred stands for a module in sys.modules until an attribute is read: then the
    module is imported in its place and every read is the module's."""
    from torchggml.devices.cpu.jit.loader import _Deferred
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    stub = _Deferred("colorsys")
    monkeypatch.setitem(sys.modules, "colorsys", stub)
    import colorsys
    assert colorsys is stub and type(sys.modules["colorsys"]) is _Deferred
    assert colorsys.rgb_to_hsv(1.0, 0.0, 0.0) == (0.0, 1.0, 1.0)
    assert sys.modules["colorsys"] is not stub and colorsys.hls_to_rgb is sys.modules["colorsys"].hls_to_rgb


def test_a_failed_load_leaves_the_gc_as_it_was(tmp_path):
    """load_model pauses the cyclic GC while it loads: a load that fails turns it back on."""
    import gc
    from torchggml.gguf.reader import GGUFError
    from torchggml.models import load_model
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + bytes(64))
    assert gc.isenabled()
    with pytest.raises(GGUFError, match="not a GGUF file"):
        load_model(str(bad), progress=False)
    assert gc.isenabled()


def test_compile_kernels_covers_every_block_type():
    """compile-kernels' default file types reach every block type quantize writes (Q4_1 and
    Q5_0 were left to compile silently during a real model's first prompt)."""
    from torchggml.tools.compile_kernels import FILE_TYPES as COMPILED
    from torchggml.tools.file_types import FILE_TYPE_IDS
    blocks = {block for _, block in FILE_TYPE_IDS.values()} - {"F32"}
    assert blocks <= {FILE_TYPE_IDS[f][1] for f in COMPILED}


@pytest.mark.parametrize("threshold_s, noticed", [(0.0, True), (600.0, False)])
def test_compile_notice_names_a_kernel_whose_compile_runs_long(threshold_s, noticed):
    """A numba compile still running after the threshold gets one line naming the kernel and
    why; a shorter one none (here a kernel of this test module stands for torchggml's)."""
    numba = pytest.importorskip("numba")
    import time
    from torchggml.models.warmup import install, uninstall
    stream = io.StringIO()
    notice = install(threshold_s, package=__name__, stream=stream)
    try:
        @numba.njit(cache=False)
        def scaled_sum(x):
            return (x * 2.0).sum()
        scaled_sum(np.ones(4))
        time.sleep(0.2)  # the notice's timer thread prints
    finally:
        uninstall(notice)
    text = stream.getvalue()
    assert (f"compiling the CPU kernel {__name__.rsplit('.', 1)[-1]}." in text) == noticed, text
    assert ("scaled_sum(array(float64, 1d, C))" in text) == noticed
    assert ("first use with these argument types" in text) == noticed
