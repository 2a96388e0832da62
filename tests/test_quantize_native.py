"""The native quantizers (devices/cpu/quantize.py), the importance matrix files (tools/imatrix.py,
tools/quantize.py's loaders) and quantize's imatrix options: bytes against llama.cpp's own
ggml_quantize_chunk (through llama-cpp-python's libggml-base, skipped without it) and against the
reference quantizers (torchggml.quants.quantize) where those are ggml_quantize_chunk's path."""
from __future__ import annotations

import ctypes
import glob
import os
import struct

import numpy as np
import pytest
import torch

from torchggml.quants import quantize
from torchggml.devices.cpu.dequantize import DEQUANTIZE_TYPES, dequantize_native
from torchggml.devices.cpu.quantize import NATIVE_TYPES, NEEDS_IMATRIX, quantize_native
from torchggml.types import Type, row_size

GRID_TYPES = (Type.IQ2_XXS, Type.IQ2_XS, Type.IQ2_S, Type.IQ3_XXS, Type.IQ3_S, Type.IQ1_S, Type.IQ1_M)
BLOCK_TYPES = tuple(t for t in NATIVE_TYPES if t not in GRID_TYPES)


GGML_LIB = None  # the path of the libggml-base found


def _ggml_base():
    """llama.cpp's libggml-base from the llama_cpp package (or the directory $LLAMA_CPP_LIB_DIR), or None."""
    lib_dir = os.environ.get("LLAMA_CPP_LIB_DIR")
    if not lib_dir:
        try:
            import llama_cpp
        except ImportError:
            return None
        lib_dir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    libs = glob.glob(os.path.join(lib_dir, "libggml-base.*"))
    if not libs:
        return None
    global GGML_LIB
    GGML_LIB = libs[0]
    lib = ctypes.CDLL(libs[0])
    f = lib.ggml_quantize_chunk
    f.restype = ctypes.c_size_t
    f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                  ctypes.c_void_p]
    return f


GGML = _ggml_base()
needs_ggml = pytest.mark.skipif(GGML is None, reason="llama-cpp-python (its libggml-base) is not installed")


