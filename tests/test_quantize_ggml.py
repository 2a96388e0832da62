"""quants.quantize against llama.cpp's own C quantizers, byte for byte.

The reference is `quantize_row_<type>_ref` (ggml-quants.c) in the libggml-base that
llama-cpp-python ships, called through ctypes: what llama.cpp writes model files and (through
the CPU backend's from_float) KV caches with. Without llama-cpp-python these tests skip and
say so. The gguf package has no quantizer for the K types, IQ4_NL or IQ4_XS; test_quants.py
checks the types it has.

Also: leading shapes and multi-block rows, round-trip error bounds on the same hard inputs,
and CPY / SET_ROWS into the new types on a SIM device.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

import torchggml as ggml
from torchggml.quants import dequantize, quantize, quantize_types
from torchggml.test_ops.runner import all_cases, check_case_against_reference
from torchggml.types import Type, type_traits

from test_quants import ROUNDTRIP_RMSE

BLOCK_TYPES = [t for t in quantize_types() if type_traits(t).is_quantized]
NEW_TYPES = [Type.Q2_K, Type.Q3_K, Type.Q4_K, Type.Q5_K, Type.Q6_K, Type.IQ4_XS]


@functools.lru_cache(maxsize=None)
def libggml_base():
    """(the ctypes library, None) or (None, why not)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return None, "llama-cpp-python is not installed (it ships llama.cpp's quantizers)"
    lib_dir = Path(spec.origin).parent / "lib"
    found = sorted(lib_dir.glob("*ggml-base.*"))
    if not found:
        return None, f"no libggml-base in {lib_dir}"
    try:
        return ctypes.CDLL(str(found[0])), None
    except OSError as e:
        return None, f"cannot load {found[0]}: {e}"


def ref_function_name(t: Type) -> str:
    """ggml's spelling: quantize_row_q4_K_ref, quantize_row_iq4_xs_ref, ..."""
    name = t.name.lower()
    return f"quantize_row_{name[:-2] + '_K' if name.endswith('_k') else name}_ref"


