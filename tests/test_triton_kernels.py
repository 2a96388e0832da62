"""torchggml.devices.triton against gguf's numpy reference (dequantize, get_rows) and float64 math (mul_mat).

Runs on CUDA when there is a GPU, otherwise in Triton's CPU interpreter (TRITON_INTERPRET=1, set
here before triton is imported). Shapes are tiny: the interpreter is slow.
"""
import os
import subprocess
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import gguf  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from torchggml.types import Type, type_traits  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
if not INTERPRET and not torch.cuda.is_available():
    pytest.skip("no CUDA device and TRITON_INTERPRET is not 1: nothing can run Triton kernels",
                allow_module_level=True)

# Triton chooses interpreter or compiler when a function is decorated, i.e. at import. If another
# test module imported triton before TRITON_INTERPRET was set, this process cannot interpret:
# then one test runs this file in a fresh process instead.
STALE_TRITON = INTERPRET and "triton" in sys.modules and \
    type(sys.modules["triton"].language.zeros).__name__ != "InterpretedFunction"
needs_kernels = pytest.mark.skipif(
    STALE_TRITON, reason="triton was imported here without the interpreter; "
                         "test_in_fresh_process runs these tests")

import torchggml.devices.triton as tk  # noqa: E402

DEVICE = "cpu" if INTERPRET else "cuda"
TYPES = list(tk.SUPPORTED_TYPES)

# byte offsets of fp16 scale fields: random bytes there would give inf/NaN scales
F16_FIELDS = {
    Type.Q4_0: [0], Type.Q4_1: [0, 2], Type.Q5_0: [0], Type.Q5_1: [0, 2], Type.Q8_0: [0],
    Type.Q2_K: [80, 82], Type.Q3_K: [108], Type.Q4_K: [0, 2], Type.Q5_K: [0, 2], Type.Q6_K: [208],
    Type.IQ4_NL: [0], Type.IQ4_XS: [0], Type.TQ1_0: [52], Type.TQ2_0: [64], Type.MXFP4: [],
}


def random_rows(qtype: Type, n_rows: int, n_blocks: int, seed: int) -> torch.Tensor:
    """uint8 [n_rows, row_bytes]: random quant bits and scales, finite scales of random sign."""
    rng = np.random.default_rng(seed)
    traits = type_traits(qtype)
    if not traits.is_quantized:
        values = torch.from_numpy(rng.uniform(-1, 1, (n_rows, n_blocks)).astype(np.float32))
        return values.to(traits.dtype).view(torch.uint8).reshape(n_rows, -1).to(DEVICE)
    data = rng.integers(0, 256, (n_rows, n_blocks, traits.type_size), dtype=np.uint8)
    for offset in F16_FIELDS[qtype]:
        scale = rng.uniform(0.002, 0.02, (n_rows, n_blocks)) * rng.choice([-1, 1], (n_rows, n_blocks))
        data[:, :, offset:offset + 2] = scale.astype(np.float16).view(np.uint8).reshape(n_rows, n_blocks, 2)
    if qtype == Type.MXFP4:
        data[:, :, 0] = rng.integers(118, 130, (n_rows, n_blocks))  # e8m0 exponents near 2^-4..2^3
    return torch.from_numpy(data.reshape(n_rows, -1)).to(DEVICE)


def reference(qtype: Type, rows: torch.Tensor) -> np.ndarray:
    return gguf.quants.dequantize(rows.cpu().numpy(), gguf.GGMLQuantizationType(int(qtype)))


def n_blocks_for(qtype: Type) -> int:
    """2 super-blocks, 3 small blocks (a ragged K step), 96 plain values."""
    return {256: 2, 32: 3, 1: 96}[type_traits(qtype).blck_size]


def random_x(m: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(m, k, generator=g) * 2 - 1).to(dtype).to(DEVICE)


def nmse(got: torch.Tensor, ref: np.ndarray) -> float:
    got = got.double().cpu().numpy()
    return float(((got - ref) ** 2).sum() / (ref ** 2).sum())


# -----------------------------------------------------------------------------------------------
# dequantize / get_rows: bit-exact

@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@needs_kernels
def test_dequantize_matches_gguf_exactly(qtype):
    rows = random_rows(qtype, 5, n_blocks_for(qtype), seed=int(qtype))
    ref = reference(qtype, rows)
    got = tk.dequantize(qtype, rows, dtype=torch.float32)
    assert got.shape == ref.shape and got.dtype == torch.float32
    np.testing.assert_array_equal(got.cpu().numpy(), ref)


@pytest.mark.parametrize("qtype,dtype", [
    (Type.Q4_K, torch.float16), (Type.Q8_0, torch.float16), (Type.Q6_K, torch.bfloat16),
    (Type.BF16, torch.bfloat16), (Type.IQ4_NL, torch.bfloat16),
], ids=str)
@needs_kernels
def test_dequantize_rounds_once_to_half_types(qtype, dtype):
    rows = random_rows(qtype, 3, n_blocks_for(qtype), seed=7)
    got = tk.dequantize(int(qtype), rows, dtype=dtype)
    assert got.dtype == dtype
    expected = torch.from_numpy(reference(qtype, rows)).to(dtype)
    assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@needs_kernels