def ggml_quantize(t: Type, x: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    rows, n = x.shape
    out = np.zeros((rows, row_size(t, n)), np.uint8)
    GGML(int(t), x.ctypes.data, out.ctypes.data, 0, rows, n, None if qw is None else qw.ctypes.data)
    return out


def rows_of(kind: str, shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    """Test rows: Gaussian with per-row scales, plus blocks that take the searches' edge paths
    (zeros, a constant, one spike, tiny values, all positive)."""
    rng = np.random.default_rng(seed)
    rows, n = shape
    x = rng.standard_normal(shape) * rng.uniform(0.001, 3, (rows, 1))
    if kind == "edges":
        x[0, :64] = 0
        x[0, 64:96] = 0.25
        x[1 % rows, 5] = 40.0
        x[2 % rows, :256] *= 1e-12
        x[3 % rows, :] = np.abs(x[3 % rows, :])
    elif kind == "heavy":
        x = rng.standard_t(2, shape)
    return np.ascontiguousarray(x, dtype=np.float32)


SHAPES = [(4, 256), (3, 512), (2, 2048)]


@needs_ggml
@pytest.mark.parametrize("imatrix", [False, True], ids=["plain", "imatrix"])
@pytest.mark.parametrize("kind", ["gauss", "edges", "heavy"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("t", BLOCK_TYPES, ids=lambda t: t.name)
def test_native_equals_ggml_quantize_chunk(t, shape, kind, imatrix):
    x = rows_of(kind, shape)
    qw = np.random.default_rng(1).uniform(0, 4, shape[1]).astype(np.float32) if imatrix else None
    if imatrix:
        qw[:7] = 0  # columns never activated
    np.testing.assert_array_equal(quantize_native(t, x, qw), ggml_quantize(t, x, qw))


# the reference quantizers follow quantize_row_*_ref, which is ggml_quantize_chunk's path without an
# importance matrix for all of these but IQ4_NL (there quantize_iq4_nl searches 15 scales a block)
@pytest.mark.parametrize("kind", ["gauss", "edges"])
@pytest.mark.parametrize("t", [t for t in BLOCK_TYPES if t != Type.IQ4_NL], ids=lambda t: t.name)
def test_native_equals_reference_quantizers(t, kind):
    x = rows_of(kind, (4, 512))
    np.testing.assert_array_equal(quantize_native(t, x), quantize(t, torch.from_numpy(x)).numpy())


@pytest.mark.parametrize("call, match", [
    (lambda: quantize_native(Type.TQ2_0, np.zeros((1, 256), np.float32)), "no native quantizer for TQ2_0"),
    (lambda: quantize_native(Type.IQ2_XS, np.zeros((1, 256), np.float32)), "IQ2_XS needs an importance matrix"),
    (lambda: quantize_native(Type.Q4_K, np.zeros((1, 100), np.float32)), "not a multiple of the block size 256"),
    (lambda: quantize_native(Type.Q8_0, np.array([[np.nan] * 32], np.float32)), "non-finite value .* row 0"),
    (lambda: quantize_native(Type.Q4_K, np.zeros((1, 256), np.float32), np.ones(128)), "128 values for rows of 256"),
    (lambda: quantize_native(Type.Q4_0, np.zeros((2, 32), np.float32), out=np.zeros((2, 17), np.uint8)),
     "out must be uint8"),
])
def test_native_rejects_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# the IQ grid types (ggml's grid searches with their neighbour tables): one shape, every kind of row
# (ggml's IQ2_XXS, IQ2_XS and IQ1_S quantizers assert an importance matrix: no plain case; the
# refusal is tested in test_native_rejects_bad_input)
@needs_ggml
@pytest.mark.parametrize("kind", ["gauss", "edges", "heavy"])
@pytest.mark.parametrize("t, imatrix", [(t, im) for t in GRID_TYPES for im in (False, True)
                                        if im or t not in NEEDS_IMATRIX],
                         ids=lambda v: v.name if isinstance(v, Type) else ("imatrix" if v else "plain"))
def test_native_grid_types_equal_ggml_quantize_chunk(t, imatrix, kind):
    x = rows_of(kind, (3, 512))
    qw = np.random.default_rng(1).uniform(0, 4, 512).astype(np.float32) if imatrix else None
    if imatrix:
        qw[:7] = 0
    np.testing.assert_array_equal(quantize_native(t, x, qw), ggml_quantize(t, x, qw))


# relative RMS error of gguf's dequantization of the blocks on Gaussian rows: no llama.cpp needed
@pytest.mark.parametrize("t, bound", [(Type.IQ2_XXS, 0.40), (Type.IQ2_XS, 0.35), (Type.IQ2_S, 0.30),
                                      (Type.IQ3_XXS, 0.22), (Type.IQ3_S, 0.20),
                                      (Type.IQ1_S, 0.55), (Type.IQ1_M, 0.50)], ids=lambda v: getattr(v, "name", ""))
def test_native_grid_types_dequantize_near_their_rows(t, bound):
    import gguf
    x = rows_of("gauss", (4, 512))
    q = quantize_native(t, x, np.ones(512, np.float32))
    back = gguf.quants.dequantize(q, gguf.GGMLQuantizationType(int(t))).reshape(x.shape)
    err = np.sqrt(((back - x) ** 2).sum(1) / (x ** 2).sum(1))
    assert err.max() < bound, err


@pytest.mark.parametrize("t", [Type.Q8_0, Type.Q4_K, Type.IQ4_XS, Type.IQ3_S], ids=lambda t: t.name)
def test_native_float16_rows_equal_their_float32_values(t, monkeypatch):
    """float16 rows are converted a few at a time (here two a chunk) for the float32 kernels."""
    from torchggml.devices.cpu import quantize
    monkeypatch.setattr(quantize, "HALF_VALUES", 2 * 512)
    h = rows_of("edges", (4, 512)).astype(np.float16)
    np.testing.assert_array_equal(quantize_native(t, h), quantize_native(t, h.astype(np.float32)))
    h[2, 300] = np.inf
    with pytest.raises(ValueError, match="non-finite value \\(inf at row 2, column 300\\)"):
        quantize_native(t, h)


def test_native_accepts_torch_and_leading_dims():
    x = rows_of("gauss", (6, 256)).reshape(2, 3, 256)
    got = quantize_native("Q4_K", torch.from_numpy(x))
    assert got.shape == (6, 144)
    np.testing.assert_array_equal(got, quantize_native(Type.Q4_K, x.reshape(6, 256)))


@pytest.mark.parametrize("t, kernel", [(Type.Q4_K, "quantize_rows"), (Type.Q8_0, "quantize_rows"),
                                       (Type.IQ3_S, "quantize_grid_rows")], ids=lambda v: getattr(v, "name", v))
def test_native_read_only_and_writable_rows_share_one_kernel(t, kernel):
    """A file's read-only mapping and a writable buffer are two numba argument types: the
    quantizer gets its inputs read-only either way, so it is compiled once, not twice."""
    from torchggml.devices.cpu.jit import grid_quantize_kernels
    from torchggml.devices.cpu.jit.loader import quantize_kernels
    x = rows_of("gauss", (4, 256))
    read_only = x.copy()
    read_only.flags.writeable = False
    np.testing.assert_array_equal(quantize_native(t, read_only), quantize_native(t, x))
    np.testing.assert_array_equal(quantize_native(t, read_only, np.ones(256, np.float32)),
                                  quantize_native(t, x, np.ones(256, np.float32)))
    module = grid_quantize_kernels if kernel == "quantize_grid_rows" else quantize_kernels()
    signatures = getattr(module, kernel).signatures
    assert signatures and all(not sig[1].mutable and not sig[2].mutable for sig in signatures), signatures


# ---------------------------------------------------------------- importance matrix files

def _stats(seed=0):
    rng = np.random.default_rng(seed)
    return {"blk.0.ffn_up.weight": [torch.from_numpy(rng.uniform(0, 9, (1, 64)).astype(np.float32)),
                                    torch.tensor([96])],
            "blk.0.ffn_down_exps.weight": [torch.from_numpy(rng.uniform(0, 9, (3, 32)).astype(np.float32)),
                                           torch.tensor([10, 0, 4])]}


def test_imatrix_gguf_round_trip(tmp_path):
    """Our writer's file read back as llama-quantize reads it: sums / count per matrix, 1 where
    a matrix (an expert) was never used; the fields as llama-imatrix writes them."""
    import gguf
    from torchggml.tools.imatrix import write_imatrix
    from torchggml.tools.quantize import load_imatrix
    path = str(tmp_path / "m.gguf")
    stats = _stats()
    write_imatrix(path, stats, ["wiki.txt"], 3, 32)
    weights, info = load_imatrix(path)
    assert info == {"datasets": ["wiki.txt"], "chunk_count": 3, "chunk_size": 32}
    np.testing.assert_array_equal(weights["blk.0.ffn_up.weight"], stats["blk.0.ffn_up.weight"][0].numpy()[0] / 96)
    exps = weights["blk.0.ffn_down_exps.weight"].reshape(3, 32)
    sums = stats["blk.0.ffn_down_exps.weight"][0].numpy()
    np.testing.assert_array_equal(exps[0], sums[0] / np.float32(10))
    np.testing.assert_array_equal(exps[1], np.ones(32, np.float32))
    np.testing.assert_array_equal(exps[2], sums[2] / np.float32(4))
    r = gguf.GGUFReader(path)
    assert r.get_field("general.type").contents() == "imatrix" and r.get_field("general.architecture") is None
    assert [t.name for t in r.tensors] == ["blk.0.ffn_down_exps.weight.in_sum2", "blk.0.ffn_down_exps.weight.counts",
                                           "blk.0.ffn_up.weight.in_sum2", "blk.0.ffn_up.weight.counts"]
    by = {t.name: t for t in r.tensors}
    assert list(by["blk.0.ffn_down_exps.weight.in_sum2"].shape) == [32, 3]  # ggml ne [n_per_row, n_mat]
    assert list(by["blk.0.ffn_down_exps.weight.counts"].shape) == [1, 3]
    assert all(int(t.tensor_type) == 0 for t in r.tensors)  # F32


def _write_dat(path, entries, chunks=None, dataset=None):
    """llama.cpp's legacy .dat: n_entries, then per entry name, ncall, nval, sums; optional chunk
    count and dataset name."""
    with open(path, "wb") as f:
        f.write(struct.pack("<i", len(entries)))
        for name, (ncall, values) in entries.items():
            f.write(struct.pack("<i", len(name)) + name.encode() + struct.pack("<ii", ncall, len(values)))
            f.write(np.asarray(values, "<f4").tobytes())
        if chunks is not None:
            f.write(struct.pack("<i", chunks))
            f.write(struct.pack("<i", len(dataset)) + dataset.encode())


def test_imatrix_dat_is_read(tmp_path):
    from torchggml.tools.quantize import load_imatrix
    path = tmp_path / "old.dat"
    _write_dat(path, {"blk.0.attn_q.weight": (4, [8.0, 2.0, 6.0]), "output.weight": (0, [1.5])}, 12, "wiki")
    weights, info = load_imatrix(str(path))
    np.testing.assert_array_equal(weights["blk.0.attn_q.weight"], np.float32([2.0, 0.5, 1.5]))
    np.testing.assert_array_equal(weights["output.weight"], np.float32([1.5]))
    assert info["chunk_count"] == 12 and info["datasets"] == ["wiki"]


@pytest.mark.parametrize("include, exclude, keep", [
    (None, None, {"blk.0.attn_q.weight", "blk.0.ffn_up.weight", "output.weight"}),
    (["attn"], None, {"blk.0.attn_q.weight"}),
    (None, ["blk."], {"output.weight"}),
    (["blk."], ["ffn"], {"blk.0.attn_q.weight"}),
])
def test_include_exclude_weights(include, exclude, keep):
    from torchggml.tools.quantize import filter_imatrix
    w = {k: np.ones(1, np.float32) for k in ("blk.0.attn_q.weight", "blk.0.ffn_up.weight", "output.weight")}
    assert set(filter_imatrix(w, include, exclude)) == keep


# ---------------------------------------------------------------- quantize with an imatrix

def _demo_imatrix(tmp_path, scale_of=lambda name: 1.0):
    """An imatrix for every weight of the demo model with the right sizes."""
    from torchggml.gguf.loader import open_gguf
    from torchggml.gguf.writer.demo import demo_model_path
    from torchggml.tools.imatrix import write_imatrix
    f = open_gguf(demo_model_path())
    rng = np.random.default_rng(3)
    stats = {name: [torch.from_numpy((rng.uniform(0.1, 2, (1, t.ne[0])) * scale_of(name)).astype(np.float32)),
                    torch.tensor([1])]
             for name, t in f.tensors.items() if name.startswith("blk.") and name.endswith("weight") and len(t.ne) >= 2
             and t.ne[1] > 1}
    f.close()
    path = str(tmp_path / "demo-imatrix.gguf")
    write_imatrix(path, stats, ["synthetic"], 1, 128)
    return path, stats


def test_quantize_with_imatrix_uses_each_tensors_slice(tmp_path):
    """Every tensor with an entry is quantized with it (the bytes of quantize_native with that
    entry), the others without; the metadata names the imatrix as llama-quantize's does."""
    import gguf
    from torchggml.gguf.writer.demo import demo_model_path
    from torchggml.tools.quantize import quantize_file
    imatrix, stats = _demo_imatrix(tmp_path)
    out = str(tmp_path / "q.gguf")
    quantize_file(demo_model_path(), out, "Q4_K_M", imatrix=imatrix, exclude=["ffn_up"])
    src = {t.name: t for t in gguf.GGUFReader(demo_model_path()).tensors}
    r = gguf.GGUFReader(out)
    assert r.get_field("quantize.imatrix.file").contents() == imatrix
    assert r.get_field("quantize.imatrix.entries_count").contents() == len(stats) - 4  # ffn_up of 4 layers
    checked = 0
    for t in r.tensors:
        new = Type(int(t.tensor_type))
        if new not in NATIVE_TYPES:
            continue
        x = np.asarray(src[t.name].data, np.float32).reshape(-1, int(t.shape[0]))
        qw = stats[t.name][0].numpy()[0] if t.name in stats and "ffn_up" not in t.name else None
        np.testing.assert_array_equal(np.asarray(t.data).view(np.uint8).reshape(x.shape[0], -1),
                                      quantize_native(new, x, qw), err_msg=t.name)
        checked += 1
    assert checked > 20


def test_quantize_refuses_an_imatrix_of_another_model(tmp_path):
    from torchggml.gguf.writer.demo import demo_model_path
    from torchggml.tools.imatrix import write_imatrix
    from torchggml.tools.quantize import quantize_file
    path = str(tmp_path / "other.gguf")
    write_imatrix(path, {"blk.0.attn_q.weight": [torch.ones(1, 4096), torch.tensor([1])]}, ["x"], 1, 512)
    with pytest.raises(ValueError, match="imatrix holds 4096 values for blk.0.attn_q.weight, which needs 256"):
        quantize_file(demo_model_path(), str(tmp_path / "q.gguf"), "Q4_K_M", imatrix=path)


def test_quantize_refuses_an_imatrix_naming_no_tensor_of_the_model(tmp_path):
    from torchggml.gguf.writer.demo import demo_model_path
    from torchggml.tools.imatrix import write_imatrix
    from torchggml.tools.quantize import quantize_file
    path = str(tmp_path / "other.gguf")
    write_imatrix(path, {"model.layers.0.q_proj.weight": [torch.ones(1, 256), torch.tensor([1])]}, ["x"], 1, 512)
    with pytest.raises(ValueError, match="no imatrix entry names a tensor of .* another model.*q_proj"):
        quantize_file(demo_model_path(), str(tmp_path / "q.gguf"), "Q4_K_M", imatrix=path)
    assert not (tmp_path / "q.gguf").exists()


def test_quantize_refuses_requantize_without_the_flag(tmp_path):
    from torchggml.gguf.writer.demo import demo_model_path
    from torchggml.tools.quantize import quantize_file
    q8 = str(tmp_path / "q8.gguf")
    quantize_file(demo_model_path(), q8, "Q8_0")
    with pytest.raises(ValueError, match="is already Q8_0: requantizing .*--allow-requantize"):
        quantize_file(q8, str(tmp_path / "q4.gguf"), "Q4_0")
    quantize_file(q8, str(tmp_path / "q4.gguf"), "Q4_0", allow_requantize=True)


def test_imatrix_collects_squares_of_activations(tmp_path):
    """On the demo model: an entry per blk.* product weight, n_ctx rows counted per chunk, the sums
    of x^2 of the activations entering it (attn_q/k/v share their input: equal sums)."""
    from torchggml.gguf.writer.demo import CORPUS, demo_model_path
    from torchggml.models import load_model
    from torchggml.tools.imatrix import collect
    from torchggml.models.params import ModelParams
    m = load_model(demo_model_path(), ModelParams(n_ctx=64, progress=False))
    collector, r, n_chunks = collect(m, CORPUS * 2, max_chunks=2)
    m.close()
    assert n_chunks == 2 and r.n_windows == 2 and np.isfinite(r.ppl)
    names = set(collector.stats)
    assert names == {f"blk.{i}.{w}.weight" for i in range(4)
                     for w in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")}
    for name, (sums, counts) in collector.stats.items():
        assert counts.tolist() == [128], name
        assert sums.shape == (1, 768 if "ffn_down" in name else 256) and bool((sums > 0).all()), name
    q, k = collector.stats["blk.1.attn_q.weight"][0], collector.stats["blk.1.attn_k.weight"][0]
    torch.testing.assert_close(q, k, rtol=0, atol=0)


# ---------------------------------------------------------------- against llama.cpp's files

def _llama_cpp():
    return pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the llama.cpp comparisons)")


@pytest.mark.parametrize("ftype", ["Q4_K_M", "IQ4_XS", "Q4_0", "Q3_K_S", "IQ2_XS", "IQ3_S", "IQ2_M", "IQ1_M"])
def test_quantize_with_imatrix_equals_llama_quantize(tmp_path, ftype):
    """The whole file, byte for byte, with the same importance matrix given to llama-quantize
    (except the quantize.imatrix.* keys, which llama-quantize's main adds, not the library)."""
    from torchggml.gguf.writer.demo import demo_model_path
    from torchggml.tools.quantize import load_imatrix, quantize_file
    _llama_cpp()
    imatrix, _ = _demo_imatrix(tmp_path, lambda name: 50.0 if "ffn_down" in name else 1.0)
    weights, _ = load_imatrix(imatrix)
    theirs = tmp_path / "theirs.gguf"
    from test_tools import _llama_quantize
    _llama_quantize(demo_model_path(), theirs, ftype, imatrix=weights)
    ours = tmp_path / "ours.gguf"
    quantize_file(demo_model_path(), str(ours), ftype, imatrix=imatrix, imatrix_metadata=False)
    assert ours.read_bytes() == theirs.read_bytes()


def test_imatrix_file_reads_in_llama_cpps_gguf_reader(tmp_path):
    """Our imatrix file through llama.cpp's own GGUF reader (libggml-base's gguf_*), checked as
    common_imatrix_load checks it: the three keys with their types, F32 sums and counts per name."""
    if GGML is None:
        pytest.skip("llama-cpp-python (its libggml-base) is not installed")
    from torchggml.tools.imatrix import write_imatrix
    path = str(tmp_path / "m.gguf")
    write_imatrix(path, _stats(), ["wiki.txt"], 3, 32)
    lib = ctypes.CDLL(GGML_LIB)

    class InitParams(ctypes.Structure):
        _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]

    lib.gguf_init_from_file.restype = ctypes.c_void_p
    lib.gguf_init_from_file.argtypes = [ctypes.c_char_p, InitParams]
    for fn, res, args in [("gguf_find_key", ctypes.c_int64, [ctypes.c_void_p, ctypes.c_char_p]),
                          ("gguf_get_kv_type", ctypes.c_int, [ctypes.c_void_p, ctypes.c_int64]),
                          ("gguf_get_arr_type", ctypes.c_int, [ctypes.c_void_p, ctypes.c_int64]),
                          ("gguf_get_arr_n", ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_int64]),
                          ("gguf_get_arr_str", ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t]),
                          ("gguf_get_val_u32", ctypes.c_uint32, [ctypes.c_void_p, ctypes.c_int64]),
                          ("gguf_get_val_str", ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_int64]),
                          ("gguf_get_n_tensors", ctypes.c_int64, [ctypes.c_void_p]),
                          ("gguf_get_tensor_name", ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_int64]),
                          ("gguf_get_tensor_type", ctypes.c_int, [ctypes.c_void_p, ctypes.c_int64]),
                          ("gguf_free", None, [ctypes.c_void_p])]:
        getattr(lib, fn).restype = res
        getattr(lib, fn).argtypes = args
    ctx = lib.gguf_init_from_file(path.encode(), InitParams(True, None))
    assert ctx, "llama.cpp's reader refused the file"
    try:
        GGUF_TYPE_UINT32, GGUF_TYPE_STRING, GGUF_TYPE_ARRAY = 4, 8, 9
        key = lambda k: lib.gguf_find_key(ctx, k.encode())  # noqa: E731
        assert lib.gguf_get_val_str(ctx, key("general.type")) == b"imatrix"
        ds = key("imatrix.datasets")
        assert lib.gguf_get_kv_type(ctx, ds) == GGUF_TYPE_ARRAY and lib.gguf_get_arr_type(ctx, ds) == GGUF_TYPE_STRING
        assert [lib.gguf_get_arr_str(ctx, ds, i) for i in range(lib.gguf_get_arr_n(ctx, ds))] == [b"wiki.txt"]
        for k, v in (("imatrix.chunk_count", 3), ("imatrix.chunk_size", 32)):
            assert lib.gguf_get_kv_type(ctx, key(k)) == GGUF_TYPE_UINT32 and lib.gguf_get_val_u32(ctx, key(k)) == v
        names = [lib.gguf_get_tensor_name(ctx, i).decode() for i in range(lib.gguf_get_n_tensors(ctx))]
        assert sorted(names) == sorted(f"{n}.{s}" for n in _stats() for s in ("in_sum2", "counts"))
        assert all(lib.gguf_get_tensor_type(ctx, i) == 0 for i in range(len(names)))  # GGML_TYPE_F32
    finally:
        lib.gguf_free(ctx)