def ggml_quantize(t: Type, x: np.ndarray) -> np.ndarray:
    """llama.cpp's quantize_row_*_ref over all of x (rows of whole blocks) -> uint8 [rows, bytes]."""
    lib, why = libggml_base()
    if lib is None:
        pytest.skip(why)
    fn = getattr(lib, ref_function_name(t), None)
    if fn is None:
        pytest.skip(f"this libggml-base has no {ref_function_name(t)}")
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
    x = np.ascontiguousarray(x, dtype=np.float32)
    tr = type_traits(t)
    out = np.zeros((x.shape[0], x.shape[1] // tr.blck_size * tr.type_size), dtype=np.uint8)
    fn(x.ctypes.data, out.ctypes.data, x.size)
    return out


# ----------------------------------------------------------------------------- hard inputs

N = 512  # values per row: two 256-value super-blocks, sixteen 32-value blocks


def _with(values, at, row):
    row = row.copy()
    row[at] = values
    return row


def _sub_blocks_of_every_scale(rng):
    row = rng.standard_normal(N)
    row[:16] = 0            # a dead sub-block
    row[32:64] *= 1e-20     # a tiny one
    row[64:96] *= 1e6       # a huge one
    return row


# name -> rows [r, N] (float64, made float32 by the table); every row holds 2 super-blocks
HARD_INPUTS = {
    "gaussian": lambda rng: rng.standard_normal((3, N)) * np.array([[1.0], [1e-3], [50.0]]),
    "all zeros": lambda rng: np.zeros((1, N)),
    "negative zeros": lambda rng: np.full((1, N), -0.0),
    "constant": lambda rng: np.full((1, N), 0.75),
    "negative constant": lambda rng: np.full((1, N), -3.5),
    "huge magnitudes": lambda rng: rng.standard_normal((2, N)) * np.array([[1e18], [1e30]]),
    "largest floats": lambda rng: np.where(rng.random((1, N)) < 0.5, 3e38, -3e38),
    "tiny magnitudes": lambda rng: rng.standard_normal((2, N)) * np.array([[1e-15], [1e-30]]),
    "subnormal": lambda rng: rng.standard_normal((1, N)) * 1e-40,
    "single outlier": lambda rng: _with(1e3, 77, rng.standard_normal(N) * 0.01)[None],
    "negative only": lambda rng: -np.abs(rng.standard_normal((1, N))),
    "positive only": lambda rng: np.abs(rng.standard_normal((1, N))) + 1,
    "small integers": lambda rng: rng.integers(-8, 8, (1, N)).astype(float),
    "halves (rounding ties)": lambda rng: rng.integers(-20, 20, (1, N)) + 0.5,
    "one non-zero": lambda rng: _with(1.0, 5, np.zeros(N))[None],
    "+max and -max": lambda rng: _with([-1.0, 1.0], [5, 200], np.zeros(N))[None],
    "sub-blocks of every scale": lambda rng: _sub_blocks_of_every_scale(rng)[None],
    "heavy tails": lambda rng: rng.standard_normal((2, N)) ** 3,
    "sparse": lambda rng: rng.standard_normal((2, N)) * (rng.random((2, N)) < 0.1),
}


@functools.lru_cache(maxsize=None)
def hard_rows() -> tuple[np.ndarray, dict]:
    """All hard inputs stacked (float32 [rows, N]) and each input's row slice."""
    rng = np.random.default_rng(14)
    parts, where, start = [], {}, 0
    for name, make in HARD_INPUTS.items():
        rows = np.asarray(make(rng), dtype=np.float32).reshape(-1, N)
        parts.append(rows)
        where[name] = slice(start, start + len(rows))
        start += len(rows)
    return np.concatenate(parts), where


@functools.lru_cache(maxsize=None)
def quantized_both_ways(t: Type) -> tuple[np.ndarray, np.ndarray]:
    """(torchggml's bytes, llama.cpp's bytes) for every hard row, each computed once per type
    (blocks are quantized independently, so one call covers every input)."""
    x, _ = hard_rows()
    return quantize(t, torch.from_numpy(x)).numpy(), ggml_quantize(t, x)


def undefined_bytes(t: Type, x: np.ndarray) -> np.ndarray:
    """Bytes [rows, row_bytes] C leaves undefined: IQ4_NL's indices of blocks below
    GROUP_MAX_EPS (d = 0; C writes whatever its index buffer held before, we write 8s)."""
    undefined = np.zeros((x.shape[0], x.shape[1] // type_traits(t).blck_size * type_traits(t).type_size), bool)
    if t == Type.IQ4_NL:
        dead = np.abs(x.reshape(x.shape[0], -1, 32)).max(-1) < 1e-15
        undefined.reshape(x.shape[0], -1, 18)[:, :, 2:] = dead[..., None]
    return undefined


@pytest.mark.parametrize("name", HARD_INPUTS)
@pytest.mark.parametrize("t", BLOCK_TYPES, ids=lambda t: t.name)
def test_quantize_matches_llama_cpp(t, name):
    ours, ref = quantized_both_ways(t)
    x, where = hard_rows()
    rows = where[name]
    ours, ref = ours[rows].copy(), ref[rows].copy()
    skip = undefined_bytes(t, x[rows])
    ours[skip] = ref[skip] = 0
    differ = np.nonzero((ours != ref).any(-1))[0]
    assert not len(differ), (f"{t.name} on {name!r}: row {differ[0]} differs at bytes "
                             f"{np.nonzero(ours[differ[0]] != ref[differ[0]])[0][:12].tolist()}")


@pytest.mark.parametrize("t", NEW_TYPES + [Type.IQ4_NL, Type.Q8_K], ids=lambda t: t.name)
def test_quantize_leading_shape_and_strides(t):
    """Any leading shape, rows of several blocks, a non-contiguous input: the same bytes as
    llama.cpp quantizing the rows one after another."""
    gen = torch.Generator().manual_seed(int(t))
    x = torch.randn(2, 3, 2 * 256, generator=gen) * 3
    out = quantize(t, x)
    row_bytes = 2 * 256 // type_traits(t).blck_size * type_traits(t).type_size
    assert out.shape == (2, 3, row_bytes) and out.dtype == torch.uint8
    np.testing.assert_array_equal(out.reshape(6, -1).numpy(), ggml_quantize(t, x.reshape(6, -1).numpy()))
    strided = x.transpose(0, 1).contiguous().transpose(0, 1)
    assert torch.equal(quantize(t, strided), out)
    assert torch.equal(quantize(t, x.double()), out)  # other float dtypes go through float32


# ---------------------------------------------------------------------------- round trips

# the inputs whose super-block scales fit in fp16 (the others overflow or flush by design)
ROUNDTRIP_INPUTS = ["gaussian", "constant", "negative constant", "single outlier", "negative only",
                    "positive only", "small integers", "heavy tails", "sparse"]


@pytest.mark.parametrize("name", ROUNDTRIP_INPUTS + ["all zeros"])
@pytest.mark.parametrize("t", NEW_TYPES + [Type.IQ4_NL], ids=lambda t: t.name)
def test_roundtrip_error(t, name):
    """Gaussian rows within test_quants' bound for the type; the other inputs within 1.5x."""
    x, where = hard_rows()
    x = torch.from_numpy(x[where[name]])
    y = dequantize(t, quantize(t, x))
    if name == "all zeros":
        assert torch.equal(y, torch.zeros_like(x))
        return
    # per row: relative to the row's RMS (an outlier sets the scale of its whole block)
    rmse = ((y - x).pow(2).mean(-1) / x.pow(2).mean(-1)).sqrt().max().item()
    bound = ROUNDTRIP_RMSE[t] * (1.5 if name != "gaussian" else 1.0)
    assert rmse <= bound, f"{t.name} on {name!r}: relative RMS error {rmse:.3g} > {bound:.3g}"


# ------------------------------------------------------------------- ops on a SIM device

SIM_CASES = [c for c in all_cases() if c.op in ("cpy", "set_rows")
             and any(f"{t.name}" in c.desc for t in NEW_TYPES)]


@pytest.fixture(scope="module")
def sim0():
    backend = ggml.backend_init_by_name("SIM0")
    if backend is None:
        pytest.skip("no SIM0 device (TORCHGGML_SIM_DEVICES is 0)")
    return backend


def test_new_types_have_op_cases():
    for t in NEW_TYPES:
        assert any(t.name in c.desc and c.op == "cpy" for c in SIM_CASES), t.name
        assert any(t.name in c.desc and c.op == "set_rows" for c in SIM_CASES), t.name


@pytest.mark.parametrize("case", SIM_CASES, ids=[c.name for c in SIM_CASES])
def test_quantizing_ops_on_sim(case, sim0):
    ok, err = check_case_against_reference(case, sim0)
    assert ok, f"{case.name} on SIM0: normalized MSE {err:.3g} exceeds {case.max_nmse:g}"
