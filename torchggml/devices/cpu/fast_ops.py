"""The CPU's numba layer for small nodes (decode steps): one numba call per node
(jit/op_kernels.py) over numpy views of the node's memory bound when the plan is compiled,
instead of several torch ops per node (whose dispatch is most of a decode node's time).

Each `bind_*` returns the node's bound call, or None where the fast kernel does not take the
node (its types, its mode, a size past FAST_MAX_ELEMENTS where torch's threaded kernels pay, no
numba): the CPU's table (kernels.py) then tries the op's next layer.
TORCHGGML_CPU_FAST_OPS=0 turns the layer off (fast_ops_enabled).
"""
from __future__ import annotations

import functools

import numpy as np
import torch

from ... import config
from ...enums import Op, GluOp, RopeType
from ...ops.matmul import mul_mat_separate_rows
from ...tensor import get_op_params_f32, get_glu_op, nelements
from ...types import Type
from ..kernels.attention import alibi_slopes
from ..kernels.common import view
from ..kernels.glu import glu_halves
from ..kernels.rope import rope_params, angle_constants, rotated_span
from .jit.llvm_ir import native_half
from .jit.loader import BoundKernel, numba_available, op_kernels

# nodes with more output values than this run the torch kernels (threaded, vectorized): the
# numba kernels run on one thread and win where dispatch, not arithmetic, is the cost
FAST_MAX_ELEMENTS = 1 << 18

# strided copies (but transposes) with more values than this stay torch copies, which the
# numba loop only beats where dispatch is the cost
COPY_MAX_ELEMENTS = 1 << 14

@functools.cache
def _fast_types() -> frozenset:
    """Element types the numba kernels read and write (F16 as its uint16 bits; F16 only where
    the CPU converts halves in hardware, see jit.llvm_ir.native_half)."""
    return frozenset({Type.F32, Type.F16}) if native_half() else frozenset({Type.F32})


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy array over t's memory (same strides); F16 and BF16 as uint16 bits."""
    if t.dtype in (torch.float16, torch.bfloat16):
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def _float_view(t) -> np.ndarray:
    return as_numpy(view(t))


# ops with a threaded numba kernel (the rows over the threads: norms, softmax, swiglu) take it
# for nodes of more than THREADED_MIN_ELEMENTS values (a prompt's; a decode step's stay on one
# thread, where waking the others costs more than they save) and up to THREADED_MAX_ELEMENTS
THREADED_MIN_ELEMENTS = 1 << 16
THREADED_MAX_ELEMENTS = 1 << 26


def _size_class(node, *tensors, max_elements: int | None = THREADED_MAX_ELEMENTS) -> str | None:
    """"small" (the serial numba kernel), "large" (the threaded one, up to max_elements; None: no
    limit) or None (torch's kernel)."""
    if not numba_available() or not all(t is None or t.type in _fast_types() for t in (node, *tensors)):
        return None
    n = nelements(node)
    return "small" if n <= THREADED_MIN_ELEMENTS else "large" if max_elements is None or n <= max_elements else None


def _takes(node, *tensors) -> bool:
    """numba is there, the node is small, and every tensor is F32 or F16."""
    return (nelements(node) <= FAST_MAX_ELEMENTS and numba_available()
            and all(t is None or t.type in _fast_types() for t in (node, *tensors)))


def _call(kernel, *args):
    """fn(node) -> kernel(*args): the bound call of a fast kernel."""
    return BoundKernel(kernel, *args)


_NO_F32 = np.zeros(1, np.float32)  # stands in for an absent optional input


# ---------------------------------------------------------------- NORM, RMS_NORM

def bind_row_norm(node):
    size = _size_class(node, node.src[0])
    if size is None:
        return None
    eps = np.float32(get_op_params_f32(node, 0))
    kernel = op_kernels().row_norm_rows if size == "large" else op_kernels().row_norm
    return _call(kernel, _float_view(node.src[0]), _float_view(node), eps, node.op == Op.RMS_NORM)


