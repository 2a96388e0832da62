"""GGUF files checked as llama.cpp checks them: damaged, truncated or mutated files refused before
anything is allocated, naming the file and the key or tensor; files llama.cpp loads load; the
fuzzer's mutants fail nowhere."""
from __future__ import annotations

import importlib.util
import math
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
import torchggml as ggml
from torchggml.gguf.loader import GGUFError, _entry_nbytes, open_gguf
from torchggml.gguf.reader import _Cursor, _read_value, scan_header
from torchggml.models import load_model

T = ggml.Type

ROOT = Path(__file__).resolve().parents[1]

GOLDEN = Path(os.environ.get("TORCHGGML_GOLDEN", ROOT.parent / "shared" / "golden"))

F32_MODEL = GOLDEN / "models" / "llama-F32.gguf"
Q4_MODEL = GOLDEN / "models" / "llama-Q4_0.gguf"

needs_golden = pytest.mark.skipif(not F32_MODEL.exists(), reason=f"golden models not found at {GOLDEN}")


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
import os
import re
import subprocess
import sys
from pathlib import Path
from torchggml.gguf.writer.rewrite import header_parts, serialize
from torchggml import Type
from torchggml.gguf.writer.demo import demo_model_path


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
                       oracle=False)  # the real vocabularies test below runs the oracle
    outcomes = summary["outcomes"]
    assert summary["failures"] == 0, summary["examples"]
    assert sum(outcomes.values()) == 200
    # the mutants exercise both sides: files that still load and files rejected with a clear error
    assert outcomes["ok-unchecked"] >= 10 and outcomes["clear-error"] >= 100, outcomes


def _kv(kvs, key):
    return next(kv for kv in kvs if kv[0] == key)


def _tensor(tensors, name):
    return next(t for t in tensors if t[0] == name)


def _rename(name, new):
    def edit(kvs, tensors, data):
        _tensor(tensors, name)[0] = new
        return data
    return edit


def _retype(key, type_name, value):
    def edit(kvs, tensors, data):
        _kv(kvs, key)[1:] = [type_name, value]
        return data
    return edit


def _drop_key(key):
    def edit(kvs, tensors, data):
        kvs.remove(_kv(kvs, key))
        return data
    return edit


def _add_tensor(name, n):
    def edit(kvs, tensors, data):
        start = len(data) + (-len(data) % 32)
        tensors.append([name, [n], int(T.F32), start])
        return data + bytes(start - len(data)) + np.ones(n, np.float32).tobytes()
    return edit


def _reshape(name, ne):
    def edit(kvs, tensors, data):
        _tensor(tensors, name)[1] = ne
        return data
    return edit


def _mutant(tmp_path, source: Path, edit) -> Path:
    kvs, tensors, alignment, data = header_parts(source)
    data = edit(kvs, tensors, data)
    path = tmp_path / "mutant.gguf"
    path.write_bytes(serialize(kvs, tensors, alignment, data))
    return path