def test_get_rows_matches_gguf_exactly(qtype):
    rows = random_rows(qtype, 6, n_blocks_for(qtype), seed=100 + int(qtype))
    ref = reference(qtype, rows)
    index_dtype = torch.int32 if int(qtype) % 2 else torch.int64
    ids = torch.tensor([4, 0, 4, 5, 2], dtype=index_dtype, device=DEVICE)
    got = tk.get_rows(qtype, rows, ids)
    assert got.dtype == torch.float32
    np.testing.assert_array_equal(got.cpu().numpy(), ref[ids.cpu().numpy()])


# -----------------------------------------------------------------------------------------------
# mul_mat: normalized MSE against float64

# (M, N, x dtype, kernel, split_k): both families, ragged M and N, split-K, the default dispatch
MUL_MAT_CASES = [
    (1, 5, torch.float32, "matvec", 1),
    (16, 5, torch.float16, None, None),
    (1, 33, torch.float16, "matvec", 2),
    (3, 33, torch.float32, "matvec", 2),
    (3, 5, torch.bfloat16, None, None),
    (17, 33, torch.float32, "gemm", None),
    (17, 5, torch.bfloat16, None, None),
]


@pytest.mark.parametrize("m,n,x_dtype,kernel,split_k", MUL_MAT_CASES, ids=str)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@needs_kernels
def test_mul_mat_matches_float64(qtype, m, n, x_dtype, kernel, split_k):
    n_blocks = n_blocks_for(qtype)
    k = n_blocks * type_traits(qtype).blck_size
    rows = random_rows(qtype, n, n_blocks, seed=m * 1000 + n + int(qtype))
    x = random_x(m, k, x_dtype, seed=m + n)
    out = torch.full((m, n), float("nan"), device=DEVICE)
    result = tk.mul_mat(qtype, rows, x, out, kernel=kernel, split_k=split_k)
    assert result is out
    assert not torch.isnan(out).any(), "some outputs were never written"
    ref = x.double().cpu().numpy() @ reference(qtype, rows).astype(np.float64).T
    assert nmse(out, ref) <= 5e-4


@pytest.mark.parametrize("kernel", ["matvec", "gemm"])
@needs_kernels
def test_mul_mat_strided_operands(kernel):
    """x and out as column-major views; out allocated by mul_mat when not given."""
    qtype = Type.Q4_0
    rows = random_rows(qtype, 9, 3, seed=5)
    x = random_x(96, 4, torch.float32, seed=6).t()          # [4, 96], strides (1, 4)
    ref = x.double().cpu().numpy() @ reference(qtype, rows).astype(np.float64).T
    out = torch.full((9, 4), float("nan"), device=DEVICE).t()  # [4, 9], strides (1, 4)
    tk.mul_mat(qtype, rows, x, out, kernel=kernel, split_k=3 if kernel == "matvec" else None)
    assert nmse(out, ref) <= 5e-4
    fresh = tk.mul_mat(qtype, rows, x, kernel=kernel)
    assert fresh.shape == (4, 9) and fresh.dtype == torch.float32
    assert nmse(fresh, ref) <= 5e-4


# -----------------------------------------------------------------------------------------------
# mul_mat_id

@pytest.mark.parametrize("qtype,x_slots", [(Type.Q4_0, 2), (Type.Q4_K, 1), (Type.F16, 2)],
                         ids=str)
@needs_kernels
def test_mul_mat_id_matches_float64(qtype, x_slots):
    n_expert, n, n_tokens, n_used = 4, 5, 3, 2
    n_blocks = n_blocks_for(qtype)
    k = n_blocks * type_traits(qtype).blck_size
    experts = torch.stack([random_rows(qtype, n, n_blocks, seed=e) for e in range(n_expert)])
    x = random_x(n_tokens * x_slots, k, torch.float32, seed=9).reshape(n_tokens, x_slots, k)
    ids = torch.tensor([[3, 0], [0, 2], [3, 1]], dtype=torch.int32, device=DEVICE)
    out = torch.full((n_tokens, n_used, n), float("nan"), device=DEVICE)
    tk.mul_mat_id(qtype, experts, x, ids, out)
    weights = np.stack([reference(qtype, experts[e]).astype(np.float64) for e in range(n_expert)])
    x64 = x.double().cpu().numpy()
    ref = np.stack([
        np.stack([weights[ids[t, u]] @ x64[t, u if x_slots == n_used else 0] for u in range(n_used)])
        for t in range(n_tokens)
    ])
    assert nmse(out, ref) <= 5e-4


# -----------------------------------------------------------------------------------------------
# supports / bad input