# ---------------------------------------------------------------- SOFT_MAX

# past THREADED_MAX_ELEMENTS a SOFT_MAX still takes the threaded kernel while its rows are this
# many or more (an image encoder's scores, 16 heads x 4096 x 4096: torch's passes and temporaries
# over them are several times slower)
SOFT_MAX_MANY_ROWS = 4096


def bind_soft_max(node):
    a, mask, sinks = node.src[0], node.src[1], node.src[2]
    many_rows = nelements(node) // node.ne[0] >= SOFT_MAX_MANY_ROWS
    size = _size_class(node, a, mask, max_elements=None if many_rows else THREADED_MAX_ELEMENTS)
    if size is None:
        return None
    scale, max_bias = get_op_params_f32(node, 0), get_op_params_f32(node, 1)
    slopes = alibi_slopes(a.ne[2], max_bias, "cpu").numpy()
    vm = _float_view(mask)[:, :, :a.ne[1]] if mask is not None else _NO_F32.reshape(1, 1, 1, 1)
    vs = as_numpy(view(sinks)[0, 0, 0]) if sinks is not None else _NO_F32
    kernel = op_kernels().soft_max_rows if size == "large" else op_kernels().soft_max
    return _call(kernel, _float_view(a), _float_view(node), vm, slopes, vs, np.float32(scale),
                 mask is not None, sinks is not None)


# ---------------------------------------------------------------- ROPE