# (id, source model, the edit, the error it must raise); llama-Q4_0 has n_embd 256, head size 32
REFUSED_FILES = [
    ("output-renamed", "llama", _rename("output.weight", "output_x.weight"),
     r"wrong number of tensors.*'output_x\.weight'"),
    ("extra-tensor", "llama", _add_tensor("blk.0.extra.weight", 256), r"wrong number of tensors.*'blk\.0\.extra"),
    ("bias-llama-does-not-read", "llama", _add_tensor("output_norm.bias", 256),
     r"wrong number of tensors.*'output_norm\.bias'"),
    ("rope-dims-0", "llama", _retype("llama.rope.dimension_count", "uint32", 0),
     r"'llama\.rope\.dimension_count' = 0, expected the head size 32"),
    ("freq-base-array", "llama", _retype("llama.rope.freq_base", "array[float32]", [1.0, 1.0]),
     r"'llama\.rope\.freq_base' must be a float32, not array\[float32\]"),
    ("freq-base-u32", "llama", _retype("llama.rope.freq_base", "uint32", 10000),
     r"'llama\.rope\.freq_base' must be a float32, not uint32"),
    ("block-count-i32", "llama", _retype("llama.block_count", "int32", 2),
     r"'llama\.block_count' must be a uint32, not int32"),
    ("per-layer-array-length", "llama", _retype("llama.attention.head_count", "array[int32]", [8, 8, 8]),
     r"'llama\.attention\.head_count' has 3 items for 'llama\.block_count' = 2 layers"),
    ("token-embd-1d", "llama", _reshape("token_embd.weight", [256 * 512]),
     r"tensor 'token_embd\.weight' has shape \[131072\], expected \[n_embd, n_vocab\]"),
    ("vocab-size-mismatch", "llama", _retype("llama.vocab_size", "uint32", 480),
     r"'llama\.vocab_size' says the vocabulary has 480 tokens"),
    ("vocab-size-unknown", "llama", _drop_key("llama.vocab_size"), r"the vocabulary size is unknown"),
    ("file-type-i32", "llama", _retype("general.file_type", "int32", 2),
     r"'general\.file_type' must be uint32, not int32"),
    ("no-tokenizer-model", "llama", _drop_key("tokenizer.ggml.model"), r"'tokenizer\.ggml\.model' is missing"),
    ("unknown-tokenizer-model", "llama", _retype("tokenizer.ggml.model", "string", "mone"),
     r"'tokenizer\.ggml\.model' = 'mone' is not a tokenizer llama\.cpp knows"),
    ("qwen2moe-without-output", "qwen2moe", _rename("output.weight", "output_x.weight"),
     r"tensor 'output\.weight' is missing"),
    ("gemma-with-output", "gemma", _add_tensor("output.weight", 64),
     r"wrong number of tensors.*'output\.weight'"),
]


def _source(name: str, tmp_path) -> Path:
    if name == "llama":
        if not Q4_MODEL.exists():
            pytest.skip(f"golden models not found at {GOLDEN}")
        return Q4_MODEL
    from torchggml.gguf.writer.tiny import write_tiny_model
    return Path(write_tiny_model(tmp_path / f"{name}.gguf", name))


@pytest.mark.parametrize("source,edit,pattern", [c[1:] for c in REFUSED_FILES], ids=[c[0] for c in REFUSED_FILES])
def test_files_llama_cpp_refuses_are_refused_naming_file_and_key(tmp_path, source, edit, pattern):
    path = _mutant(tmp_path, _source(source, tmp_path), edit)
    with pytest.raises(GGUFError, match=pattern) as err:
        load_model(path, n_ctx=16, progress=False)
    assert str(path) in str(err.value)


@needs_golden
def test_a_rewritten_but_unchanged_file_still_loads(tmp_path):
    """The rewriting the table uses changes nothing by itself."""
    path = _mutant(tmp_path, Q4_MODEL, lambda kvs, tensors, data: data)
    a, b = (load_model(p, n_ctx=16, progress=False) for p in (Q4_MODEL, path))
    assert torch.equal(a.eval([1, 5, 9]), b.eval([1, 5, 9]))
    a.close()
    b.close()


def test_vocabulary_only_load_refuses_an_unknown_architecture(tmp_path):
    from torchggml.gguf.writer.demo import demo_model_path
    path = _mutant(tmp_path, Path(demo_model_path()), _retype("general.architecture", "string", "llamaz"))
    with pytest.raises(GGUFError, match="architecture 'llamaz' is unknown"):
        load_model(path, vocab_only=True)