@needs_kernels
def test_supports():
    assert tk.supports(Type.Q4_0) and tk.supports(int(Type.Q6_K)) and tk.supports(Type.BF16)
    assert not tk.supports(Type.IQ2_XXS) and not tk.supports(Type.F32) and not tk.supports(999)
    assert all(isinstance(t, Type) for t in tk.SUPPORTED_TYPES)


def _q4_0(n_rows=2, n_blocks=1):
    return random_rows(Type.Q4_0, n_rows, n_blocks, seed=1)


BAD_CALLS = [
    ("unsupported type", ValueError, lambda: tk.dequantize(Type.IQ2_XXS, _q4_0())),
    ("unknown type id", ValueError, lambda: tk.dequantize(999, _q4_0())),
    ("qtype not a type", TypeError, lambda: tk.dequantize(2.0, _q4_0())),
    ("blocks not uint8", TypeError, lambda: tk.dequantize(Type.Q4_0, _q4_0().float())),
    ("blocks not a tensor", TypeError, lambda: tk.dequantize(Type.Q4_0, _q4_0().tolist())),
    ("blocks 1-D", ValueError, lambda: tk.dequantize(Type.Q4_0, _q4_0().reshape(-1))),
    ("partial block", ValueError, lambda: tk.dequantize(Type.Q4_0, _q4_0()[:, :17])),
    ("strided rows", ValueError, lambda: tk.dequantize(Type.Q4_0, _q4_0(2, 2)[:, ::2])),
    ("bad out dtype", TypeError, lambda: tk.dequantize(Type.Q4_0, _q4_0(), dtype=torch.int32)),
    ("ids float", TypeError, lambda: tk.get_rows(Type.Q4_0, _q4_0(), torch.zeros(1, device=DEVICE))),
    ("ids 2-D", ValueError, lambda: tk.get_rows(Type.Q4_0, _q4_0(), torch.zeros(1, 1, dtype=torch.int32, device=DEVICE))),
    ("ids out of range", ValueError, lambda: tk.get_rows(Type.Q4_0, _q4_0(), torch.tensor([2], device=DEVICE))),
    ("x wrong K", ValueError, lambda: tk.mul_mat(Type.Q4_0, _q4_0(), torch.zeros(1, 64, device=DEVICE))),
    ("x int", TypeError, lambda: tk.mul_mat(Type.Q4_0, _q4_0(), torch.zeros(1, 32, dtype=torch.int32, device=DEVICE))),
    ("x 1-D", ValueError, lambda: tk.mul_mat(Type.Q4_0, _q4_0(), torch.zeros(32, device=DEVICE))),
    ("out wrong shape", ValueError, lambda: tk.mul_mat(Type.Q4_0, _q4_0(), torch.zeros(1, 32, device=DEVICE), torch.zeros(2, 1, device=DEVICE))),
    ("out not float32", TypeError, lambda: tk.mul_mat(Type.Q4_0, _q4_0(), torch.zeros(1, 32, device=DEVICE), torch.zeros(1, 2, dtype=torch.float16, device=DEVICE))),
    ("unknown kernel", ValueError, lambda: tk.mul_mat(Type.Q4_0, _q4_0(), torch.zeros(1, 32, device=DEVICE), kernel="cublas")),
    ("matvec with M > 16", ValueError, lambda: tk.mul_mat(Type.Q4_0, _q4_0(), torch.zeros(17, 32, device=DEVICE), kernel="matvec")),
    ("bad split_k", ValueError, lambda: tk.mul_mat(Type.Q4_0, _q4_0(), torch.zeros(1, 32, device=DEVICE), split_k=0)),
    ("tensor on meta", ValueError, lambda: tk.dequantize(Type.Q4_0, torch.zeros(2, 18, dtype=torch.uint8, device="meta"))),
    ("expert ids out of range", ValueError, lambda: tk.mul_mat_id(Type.Q4_0, _q4_0().reshape(1, 2, 18), torch.zeros(1, 1, 32, device=DEVICE), torch.ones(1, 1, dtype=torch.int32, device=DEVICE))),
    ("expert x slots", ValueError, lambda: tk.mul_mat_id(Type.Q4_0, _q4_0().reshape(1, 2, 18), torch.zeros(1, 3, 32, device=DEVICE), torch.zeros(1, 2, dtype=torch.int32, device=DEVICE))),
    ("expert blocks 2-D", ValueError, lambda: tk.mul_mat_id(Type.Q4_0, _q4_0(), torch.zeros(1, 1, 32, device=DEVICE), torch.zeros(1, 1, dtype=torch.int32, device=DEVICE))),
]


@pytest.mark.parametrize("what,error,call", BAD_CALLS, ids=[case[0] for case in BAD_CALLS])
@needs_kernels
def test_bad_input_raises(what, error, call):
    with pytest.raises(error):
        call()


@pytest.mark.skipif(not STALE_TRITON, reason="this process runs the kernels itself")
def test_in_fresh_process():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
                         env=env, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