def bind_rope(node):
    a, positions, factors = node.src[0], node.src[1], node.src[2]
    p = rope_params(node)
    size = _size_class(node, a)
    if p.mode not in (RopeType.NORMAL, RopeType.NEOX) or size is None:
        return None
    _, inv_freq, yarn, yarn_mscale = angle_constants(
        p.n_pairs, p.n_dims, p.mode, p.sections, p.freq_base, p.freq_scale, p.ext_factor, p.n_ctx_orig,
        p.beta_fast, p.beta_slow, torch.device("cpu"))
    ramp = np.stack([yarn[0].numpy(), yarn[1].numpy()]) if yarn is not None else np.zeros((0, 0))
    start, width = rotated_span(p, a.ne[0])
    # the kernel rotates columns [start, start + width) with width // 2 frequency factors
    if start < 0 or width < 0 or width % 2 or start + width > a.ne[0] or (factors is not None
                                                                          and factors.ne[0] < width // 2):
        return None
    vx, dst = view(a), view(node)
    in_place = dst.data_ptr() == vx.data_ptr() and dst.stride() == vx.stride()
    vf = as_numpy(view(factors)[0, 0, 0]) if factors is not None else _NO_F32
    pos, n_tok = as_numpy(view(positions)[0, 0, 0]), vx.shape[1]
    args = (as_numpy(vx), as_numpy(dst), pos, vf, inv_freq.numpy(), ramp, factors is not None, float(p.freq_scale),
            float(p.attn_factor * yarn_mscale), start, width, p.mode == RopeType.NORMAL, not in_place)
    if size != "large" and n_tok < ROPE_SHARED_MIN_TOKENS:
        return _call(op_kernels().rope, *args)
    return _call(op_kernels().rope_rows, *args, *rope_angle_areas(args))


def rope_angle_areas(args):
    """(angles, angle_pos) of rope_rows and rope_shared for rope's arguments `args`: one table
    for the calls of the same positions (their address and count) and parameters."""
    x, pos, vf = args[0], args[2], args[3]
    key = (pos.ctypes.data, x.shape[1], vf.ctypes.data, *args[4:11])
    key = tuple(a.tobytes() if isinstance(a, np.ndarray) else a for a in key)
    return _shared_angles(key, x.shape[1], args[10] // 2)


# a prompt's ROPE nodes from this many tokens take rope_rows, whose angles the nodes of the same
# positions and parameters share (_shared_angles)
ROPE_SHARED_MIN_TOKENS = 16
_ANGLES = {}  # key -> (angles, angle_pos) of rope_rows


def _shared_angles(key, n_tok: int, n_pairs: int):
    """The (angles, angle_pos) work areas of rope_rows for the ROPE nodes with this key (their
    positions' address, tokens and parameters), made once: the first node of a graph's run
    computes the angles, the others see its positions in angle_pos and read them."""
    if key not in _ANGLES:
        if len(_ANGLES) > 256:  # many graphs seen: start over (bound kernels keep their own)
            _ANGLES.clear()
        _ANGLES[key] = (np.empty((2, n_tok, n_pairs), np.float32), np.full(n_tok + 1, -1, np.int64))
    return _ANGLES[key]


# ---------------------------------------------------------------- SET_ROWS

def _bad_row_check(node, table):
    """The check of a kernel that returns the position of the first row index outside `table`'s
    rows (or -1): an IndexError naming it."""
    def check(bad) -> None:
        if bad >= 0:
            raise IndexError(f"{node.op.name}: a row index outside [0, {table.ne[1]}) at position {bad} of "
                             f"{node.src[1].describe()} for {node.describe()}")
    return check


def bind_set_rows(node):
    b, idx = node.src[0], node.src[1]
    if not _takes(b, b, node) or idx.type not in (Type.I32, Type.I64):  # sized by the rows written
        return None
    return BoundKernel(op_kernels().set_rows, _float_view(b), view(idx)[0].numpy(), _float_view(node),
                       check=_bad_row_check(node, node))


# ---------------------------------------------------------------- GET_ROWS (block types)

# the block types op_kernels.get_block_rows dequantizes, by kind number
BLOCK_KINDS = ("Q4_0", "Q8_0", "Q4_K", "Q6_K", "IQ4_NL", "Q2_K", "Q3_K")


def bind_get_block_rows(node):
    """Rows of a table in a block type the numba kernel decodes (the token embeddings): only the
    requested rows, in one call (the torch dequantizers' fixed cost dwarfs one row)."""
    a, ids = node.src[0], node.src[1]
    if (not numba_available() or a.type.name not in BLOCK_KINDS or node.type != Type.F32
            or nelements(node) > FAST_MAX_ELEMENTS):
        return None
    return BoundKernel(op_kernels().get_block_rows, view(a).numpy(), view(ids)[0].numpy(), view(node).numpy(),
                       BLOCK_KINDS.index(a.type.name), check=_bad_row_check(node, a))


# ---------------------------------------------------------------- CONT, CPY, DUP

def coalesced(*views: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Views of the same shape with adjacent dims merged wherever every view's strides allow and
    unit dims dropped (at least 1-D): a permuted copy becomes the 2-D transpose it is. torch's
    copy of the V cache's 4-D permute is several times slower than of the same 2-D transpose
    (and slow again if unit dims with stride 0 pad it back to 4-D)."""
    dims = [d for d in range(views[0].dim()) if views[0].shape[d] != 1]
    shape, strides = [], [[] for _ in views]
    for d in reversed(dims):  # innermost first
        if shape and all(v.stride(d) == st[-1] * shape[-1] for v, st in zip(views, strides)):
            shape[-1] *= views[0].shape[d]
            continue
        shape.append(views[0].shape[d])
        for v, st in zip(views, strides):
            st.append(v.stride(d))
    if not shape:
        return tuple(v.reshape(1) for v in views)
    return tuple(v.as_strided(shape[::-1], st[::-1]) for v, st in zip(views, strides))


def as_numpy_4d(t: torch.Tensor) -> np.ndarray:
    """as_numpy with unit dims put in front up to 4-D (the numba kernels' shape)."""
    return as_numpy(t)[(None,) * (4 - t.dim())]


def _is_transpose(src: torch.Tensor, dst: torch.Tensor) -> bool:
    """2-D views, each with unit stride along its rows, src's along the other dim (dst = the
    transpose of a row-major matrix)."""
    return src.dim() == 2 and src.stride(0) == 1 and dst.stride(1) == 1


def _torch_copy(src, dst, _node) -> None:
    dst.copy_(src)


def bind_copy(node):
    """Strided copies of the same shape (the transposes and permutes of attention), within or
    between F32 and F16, over coalesced views: same-type transposes by numba in 8x8 blocks (faster
    than torch's copy on the V cache), other small ones by numba's element
    loop, larger ones by torch's copy; contiguous ones stay the generic kernel's copy (a memcpy)."""
    src = node.src[0]
    if not (src.type in _fast_types() and node.type in _fast_types()):
        return None
    vs, dst = view(src), view(node)
    if vs.shape != dst.shape and dst.is_contiguous():
        dst = dst.view(vs.shape)  # cont_Nd: src's elements in order into a contiguous dst
    if vs.shape != dst.shape or vs.stride() == dst.stride():
        return None
    vs, dst = coalesced(vs, dst)
    if not numba_available():
        return functools.partial(_torch_copy, vs, dst)
    if src.type == node.type and _is_transpose(vs, dst):  # V^T: 8x8 blocks beat torch's copy
        return _call(op_kernels().transpose, as_numpy(vs.T), as_numpy(dst))
    if nelements(node) > COPY_MAX_ELEMENTS:
        return functools.partial(_torch_copy, vs, dst)
    return _call(op_kernels().copy, as_numpy_4d(vs), as_numpy_4d(dst))


# ---------------------------------------------------------------- ADD, SUB, MUL, DIV

_BINARY_CODES = {Op.ADD: 0, Op.SUB: 1, Op.MUL: 2, Op.DIV: 3}

# element-wise ops past this many values stay torch's one vectorized op: a decode row gains from
# numba, a prompt's 128 rows lose (scripts/bench_decode_host.py)
BINARY_MAX_ELEMENTS = 1 << 13


def bind_binary(node):
    """F32/F16 element-wise a op b, b tiled over a, in float32 (rounded once into an F16 node)."""
    a, b = node.src[0], node.src[1]
    if not _takes(node, a, b) or nelements(node) > BINARY_MAX_ELEMENTS:
        return None
    return _call(op_kernels().binary, _float_view(a), _float_view(b), _float_view(node), _BINARY_CODES[node.op])


def bind_scale(node):
    """SCALE's x * s + b of a decode step's rows (what kernels/math.py's torch ops compute: the
    product rounded to float32 before b is added), one kernel a native run holds."""
    x = node.src[0]
    if not _takes(node, x) or nelements(node) > BINARY_MAX_ELEMENTS:
        return None
    return _call(op_kernels().scale, _float_view(x), _float_view(node), np.float32(get_op_params_f32(node, 0)),
                 np.float32(get_op_params_f32(node, 1)))


# ---------------------------------------------------------------- GLU

def bind_glu(node):
    """SWIGLU, and GEGLU (gemma's; torch's GELU took several passes over a prompt's rows)."""
    size = _size_class(node, node.src[0], node.src[1])
    if get_glu_op(node) not in (GluOp.SWIGLU, GluOp.GEGLU) or size is None:
        return None
    vx, vg = glu_halves(node)
    kernel = op_kernels().glu_rows if size == "large" else op_kernels().glu
    return _call(kernel, as_numpy(vx), as_numpy(vg), _float_view(node), get_glu_op(node) == GluOp.GEGLU)


# ---------------------------------------------------------------- MUL_MAT (attention's, F16)

# batched products of F16 matrices by at most this many rows of b each take a numba kernel:
# decode's KQ and KQV over the KV cache, where torch converts all of K or V^T to float32 at each
# call; a 2-D F16 weight's products by up to this many rows take the numba matvec (torch's half
# GEMV reads no faster and rounds to F16), by more the numba GEMM (1.6-2x oneDNN's f32 GEMM on
# the converted weight)
HALF_PRODUCT_MAX_ROWS = 4


def flat_span(t: torch.Tensor) -> np.ndarray:
    """A 1-D numpy array over t's memory from its first element to its last (t's dims then index
    it through their strides)."""
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return as_numpy(t.as_strided((span,), (1,)))


def reads_within(flat: np.ndarray, dims, row: int) -> bool:
    """A kernel reading flat[sum(i * stride) + r] for each (count, stride) of dims, i < count,
    and r < row, stays within flat (the bound a binding checks before a kernel indexes a flat
    span by sizes from other tensors: numba does not check indices)."""
    if row <= 0 or any(count <= 0 for count, _ in dims):
        return True
    if any(stride < 0 for _, stride in dims):
        return False
    return sum((count - 1) * int(stride) for count, stride in dims) + row <= flat.shape[0]


def bind_half_products(node):
    """F16 x F32 products in float32, summed in vector lanes as ggml does: a 2-D weight's
    (half_matvec, half_gemm: b rounded to F16 first, ggml's F16 vec_dot type), and batched ones
    with few rows (the heads of attention over an F16 KV cache at decode: half_products, b not
    rounded, as the torch kernels). A batched decode step's rows (ops.mul_mat_set_separate_rows)
    take the matvec and half_products however many they are: each row's products as its own.
    A 2-D BF16 weight's few rows (or a batched decode step's) take bf16_matvec."""
    a, b = node.src[0], node.src[1]
    if not (numba_available() and a.type in (Type.F16, Type.BF16) and b.type == Type.F32 and node.type == Type.F32):
        return None
    va, vb = view(a), view(b)
    separate = mul_mat_separate_rows(node)
    if a.ne[2] * a.ne[3] == 1:
        return _bind_half_weight(va[0, 0], vb, view(node), separate)
    if a.type == Type.BF16 or (b.ne[1] > HALF_PRODUCT_MAX_ROWS and not separate):
        return None
    if va.stride(3) != 1 or vb.stride(3) != 1 or min(va.stride()) < 0 or min(vb.stride()) < 0:
        return None
    strides = (lambda v: np.array(v.stride()[:3], dtype=np.int64))
    return _call(op_kernels().half_products, flat_span(va), strides(va), flat_span(vb), strides(vb), as_numpy(view(node)),
                 a.ne[0], b.ne[2] // a.ne[2], b.ne[3] // a.ne[3])


def _bind_half_weight(w, vb, vout, separate_rows: bool = False):
    """w [N, K] times each [M, K] row block of b (b's and out's dims 2 and 3 walked here: one
    call per block, a model's products have one)."""
    if w.stride(1) != 1 or vb.stride(3) != 1 or vout.stride(3) != 1 or min(w.stride()) < 0:
        return None
    few = separate_rows or vb.shape[2] <= HALF_PRODUCT_MAX_ROWS
    if w.dtype == torch.bfloat16:  # a prompt's rows: torch's BF16 GEMM (products.bind_half_weight_product)
        if not few:
            return None
        kernel = op_kernels().bf16_matvec
    else:
        kernel = op_kernels().half_matvec if few else op_kernels().half_gemm
    w_np = as_numpy(w)
    blocks = [(as_numpy(vb[i3, i2]), as_numpy(vout[i3, i2]))
              for i3 in range(vb.shape[0]) for i2 in range(vb.shape[1])]
    if len(blocks) == 1:
        return _call(kernel, w_np, *blocks[0])

    def bound(_node):
        for rows, out in blocks:
            kernel(w_np, rows, out)
    return bound


# ---------------------------------------------------------------- the switch

def fast_ops_enabled() -> bool:
    """TORCHGGML_CPU_FAST_OPS=0 turns the fast kernels off (for comparisons; read when a graph
    is compiled)."""
    return config.value("TORCHGGML_CPU_FAST_OPS")