def test_a_directory_is_not_a_model_file(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a directory, not a GGUF file"):
        load_model(tmp_path)


TRUNCATE = """
import os, sys, shutil
import torchggml
from torchggml.gguf.loader import GGUFError
shutil.copy(sys.argv[1], sys.argv[2])
model = torchggml.load_model(sys.argv[2], n_ctx=16, progress=False)
model.eval([1, 2, 3])
os.truncate(sys.argv[2], 4096)
try:
    model.eval([4])
except GGUFError as e:
    print("GGUFError:", e)
"""


@needs_golden
def test_a_model_file_truncated_while_loaded_raises_instead_of_faulting(tmp_path):
    """The CPU weights are views of the file's mapping: reading past a truncated end used to kill
    the process with SIGBUS. Run in a child process so that the old behaviour fails the test
    instead of killing pytest."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", TRUNCATE, str(GOLDEN / "models" / "llama-F32.gguf"),
                          str(tmp_path / "m.gguf")], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert re.search(r"GGUFError: .*m\.gguf: the model file was truncated to 4096 bytes while loaded", run.stdout)


VOCAB_DIR = GOLDEN / "vocab"


@pytest.mark.skipif(not (VOCAB_DIR / "ggml-vocab-gpt-2.gguf").exists(), reason=f"golden vocabularies not found at {VOCAB_DIR}")
def test_fuzz_mutants_with_real_vocabularies_fail_nowhere():
    """A bounded run of the fuzzer over a model with llama.cpp's SPM vocabulary and a GPT-2
    vocabulary file; with llama-cpp-python installed, every accepted mutant is compared with it."""
    # (_fuzzer is defined above)
    fuzz = _fuzzer()
    sources = [fuzz.vocab_model_path("ggml-vocab-llama-spm.gguf"), VOCAB_DIR / "ggml-vocab-gpt-2.gguf"]
    summary = fuzz.run(40, seed=2027, workers=1, timeout=120, sources=sources, progress=False)
    assert summary["failures"] == 0, summary["examples"]
    assert summary["by_kind"].get("vocab"), summary["by_kind"]
    outcomes = summary["outcomes"]
    assert outcomes["ok"] + outcomes["ok-unchecked"] >= 5 and outcomes["clear-error"] >= 5, outcomes


I16 = int(Type.I16)


def _demo_mutant(tmp_path, edit):
    """The demo model (every tensor F32) edited, its data laid out again for the new types."""
    kvs, tensors, alignment, data = header_parts(demo_model_path())
    old = [(t[3], int(np.prod(t[1])) * 4) for t in tensors]
    edit(kvs, tensors)
    out = b""
    for t, (start, size) in zip(tensors, old):
        out += bytes(-len(out) % alignment)
        t[3] = len(out)
        out += data[start:start + size] if t[2] != I16 else data[start:start + size // 2]
    path = tmp_path / "mutant.gguf"
    path.write_bytes(serialize(kvs, tensors, alignment, out))
    return path


def _drop(key):
    return lambda kvs, tensors: kvs.remove(next(kv for kv in kvs if kv[0] == key))


def _add(key, type_name, value):
    return lambda kvs, tensors: kvs.append([key, type_name, value])


def _retype_tensor(name, type_id):
    def edit(kvs, tensors):
        next(t for t in tensors if t[0] == name)[2] = type_id
    return edit


REFUSED = [  # (id, edit, the error's pattern)
    ("tokenizer-model-without-tokens", _drop("tokenizer.ggml.tokens"),
     r"mutant\.gguf: 'tokenizer\.ggml\.model' is 'gpt2' but the file has no token list"),
    ("array-of-arrays-known-key", _add("general.tags", "array[array[int32]]", [[1, 2], [3]]),
     r"mutant\.gguf.*general\.tags.*an array of arrays"),
    ("array-of-arrays-unknown-key", _add("x.nested", "array[array[string]]", [["a"], ["b", "c"]]),
     r"mutant\.gguf.*x\.nested.*an array of arrays"),
    ("i16-token-embd", _retype_tensor("token_embd.weight", I16),
     r"mutant\.gguf: tensor 'token_embd\.weight' has type I16; token embeddings must be float or quantized"),
]


@pytest.mark.parametrize("edit,pattern", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_files_llama_cpp_refuses_are_refused_at_load(tmp_path, edit, pattern):
    path = _demo_mutant(tmp_path, edit)
    with pytest.raises(GGUFError, match=pattern):
        load_model(path).close()


def _set(key, type_name, value):
    def edit(kvs, tensors):
        next(kv for kv in kvs if kv[0] == key)[1:] = [type_name, value]
    return edit


LOADED = [  # (id, edit, n_ctx given, the context it gets)
    ("context-length-0", _set("llama.context_length", "uint32", 0), None, 4096),
    ("context-length-0-with-n-ctx", _set("llama.context_length", "uint32", 0), 64, 64),
]


@pytest.mark.parametrize("edit,n_ctx,expected", [r[1:] for r in LOADED], ids=[r[0] for r in LOADED])
def test_files_llama_cpp_loads_are_loaded(tmp_path, edit, n_ctx, expected):
    model = load_model(_demo_mutant(tmp_path, edit), **({"n_ctx": n_ctx} if n_ctx else {}))
    try:
        assert model.n_ctx == expected and model.hp.n_ctx_train == 0
        assert model.generate(model.tokenize("Once"), max_tokens=2)  # and it runs
    finally:
        model.close()
