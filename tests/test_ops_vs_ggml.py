"""The vision/audio/diffusion and matrix-helper ops against ggml itself: the same builder with the
same arguments runs in upstream's C ggml (llama-cpp-python's bundled libggml, through ctypes) and
in torchggml on the CPU, on the same inputs: a table of cases, then random specs (60 seeds;
TORCHGGML_GGML_RANDOM_SPECS=N for more). Skipped where llama-cpp-python is not installed."""
import ctypes
import functools
import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import torchggml as ggml

T = ggml.Type
P = ggml.OpPool
S = ggml.ScaleMode


@functools.lru_cache(maxsize=None)
def libggml():
    """(libggml-base, libggml-cpu) or a skip."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return None, "llama-cpp-python is not installed (it bundles upstream's libggml)"
    lib_dir = Path(spec.origin).parent / "lib"
    try:
        base = ctypes.CDLL(str(sorted(lib_dir.glob("libggml-base.so*"))[0]), mode=ctypes.RTLD_GLOBAL)
        cpu = ctypes.CDLL(str(sorted(lib_dir.glob("libggml-cpu.so*"))[0]))
    except (IndexError, OSError) as e:
        return None, f"cannot load libggml from {lib_dir}: {e}"
    return (base, cpu), None


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def _numpy_dtype(type):
    return {T.F32: np.float32, T.F16: np.float16, T.I32: np.int32}[type]


def _declare(base, cpu):
    base.ggml_init.restype = ctypes.c_void_p
    base.ggml_init.argtypes = [_InitParams]
    base.ggml_new_tensor.restype = ctypes.c_void_p
    base.ggml_new_tensor.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int64)]
    base.ggml_get_data.restype = ctypes.c_void_p
    base.ggml_get_data.argtypes = [ctypes.c_void_p]
    base.ggml_new_graph.restype = ctypes.c_void_p
    base.ggml_new_graph.argtypes = [ctypes.c_void_p]
    base.ggml_build_forward_expand.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    base.ggml_free.argtypes = [ctypes.c_void_p]
    cpu.ggml_graph_compute_with_ctx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    cpu.ggml_graph_compute_with_ctx.restype = ctypes.c_int


def run_in_ggml(name, inputs, values, args, ne, type):
    """ggml_<name>(ctx, *inputs, *args) computed by C ggml's CPU graph code; the (contiguous)
    result of shape `ne` and type `type` as float64 in torch order."""
    base, cpu = libggml()[0]
    _declare(base, cpu)
    ctx = base.ggml_init(_InitParams(64 << 20, None, False))
    try:
        tensors = []
        for (in_type, in_ne), value in zip(inputs, values):
            t = base.ggml_new_tensor(ctx, int(in_type), 4, (ctypes.c_int64 * 4)(*in_ne))
            data = value.to(ggml.type_to_dtype(in_type)).contiguous().view(torch.uint8).numpy()
            ctypes.memmove(base.ggml_get_data(t), data.ctypes.data, data.nbytes)
            tensors.append(t)
        fn = getattr(base, "ggml_" + name)
        fn.restype = ctypes.c_void_p
        fn.argtypes = [ctypes.c_void_p] * (1 + len(tensors)) + [a[0] for a in args]
        out = fn(ctx, *tensors, *[(ctypes.c_int64 * 4)(*v) if t is NE else v for t, v in args])
        graph = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(graph, out)
        assert cpu.ggml_graph_compute_with_ctx(ctx, graph, 1) == 0
        dtype = np.dtype(_numpy_dtype(type))
        raw = ctypes.string_at(base.ggml_get_data(out), int(np.prod(ne)) * dtype.itemsize)
        return torch.from_numpy(np.frombuffer(raw, dtype=dtype).astype(np.float64).reshape(tuple(reversed(ne))))
    finally:
        base.ggml_free(ctx)


def run_in_torchggml(name, inputs, values, args):
    ctx = ggml.init(no_alloc=True)
    tensors = [ggml.new_tensor(ctx, type, ne) for type, ne in inputs]
    out = getattr(ggml, name)(ctx, *tensors, *[a[1] for a in args])
    graph = ggml.new_graph(ctx)
    ggml.build_forward_expand(graph, out)
    backend = ggml.backend_cpu_init()
    buffer = ggml.backend_alloc_ctx_tensors(ctx, backend)
    try:
        for t, v, (type, _) in zip(tensors, values, inputs):
            ggml.backend_tensor_set(t, v.to(ggml.type_to_dtype(type)).contiguous())
        ggml.backend_graph_compute(backend, graph)
        return ggml.backend_tensor_get(out).double().reshape(tuple(reversed(out.ne))), out
    finally:
        ggml.backend_buffer_free(buffer)
        ggml.free(ctx)


I, F, B, U = ctypes.c_int, ctypes.c_float, ctypes.c_bool, ctypes.c_uint32
NE = ctypes.POINTER(ctypes.c_int64)  # im2col_back's shape argument: a list here, an int64_t[4] in C

# (builder, inputs [(type, ne)], extra arguments [(ctypes type, value)], max normalized MSE)
SPECS = [
    ("im2col", [(T.F16, [3, 3, 4, 6]), (T.F32, [11, 9, 4, 2])],
     [(I, 2), (I, 1), (I, 1), (I, 0), (I, 1), (I, 2), (B, True), (I, int(T.F32))], 0),
    ("im2col", [(T.F16, [5, 3, 4, 1]), (T.F32, [20, 3, 2, 1])],
     [(I, 2), (I, 0), (I, 2), (I, 0), (I, 1), (I, 0), (B, False), (I, int(T.F16))], 0),
    # windows that start in the padding and run past it (ggml's C division sizes the output)
    ("im2col", [(T.F16, [5, 5, 2, 3]), (T.F32, [2, 3, 2, 1])],
     [(I, 2), (I, 2), (I, 1), (I, 1), (I, 1), (I, 1), (B, True), (I, int(T.F32))], 0),
    ("im2col", [(T.F16, [5, 2, 1, 1]), (T.F32, [3, 2, 2, 1])],
     [(I, 3), (I, 0), (I, 1), (I, 0), (I, 1), (I, 0), (B, False), (I, int(T.F32))], 0),
    ("im2col_3d", [(T.F16, [3, 3, 3, 4]), (T.F32, [2, 2, 2, 4])],
     [(ctypes.c_int64, 2), (I, 2), (I, 2), (I, 2), (I, 1), (I, 1), (I, 1), (I, 1), (I, 1), (I, 1), (I, int(T.F32))], 0),
    ("conv_1d", [(T.F16, [3, 4, 5, 1]), (T.F32, [17, 4, 2, 1])], [(I, 1), (I, 1), (I, 1)], 1e-6),
    ("conv_1d_dw", [(T.F16, [3, 1, 4, 1]), (T.F32, [16, 4, 1, 1])], [(I, 1), (I, 1), (I, 1)], 1e-6),
    ("conv_2d", [(T.F16, [3, 3, 4, 6]), (T.F32, [10, 9, 4, 2])],
     [(I, 1), (I, 2), (I, 1), (I, 0), (I, 1), (I, 1)], 1e-6),
    ("conv_2d_dw", [(T.F16, [3, 3, 1, 4]), (T.F32, [10, 9, 4, 2])],
     [(I, 1), (I, 1), (I, 1), (I, 1), (I, 1), (I, 1)], 1e-6),
    ("conv_2d_direct", [(T.F32, [3, 3, 4, 6]), (T.F32, [10, 9, 4, 2])],
     [(I, 2), (I, 1), (I, 1), (I, 1), (I, 1), (I, 2)], 1e-10),
    ("conv_2d_dw_direct", [(T.F32, [3, 3, 1, 4]), (T.F32, [10, 9, 4, 2])],
     [(I, 1), (I, 2), (I, 1), (I, 0), (I, 2), (I, 1)], 1e-10),
    ("conv_3d", [(T.F16, [3, 2, 2, 6]), (T.F32, [7, 6, 5, 4])],
     [(ctypes.c_int64, 2), (I, 1), (I, 1), (I, 1), (I, 1), (I, 0), (I, 1), (I, 1), (I, 1), (I, 1)], 1e-6),
    ("conv_3d_direct", [(T.F32, [3, 2, 2, 6]), (T.F32, [7, 6, 5, 4])],
     [(I, 1), (I, 2), (I, 1), (I, 1), (I, 0), (I, 1), (I, 1), (I, 1), (I, 1), (I, 2), (I, 2), (I, 3)], 1e-10),
    ("conv_2d_direct", [(T.F16, [3, 2, 4, 6]), (T.F32, [10, 9, 4, 1])],
     [(I, 1), (I, 1), (I, 0), (I, 1), (I, 1), (I, 1)], 1e-10),
    ("conv_transpose_1d", [(T.F32, [4, 3, 5, 1]), (T.F32, [9, 5, 1, 1])], [(I, 2), (I, 0), (I, 1)], 1e-10),
    ("conv_transpose_1d", [(T.F16, [5, 2, 3, 1]), (T.F32, [8, 3, 1, 1])], [(I, 3), (I, 0), (I, 1)], 1e-10),
    ("conv_transpose_2d_p0", [(T.F32, [3, 3, 4, 5]), (T.F32, [6, 5, 5, 1])], [(I, 2)], 1e-10),
    ("conv_transpose_2d_p0", [(T.F16, [2, 3, 3, 4]), (T.F32, [5, 6, 4, 1])], [(I, 3)], 1e-10),
    ("col2im_1d", [(T.F32, [12, 7, 1, 1])], [(I, 2), (I, 3), (I, 1)], 1e-10),
    ("pool_1d", [(T.F32, [17, 4, 3, 1])], [(I, int(P.AVG)), (I, 4), (I, 3), (I, 2)], 1e-12),
    ("pool_1d", [(T.F32, [17, 4, 3, 1])], [(I, int(P.MAX)), (I, 3), (I, 2), (I, 1)], 0),
    ("pool_2d", [(T.F32, [13, 11, 3, 2])], [(I, int(P.AVG)), (I, 3), (I, 3), (I, 2), (I, 2), (F, 1), (F, 1)], 1e-12),
    ("pool_2d", [(T.F32, [13, 11, 3, 2])], [(I, int(P.MAX)), (I, 4), (I, 2), (I, 3), (I, 1), (F, 2), (F, 0)], 0),
    ("pool_2d", [(T.F32, [9, 7, 2, 1])], [(I, int(P.AVG)), (I, 2), (I, 2), (I, 2), (I, 2), (F, 0.5), (F, 0.5)], 1e-12),
    ("interpolate", [(T.F32, [7, 5, 3, 2])], [(ctypes.c_int64, 16), (ctypes.c_int64, 9), (ctypes.c_int64, 3),
                                             (ctypes.c_int64, 2), (U, int(S.NEAREST))], 0),
    ("interpolate", [(T.F32, [7, 5, 3, 2])], [(ctypes.c_int64, 16), (ctypes.c_int64, 9), (ctypes.c_int64, 5),
                                             (ctypes.c_int64, 3), (U, int(S.BILINEAR))], 1e-12),
    ("interpolate", [(T.F32, [9, 8, 2, 1])], [(ctypes.c_int64, 5), (ctypes.c_int64, 13), (ctypes.c_int64, 2),
                                             (ctypes.c_int64, 1), (U, int(S.BICUBIC) | 256)], 1e-12),
    ("interpolate", [(T.F32, [16, 12, 2, 1])], [(ctypes.c_int64, 7), (ctypes.c_int64, 5), (ctypes.c_int64, 2),
                                               (ctypes.c_int64, 1), (U, int(S.BILINEAR) | 512)], 1e-12),
    ("pad_reflect_1d", [(T.F32, [9, 4, 2, 1])], [(I, 4), (I, 6)], 0),
    ("roll", [(T.F32, [7, 5, 3, 2])], [(I, -3), (I, 2), (I, 1), (I, -1)], 0),
    ("timestep_embedding", [(T.F32, [6, 1, 1, 1])], [(I, 15), (I, 10000)], 1e-12),
    ("win_part", [(T.F32, [3, 10, 9, 1])], [(I, 4)], 0),
    ("get_rel_pos", [(T.F16, [8, 9, 1, 1])], [(I, 5), (I, 5)], 0),
    ("add_rel_pos", [(T.F32, [16, 16, 2, 1]), (T.F32, [4, 4, 4, 2]), (T.F32, [4, 4, 4, 2])], [], 1e-12),
    ("im2col_back", [(T.F32, [36, 6, 5, 2]), (T.F16, [3, 3, 4, 6])],
     [(NE, [11, 9, 4, 2]), (I, 2), (I, 1), (I, 1), (I, 0), (I, 1), (I, 2), (B, True)], 1e-12),
    ("im2col_back", [(T.F32, [15, 10, 2, 1]), (T.F16, [5, 3, 4, 1])],
     [(NE, [20, 3, 2, 1]), (I, 2), (I, 0), (I, 2), (I, 0), (I, 1), (I, 0), (B, False)], 1e-12),
    ("im2col_back", [(T.F32, [50, 1, 1, 1]), (T.F16, [5, 5, 2, 3])],
     [(NE, [2, 3, 2, 1]), (I, 2), (I, 2), (I, 1), (I, 1), (I, 1), (I, 1), (B, True)], 1e-12),
    ("pool_2d_back", [(T.F32, [6, 5, 3, 2]), (T.F32, [13, 11, 3, 2])],
     [(I, int(P.MAX)), (I, 3), (I, 3), (I, 2), (I, 2), (F, 1), (F, 1)], 1e-12),
    ("pool_2d_back", [(T.F32, [6, 5, 3, 2]), (T.F32, [13, 11, 3, 2])],
     [(I, int(P.AVG)), (I, 3), (I, 3), (I, 2), (I, 2), (F, 1), (F, 1)], 1e-12),
    ("cumsum", [(T.F32, [37, 3, 2, 1])], [], 1e-12),
    ("diag", [(T.F32, [6, 1, 3, 1])], [], 0),
    ("tri", [(T.F32, [7, 7, 2, 1])], [(I, int(ggml.TriType.LOWER))], 0),
    ("tri", [(T.F32, [7, 7, 2, 1])], [(I, int(ggml.TriType.UPPER_DIAG))], 0),
    ("fill", [(T.F16, [7, 3, 2, 1])], [(F, -0.1)], 0),
    ("expm1", [(T.F32, [33, 4, 1, 1])], [], 1e-12),
    ("softplus", [(T.F32, [33, 4, 1, 1])], [], 1e-12),
    ("lightning_indexer", [(T.F32, [16, 4, 3, 2]), (T.F32, [16, 1, 7, 2]), (T.F32, [4, 3, 1, 2]),
                           (T.F16, [7, 3, 1, 1])], [], 1e-10),
    ("dsv4_hc_comb", [(T.F32, [24, 5, 1, 1]), (T.F32, [3, 1, 1, 1]), (T.F32, [24, 1, 1, 1])],
     [(F, 1e-4), (ctypes.c_int32, 4)], 1e-10),
    ("dsv4_hc_pre", [(T.F32, [16, 4, 5, 1]), (T.F32, [4, 5, 1, 1])], [], 1e-12),
    ("dsv4_hc_post", [(T.F32, [16, 5, 1, 1]), (T.F32, [16, 4, 5, 1]), (T.F32, [4, 5, 1, 1]), (T.F32, [4, 4, 5, 1])],
     [], 1e-12),
]


@pytest.mark.parametrize("name, inputs, args, max_nmse", SPECS,
                         ids=[f"{s[0]}-{i}" for i, s in enumerate(SPECS)])
def test_op_matches_upstream_ggml(name, inputs, args, max_nmse):
    if libggml()[0] is None:
        pytest.skip(libggml()[1])
    gen = torch.Generator().manual_seed(len(name) * 31 + len(args))
    values = [torch.rand(tuple(reversed(ne)), generator=gen, dtype=torch.float64) * 2 - 1 for _, ne in inputs]
    if name == "timestep_embedding":
        values = [v.abs() * 1000 for v in values]
    # values exact in their types: float64 -> F16 rounds differently in numpy and torch (torch via float32)
    values = [v.to(ggml.type_to_dtype(type)).double() for v, (type, _) in zip(values, inputs)]
    ours, out = run_in_torchggml(name, inputs, values, args)
    theirs = run_in_ggml(name, inputs, values, args, out.ne, out.type)
    err = float(((ours - theirs) ** 2).sum() / (theirs ** 2).sum().clamp_min(1e-30))
    assert err <= max_nmse, f"{name}: normalized MSE {err:.3g} against ggml"


# ---------------------------------------------------------------- random specs

def random_spec(rng):
    """A random (builder, inputs, args, max normalized MSE) over the ops above: shapes, strides,
    paddings, dilations, modes and types drawn small, including windows that start in the
    padding (the direct convolutions' images are kept at least as large as the kernel)."""
    r = rng.randint
    kind = rng.choice(["im2col", "im2col_1d", "im2col_back", "im2col_3d", "pool_1d", "pool_2d", "pool_2d_back",
                       "interpolate", "conv_transpose_1d", "conv_transpose_2d_p0", "col2im_1d", "conv_2d",
                       "conv_2d_direct", "conv_2d_dw_direct", "pad_reflect_1d", "roll", "win_part", "win_unpart",
                       "get_rel_pos", "add_rel_pos", "tri", "cumsum", "timestep_embedding", "dsv4_hc_comb",
                       "lightning_indexer", "acc", "set"])
    geo = [r(1, 3), r(1, 3), r(0, 2), r(0, 2), r(1, 2), r(1, 2)]         # s0, s1, p0, p1, d0, d1
    kw, kh, ic = r(1, 4), r(1, 4), r(1, 3)
    if kind in ("im2col", "conv_2d"):
        b = [r(1, 9), r(1, 9), ic, r(1, 2)]
        a = [kw, kh, ic, r(1, 3)]
        extra = [(B, True), (I, int(rng.choice([T.F32, T.F16])))] if kind == "im2col" else []
        return kind, [(T.F16, a), (T.F32, b)], [(I, v) for v in geo] + extra, 1e-6
    if kind in ("conv_2d_direct", "conv_2d_dw_direct"):
        b = [r(geo[4] * (kw - 1) + 1, 10), r(geo[5] * (kh - 1) + 1, 10), ic, r(1, 2)]
        a = [kw, kh, ic, r(1, 3)] if kind == "conv_2d_direct" else [kw, kh, 1, ic]
        return kind, [(rng.choice([T.F32, T.F16]), a), (T.F32, b)], [(I, v) for v in geo], 1e-10
    if kind == "im2col_1d":
        k = r(1, 6)
        return "im2col", [(T.F16, [k, ic, 2, 1]), (T.F32, [r(1, 12), ic, r(1, 2), 1])], \
            [(I, geo[0]), (I, 0), (I, geo[2]), (I, 0), (I, geo[4]), (I, 0), (B, False), (I, int(T.F32))], 0
    if kind == "im2col_back":
        w, h, n = r(1, 8), r(1, 8), r(1, 2)
        ow = _c_div(w + 2 * geo[2] - geo[4] * (kw - 1) - 1, geo[0]) + 1
        oh = _c_div(h + 2 * geo[3] - geo[5] * (kh - 1) - 1, geo[1]) + 1
        return kind, [(T.F32, [ic * kh * kw, ow, oh, n]), (T.F16, [kw, kh, ic, 1])], \
            [(NE, [w, h, ic, n])] + [(I, v) for v in geo] + [(B, True)], 1e-12
    if kind == "im2col_3d":
        k, size = [r(1, 3) for _ in range(3)], [r(1, 5) for _ in range(3)]
        args = [(ctypes.c_int64, ic)] + [(I, v) for v in [r(1, 2) for _ in range(3)] + [r(0, 2) for _ in range(3)]
                                         + [r(1, 2) for _ in range(3)]] + [(I, int(T.F32))]
        return kind, [(T.F16, [*k, ic * 2]), (T.F32, [*size, ic * r(1, 2)])], args, 0
    if kind == "pool_1d":
        k = r(1, 5)
        return kind, [(rng.choice([T.F32, T.F16]), [r(k, 15), r(1, 3), r(1, 2), 1])], \
            [(I, r(0, 1)), (I, k), (I, r(1, 3)), (I, r(0, k // 2 + 1))], 1e-12
    if kind == "pool_2d":
        return kind, [(rng.choice([T.F32, T.F16]), [r(kw, 12), r(kh, 12), r(1, 3), r(1, 2)])], \
            [(I, r(0, 1)), (I, kw), (I, kh), (I, geo[0]), (I, geo[1]),
             (F, rng.choice([0, 0.5, 1, 1.5])), (F, rng.choice([0, 1, 2]))], 1e-12
    if kind == "pool_2d_back":
        p0, p1 = r(0, kw // 2), r(0, kh // 2)
        w, h = r(kw, 10), r(kh, 10)
        ow, oh = (w + 2 * p0 - kw) // geo[0] + 1, (h + 2 * p1 - kh) // geo[1] + 1
        return kind, [(T.F32, [ow, oh, ic, 1]), (T.F32, [w, h, ic, 1])], \
            [(I, r(0, 1)), (I, kw), (I, kh), (I, geo[0]), (I, geo[1]), (F, p0), (F, p1)], 1e-12
    if kind == "interpolate":
        mode = rng.choice([0, 1, 2, 0 | 256, 1 | 256, 2 | 256, 1 | 512])
        src = [r(1, 9), r(1, 9), r(1, 3), r(1, 2)]
        dst = [r(1, src[0]), r(1, src[1])] if mode & 512 else [r(1, 14), r(1, 14)]
        dst += [r(1, 4), r(1, 3)]
        return kind, [(T.F32, src)], [(ctypes.c_int64, n) for n in dst] + [(U, mode)], 1e-12
    if kind == "conv_transpose_1d":
        return kind, [(rng.choice([T.F32, T.F16]), [kw, r(1, 3), ic, 1]), (T.F32, [r(1, 8), ic, 1, 1])], \
            [(I, geo[0]), (I, 0), (I, 1)], 1e-10
    if kind == "conv_transpose_2d_p0":
        return kind, [(rng.choice([T.F32, T.F16]), [kw, kh, r(1, 3), ic]), (T.F32, [r(1, 6), r(1, 6), ic, 1])], \
            [(I, geo[0])], 1e-10
    if kind == "col2im_1d":
        oc, t_in = r(1, 3), r(1, 8)
        p0 = geo[2] if (t_in - 1) * geo[0] + kw - 2 * geo[2] > 0 else 0
        return kind, [(T.F32, [kw * oc, t_in, 1, 1])], [(I, geo[0]), (I, oc), (I, p0)], 1e-12
    if kind == "pad_reflect_1d":
        n = r(2, 10)
        return kind, [(T.F32, [n, r(1, 3), r(1, 2), 1])], [(I, r(0, n - 1)), (I, r(0, n - 1))], 0
    if kind == "roll":
        ne = [r(1, 6) for _ in range(4)]
        return kind, [(T.F32, ne)], [(I, r(1 - n, n - 1)) for n in ne], 0
    if kind == "win_part":
        return kind, [(T.F32, [r(1, 4), r(1, 11), r(1, 11), 1])], [(I, r(1, 5))], 0
    if kind == "win_unpart":
        w, w0, h0 = r(1, 5), r(1, 11), r(1, 11)
        return kind, [(T.F32, [ic, w, w, -(-w0 // w) * -(-h0 // w)])], [(I, w0), (I, h0), (I, w)], 0
    if kind == "get_rel_pos":
        size = r(1, 7)
        return kind, [(T.F16, [r(1, 5), 2 * size - 1, 1, 1])], [(I, size), (I, size)], 0
    if kind == "add_rel_pos":
        w, h, n = r(1, 4), r(1, 4), r(1, 2)
        return kind, [(T.F32, [w * w, w * h, n, 1]), (T.F32, [w, w, h, n]), (T.F32, [w, w, h, n])], [], 1e-12
    if kind == "tri":
        n = r(1, 8)
        return kind, [(T.F32, [n, n, r(1, 3), 1])], [(I, r(0, 3))], 0
    if kind == "cumsum":
        return kind, [(T.F32, [r(1, 300), r(1, 3), 1, 1])], [], 1e-12
    if kind == "timestep_embedding":
        return kind, [(T.F32, [r(1, 6), 1, 1, 1])], [(I, r(1, 40)), (I, rng.choice([100, 10000]))], 1e-12
    if kind == "dsv4_hc_comb":
        return kind, [(T.F32, [24, r(1, 4), 1, 1]), (T.F32, [r(3, 4), 1, 1, 1]), (T.F32, [24, 1, 1, 1])], \
            [(F, rng.choice([1e-6, 1e-3])), (ctypes.c_int32, r(1, 6))], 1e-10
    if kind == "lightning_indexer":
        streams = r(1, 3)
        mask_streams = rng.choice([d for d in (1, 2, 3) if streams % d == 0])
        d, heads, tokens, kv = r(1, 9), r(1, 4), r(1, 4), r(1, 7)
        return kind, [(T.F32, [d, heads, tokens, streams]), (T.F32, [d, 1, kv, streams]),
                      (T.F32, [heads, tokens, 1, streams]), (T.F16, [kv, tokens, 1, mask_streams])], [], 1e-10
    ne = [r(1, 6), r(1, 5), r(1, 4), r(1, 2)]                               # acc, set
    b_ne = [r(1, n) for n in ne]
    nb = [4 * ne[0], 4 * ne[0] * ne[1], 4 * ne[0] * ne[1] * ne[2]]
    offset = 4 * r(0, ne[0] - b_ne[0]) + nb[0] * r(0, ne[1] - b_ne[1])
    return kind, [(T.F32, ne), (T.F32, b_ne)], [(ctypes.c_size_t, v) for v in nb + [offset]], 0


def _c_div(a: int, b: int) -> int:
    return int(a / b)


N_RANDOM = int(os.environ.get("TORCHGGML_GGML_RANDOM_SPECS", "60"))


def _accepted(spec) -> bool:
    """Whether the builder takes the spec (ggml would assert where it refuses, so those cannot
    run in C): non-empty inputs and no ValueError."""
    name, inputs, args, _ = spec
    if any(n <= 0 for _, ne in inputs for n in ne):
        return False
    ctx = ggml.init(no_alloc=True)
    try:
        getattr(ggml, name)(ctx, *[ggml.new_tensor(ctx, type, ne) for type, ne in inputs], *[a[1] for a in args])
        return True
    except ValueError:
        return False
    finally:
        ggml.free(ctx)


@pytest.mark.parametrize("seed", range(N_RANDOM))
def test_random_spec_matches_upstream_ggml(seed):
    import random
    rng = random.Random(seed)
    spec = random_spec(rng)
    while not _accepted(spec):
        spec = random_spec(rng)
    test_op_matches_upstream_ggml(*spec)



def test_get_rel_pos_copies_bf16_bits_as_ggml():
    """ggml copies a BF16 source's 16-bit values into the F16 result unchanged."""
    if libggml()[0] is None:
        pytest.skip(libggml()[1])
    values = (torch.randn(1, 1, 9, 4, generator=torch.Generator().manual_seed(1)) * 0.01).bfloat16().double()
    ours, out = run_in_torchggml("get_rel_pos", [(T.BF16, [4, 9, 1, 1])], [values], [(I, 5), (I, 5)])
    theirs = run_in_ggml("get_rel_pos", [(T.BF16, [4, 9, 1, 1])], [values], [(I, 5), (I, 5)], out.ne, out.type)
    assert out.type == T.F16 and torch.equal(ours, theirs)
