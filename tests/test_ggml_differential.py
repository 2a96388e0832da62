"""torchggml against ggml itself: each case builds one op both in torchggml and, through ctypes,
in the libggml that llama-cpp-python bundles (ggml_init, the op's C builder, 
ggml_graph_compute_with_ctx on its CPU backend), fills both with the same values and compares
the outputs. Skipped, with the reason, where llama-cpp-python (and so libggml) is not installed.

The bundled ggml is llama-cpp-python's, not the commit torchggml pins (enums.GGML_COMMIT); ops
are called by their builder names (not by enum ids), so the two agree wherever the op's
semantics did not change between those versions. Coverage: the ops in CASES (element-wise,
norms, soft_max, rope, matrix products, rows, reductions, the training ops, pooling, im2col and
direct convolutions)."""
import ctypes
import os

import numpy as np
import pytest
import torch

import torchggml as ggml

T = ggml.Type


def _load():
    try:
        import llama_cpp
    except ImportError:
        return None, "llama-cpp-python is not installed (it bundles the libggml these tests call)"
    lib_dir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    try:
        base = ctypes.CDLL(os.path.join(lib_dir, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
        cpu = ctypes.CDLL(os.path.join(lib_dir, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        return None, f"llama-cpp-python's libggml could not be loaded: {e}"
    return (base, cpu), None


LIBS, WHY_NOT = _load()
pytestmark = pytest.mark.skipif(LIBS is None, reason=WHY_NOT or "")


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


class CGGML:
    """ggml's C API over ctypes: a context with memory, tensors, op builders by name, compute."""

    def __init__(self, mem_size: int = 256 << 20):
        self.base, self.cpu = LIBS
        self.base.ggml_init.restype = ctypes.c_void_p
        self.base.ggml_init.argtypes = [_InitParams]
        self.cpu.ggml_cpu_init()
        self.ctx = self.base.ggml_init(_InitParams(mem_size, None, False))
        for name, res in (("ggml_new_tensor", ctypes.c_void_p), ("ggml_get_data", ctypes.c_void_p),
                          ("ggml_nbytes", ctypes.c_size_t), ("ggml_new_graph_custom", ctypes.c_void_p)):
            getattr(self.base, name).restype = res
        self.base.ggml_get_data.argtypes = [ctypes.c_void_p]
        self.base.ggml_nbytes.argtypes = [ctypes.c_void_p]

    def free(self):
        self.base.ggml_free(ctypes.c_void_p(self.ctx))

    def tensor(self, type, ne):
        arr = (ctypes.c_int64 * 4)(*ne)
        self.base.ggml_new_tensor.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        return self.base.ggml_new_tensor(self.ctx, int(type), 4, arr)

    def op(self, name, *args):
        """ggml_<name>(ctx, *args): tensors are CTensor pointers (int), floats c_float, bools c_bool."""
        fn = getattr(self.base, "ggml_" + name)
        fn.restype = ctypes.c_void_p
        conv = [ctypes.c_void_p(self.ctx)]
        for a in args:
            if isinstance(a, Ptr):
                conv.append(ctypes.c_void_p(a.p))
            elif a is None:
                conv.append(ctypes.c_void_p(None))
            elif isinstance(a, bool):
                conv.append(ctypes.c_bool(a))
            elif isinstance(a, float):
                conv.append(ctypes.c_float(a))
            elif isinstance(a, (list, tuple)):
                conv.append((ctypes.c_int * len(a))(*a))
            else:
                conv.append(ctypes.c_int(int(a)))
        return fn(*conv)

    def set(self, t, values: np.ndarray):
        data = np.ascontiguousarray(values)
        assert self.base.ggml_nbytes(t) == data.nbytes
        ctypes.memmove(self.base.ggml_get_data(t), data.ctypes.data, data.nbytes)

    def get(self, t, dtype, shape):
        out = np.empty(shape, dtype=dtype)
        assert self.base.ggml_nbytes(t) == out.nbytes, "ggml's result has another size than torchggml's"
        ctypes.memmove(out.ctypes.data, self.base.ggml_get_data(t), out.nbytes)
        return out

    def compute(self, out):
        self.base.ggml_new_graph_custom.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_bool]
        graph = self.base.ggml_new_graph_custom(self.ctx, 2048, False)
        self.base.ggml_build_forward_expand.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self.base.ggml_build_forward_expand(graph, out)
        self.cpu.ggml_graph_compute_with_ctx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        status = self.cpu.ggml_graph_compute_with_ctx(self.ctx, graph, 2)
        assert status == 0, f"ggml_graph_compute_with_ctx returned {status}"


class Ptr:
    def __init__(self, p):
        self.p = p


# ---------------------------------------------------------------- the cases
# (name, inputs [(type, ne, kind)], builder: (lib, ctx, *inputs) -> output, where `lib` is
# torchggml's module or the C wrapper (`op(name, ...)`) and inputs are tensors of that side)

def _c(name, *params):
    """The same call on either side: torchggml's function or ggml's C builder."""
    def call(side, ctx, *tensors):
        return side.call(name, ctx, *tensors, *params)
    return call


R, P = ggml.RopeType, ggml.OpPool
F32, F16, I32 = T.F32, T.F16, T.I32
X = (F32, (33, 5, 3, 2), "uniform")

CASES = {
    **{f"unary {u}": ([X], _c(u)) for u in ("abs", "neg", "relu", "silu", "gelu", "gelu_erf", "gelu_quick", "tanh",
                                             "sigmoid", "exp", "elu", "hardswish", "hardsigmoid", "sgn", "step",
                                             "sqr", "sin", "cos", "floor", "ceil", "round", "trunc")},
    "sqrt": ([(F32, (33, 5, 3, 2), "positive")], _c("sqrt")),
    "log": ([(F32, (33, 5, 3, 2), "positive")], _c("log")),
    **{f"binary {b} broadcast": ([X, (F32, (33, 1, 3, 1), "positive")], _c(b)) for b in ("add", "sub", "mul", "div")},
    "add1": ([X, (F32, (1, 1, 1, 1), "uniform")], _c("add1")),
    "scale": ([X], _c("scale", 0.75)),
    "clamp": ([X], _c("clamp", -0.3, 0.4)),
    "leaky_relu": ([X], _c("leaky_relu", 0.1, False)),
    "norm": ([X], _c("norm", 1e-5)),
    "rms_norm": ([X], _c("rms_norm", 1e-5)),
    "l2_norm": ([X], _c("l2_norm", 1e-6)),
    "group_norm": ([(F32, (6, 5, 8, 2), "uniform")], _c("group_norm", 4, 1e-6)),
    "soft_max": ([X], _c("soft_max")),
    "soft_max_ext mask scale": ([(F32, (32, 6, 4, 1), "uniform"), (F32, (32, 6, 1, 1), "uniform")],
                                _c("soft_max_ext", 0.5, 0.0)),
    "sum_rows": ([X], _c("sum_rows")),
    "mean": ([X], _c("mean")),
    "sum": ([X], _c("sum")),
    "argmax": ([(F32, (33, 7, 1, 1), "distinct")], _c("argmax")),
    "repeat": ([(F32, (4, 1, 3, 1), "uniform"), (F32, (8, 5, 3, 2), "uniform")], _c("repeat")),
    "repeat_back": ([(F32, (8, 6, 3, 2), "uniform"), (F32, (4, 3, 3, 1), "uniform")], _c("repeat_back")),
    "concat dim 1": ([(F32, (8, 3, 2, 1), "uniform"), (F32, (8, 5, 2, 1), "uniform")], _c("concat", 1)),
    "mul_mat": ([(F32, (64, 7, 2, 1), "uniform"), (F32, (64, 9, 4, 3), "uniform")], _c("mul_mat")),
    "mul_mat f16": ([(F16, (64, 7, 1, 1), "uniform"), (F32, (64, 5, 1, 1), "uniform")], _c("mul_mat")),
    "out_prod": ([(F32, (16, 8, 1, 1), "uniform"), (F32, (12, 8, 1, 1), "uniform")], _c("out_prod")),
    "get_rows": ([(F32, (16, 10, 1, 1), "uniform"), (I32, (6, 1, 1, 1), "rows10")], _c("get_rows")),
    "swiglu split": ([X, X], _c("swiglu_split")),
    "geglu split": ([X, X], _c("geglu_split")),
    "rope normal": ([(F32, (64, 4, 5, 1), "uniform"), (I32, (5, 1, 1, 1), "positions")],
                    _c("rope_ext", None, 64, int(R.NORMAL), 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)),
    "rope neox yarn": ([(F32, (64, 4, 5, 1), "uniform"), (I32, (5, 1, 1, 1), "positions")],
                       _c("rope_ext", None, 32, int(R.NEOX), 512, 10000.0, 0.5, 1.0, 1.0, 32.0, 1.0)),
    # training ops
    "silu_back": ([X, X], _c("silu_back")),
    "rms_norm_back": ([X, X], _c("rms_norm_back", 1e-5)),
    "soft_max_ext_back": ([X, (F32, (33, 5, 3, 2), "positive")], _c("soft_max_ext_back", 0.8, 0.0)),
    "get_rows_back": ([(F32, (16, 6, 1, 1), "uniform"), (I32, (6, 1, 1, 1), "rows10"), (F32, (16, 10, 1, 1), "uniform")],
                      _c("get_rows_back")),
    "rope_ext_back": ([(F32, (64, 4, 5, 1), "uniform"), (I32, (5, 1, 1, 1), "positions")],
                      _c("rope_ext_back", None, 64, int(R.NEOX), 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)),
    "cross_entropy_loss": ([(F32, (10, 5, 4, 3), "uniform"), (F32, (10, 5, 4, 3), "positive")],
                           _c("cross_entropy_loss")),
    "cross_entropy_loss_back": ([(F32, (1, 1, 1, 1), "uniform"), (F32, (10, 5, 4, 3), "uniform"),
                                 (F32, (10, 5, 4, 3), "positive")], _c("cross_entropy_loss_back")),
    "opt_step_sgd": ([(F32, (10, 5, 4, 3), "param"), (F32, (10, 5, 4, 3), "uniform"), (F32, (2, 1, 1, 1), "positive")],
                     _c("opt_step_sgd")),
    "opt_step_adamw": ([(F32, (10, 5, 4, 3), "param"), (F32, (10, 5, 4, 3), "uniform"), (F32, (10, 5, 4, 3), "positive"),
                        (F32, (10, 5, 4, 3), "positive"), (F32, (7, 1, 1, 1), "positive")], _c("opt_step_adamw")),
    # vision
    "pool_2d avg": ([(F32, (10, 9, 3, 2), "uniform")], _c("pool_2d", int(P.AVG), 3, 3, 2, 2, 1.0, 1.0)),
    "pool_2d max": ([(F32, (10, 9, 3, 2), "uniform")], _c("pool_2d", int(P.MAX), 2, 3, 2, 1, 0.0, 1.0)),
    "pool_1d avg": ([(F32, (17, 4, 3, 1), "uniform")], _c("pool_1d", int(P.AVG), 3, 2, 1)),
    "im2col 2D": ([(F16, (3, 3, 2, 4), "uniform"), (F32, (10, 9, 2, 2), "uniform")],
                  _c("im2col", 1, 2, 1, 0, 1, 1, True, int(F32))),
    "conv_2d_direct": ([(F32, (3, 3, 2, 4), "uniform"), (F32, (10, 9, 2, 2), "uniform")],
                       _c("conv_2d_direct", 1, 2, 1, 0, 1, 1)),
    "conv_transpose_1d": ([(F32, (3, 4, 2, 1), "uniform"), (F32, (7, 2, 1, 1), "uniform")],
                          _c("conv_transpose_1d", 2, 0, 1)),
    "upscale nearest": ([(F32, (5, 4, 3, 1), "uniform")], _c("upscale", 2, 0)),
    "pad_reflect_1d": ([(F32, (12, 3, 1, 1), "uniform")], _c("pad_reflect_1d", 3, 2)),
    "cumsum": ([X], _c("cumsum")),
}


def _values(kind, ne, gen):
    shape = tuple(reversed(ne))
    if kind == "positive":
        return torch.rand(shape, generator=gen) + 0.1
    if kind == "distinct":
        n = int(np.prod(shape))
        return (torch.randperm(n, generator=gen).float() / n).reshape(shape)
    if kind == "rows10":
        return torch.randint(0, 10, shape, generator=gen, dtype=torch.int32)
    if kind == "positions":
        return torch.randint(0, 100, shape, generator=gen, dtype=torch.int32)
    return torch.rand(shape, generator=gen) * 2 - 1  # uniform and param


class _Torchggml:
    def call(self, name, ctx, *args):
        return getattr(ggml, name)(ctx, *args)


class _C:
    def __init__(self, c):
        self.c = c

    def call(self, name, ctx, *args):
        return Ptr(self.c.op(name, *args))


@pytest.mark.parametrize("name", list(CASES))
def test_op_matches_upstream_ggml_cpu(name):
    inputs, build = CASES[name]
    gen = torch.Generator().manual_seed(5)
    values = [_values(kind, ne, gen) for _, ne, kind in inputs]
    for (type, _, _), v in zip(inputs, values):  # stored values: both sides read the same F16 inputs
        if type == F16:
            v.copy_(v.half().float())

    # torchggml on its CPU device
    ctx = ggml.init(no_alloc=True)
    ours_in = [ggml.new_tensor(ctx, type, list(ne)) for type, ne, _ in inputs]
    for t, (_, _, kind) in zip(ours_in, inputs):
        if kind == "param":
            ggml.set_param(t)
    out = build(_Torchggml(), ctx, *ours_in)
    graph = ggml.new_graph_custom(ctx, 256)
    ggml.build_forward_expand(graph, out)
    cpu = ggml.backend_cpu_init()
    buf = ggml.backend_alloc_ctx_tensors(ctx, cpu)
    for t, v in zip(ours_in, values):
        ggml.backend_tensor_set(t, v.to(ggml.type_to_dtype(t.type)).contiguous())
    ggml.backend_graph_compute(cpu, graph)
    out_dtype = np.int32 if out.type == I32 else np.float32
    ours = ggml.backend_tensor_get(out).numpy().astype(out_dtype).reshape(tuple(reversed(out.ne)))
    out_ne = list(out.ne)
    ggml.backend_buffer_free(buf)
    ggml.free(ctx)

    # ggml itself
    c = CGGML()
    try:
        theirs_in = [Ptr(c.tensor(type, ne)) for type, ne, _ in inputs]
        for t, (_, _, kind) in zip(theirs_in, inputs):
            if kind == "param":
                c.base.ggml_set_param(ctypes.c_void_p(t.p))
        for t, (type, _, _), v in zip(theirs_in, inputs, values):
            c.set(t.p, v.numpy().astype({F32: np.float32, F16: np.float16, I32: np.int32}[type]))
        res = build(_C(c), c.ctx, *theirs_in)
        c.compute(res.p)
        theirs = c.get(res.p, out_dtype, tuple(reversed(out_ne)))
    finally:
        c.free()

    if out_dtype == np.int32:
        np.testing.assert_array_equal(ours, theirs)
        return
    ours64, theirs64 = ours.astype(np.float64), theirs.astype(np.float64)
    finite = np.isfinite(theirs64)
    np.testing.assert_array_equal(np.isfinite(ours64), finite)
    err = ((ours64 - theirs64)[finite] ** 2).sum() / max((theirs64[finite] ** 2).sum(), 1e-30)
    assert err <= 1e-6, f"{name}: normalized MSE {err:.3g} against ggml"