# ---------------------------------------------------------------- native dequantizers

def _random_rows(t: Type, rows: int, n: int, seed: int) -> np.ndarray:
    """Random bytes: every field of the block takes arbitrary values (scales NaN and inf included)."""
    return np.random.default_rng(seed).integers(0, 256, (rows, row_size(t, n)), dtype=np.uint8)


@pytest.mark.parametrize("t", DEQUANTIZE_TYPES, ids=lambda t: t.name)
def test_native_dequantize_equals_gguf_dequantize(t):
    import gguf
    import warnings
    raw = _random_rows(t, 24, 512, int(t))
    with warnings.catch_warnings():  # NaN scales: numpy warns
        warnings.simplefilter("ignore", RuntimeWarning)
        ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(int(t))).astype(np.float32).reshape(24, 512)
    got = dequantize_native(t, raw)
    nan = np.isnan(ref)  # a NaN's payload depends on the operand order of the CPU's multiply
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), ref[~nan].view(np.uint32))


@pytest.mark.parametrize("call, match", [
    (lambda: dequantize_native(Type.F32, np.zeros((1, 8), np.uint8)), "no native dequantizer for F32"),
    (lambda: dequantize_native(Type.Q8_0, np.zeros((1, 35), np.uint8)), "not whole blocks"),
    (lambda: dequantize_native(Type.Q8_0, np.zeros(34, np.uint8)), "uint8 \\[rows, row bytes\\]"),
    (lambda: dequantize_native(Type.Q8_0, np.zeros((2, 34), np.uint8), np.zeros((2, 31), np.float32)),
     "out must be float32"),
])
def test_native_dequantize_rejects_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
