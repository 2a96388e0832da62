"""Split states of the meta device: how one tensor is spread over the simple devices.

A weight's state comes from the user's `get_split_state` callback; every other tensor's state
is derived from its sources, op by op (`derive_split_state`). A source that is PARTIAL is
all-reduced before anyone reads it, so rules only ever see its synced state, MIRRORED.
Combinations a rule cannot express raise UnsupportedSplitError naming the op, the tensor and
the source states.

States of views (VIEW, RESHAPE, PERMUTE, TRANSPOSE, and ops whose result is a view such as
SET_ROWS) follow from the root tensor's state and the view's geometry (`view_split`): a split
axis of the root is found again as the view dimension whose stride walks it.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from ...enums import Op
from ...tensor import Tensor, MAX_DIMS, is_view_op
from ...types import type_traits

MAX_DEVICES = 16


class SplitAxis(IntEnum):
    AXIS_0 = 0
    AXIS_1 = 1
    AXIS_2 = 2
    AXIS_3 = 3
    MIRRORED = 10  # every device holds all values
    PARTIAL = 11   # every device holds a partial sum; the sum is the value
    NONE = 98      # internal bookkeeping
    UNKNOWN = 99


def backend_meta_split_axis_name(axis) -> str:
    axis = SplitAxis(axis)
    return str(int(axis)) if axis <= SplitAxis.AXIS_3 else axis.name


class UnsupportedSplitError(ValueError):
    """A tensor's sources are split in a way its op cannot compute piece by piece."""


@dataclass(frozen=True)
class MetaSplitState:
    """ggml_backend_meta_split_state. For a split axis, `ne` holds one size per segment and
    device; segment s repeats `nr[s]` times (default once each), and the data runs
    [seg0_dev0_r0, seg0_dev1_r0, seg0_dev0_r1, seg0_dev1_r1, seg1_dev0_r0, ...], adding up to the
    tensor's ne[axis] (a fused QKV with K and V alike: 2 segments, the second repeating twice).
    An empty `ne` from a callback means "split each segment evenly" (whole blocks on axis 0)."""
    axis: SplitAxis
    ne: tuple = ()
    n_segments: int = 1
    nr: tuple = ()

    @property
    def is_split(self) -> bool:
        return 0 <= self.axis < MAX_DIMS

    @property
    def segmented(self) -> bool:
        """More than one contiguous piece per device (segments or repeats)."""
        return self.n_segments != 1 or any(r != 1 for r in self.nr)

    def repeats(self, s: int) -> int:
        return self.nr[s] if self.nr else 1

    def device_ne(self, j: int, n: int) -> int:
        """Elements along the split axis device j holds (all segments and repeats)."""
        return sum(self.repeats(s) * self.ne[s * n + j] for s in range(self.n_segments))

    def describe(self) -> str:
        name = backend_meta_split_axis_name(self.axis)
        if not self.is_split:
            return name
        segs = f", {self.n_segments} segments" if self.n_segments > 1 else ""
        reps = f" repeating {list(self.nr)}" if any(r != 1 for r in self.nr) else ""
        return f"axis {name} {list(self.ne)}{segs}{reps}"


MIRRORED = MetaSplitState(SplitAxis.MIRRORED)
PARTIAL = MetaSplitState(SplitAxis.PARTIAL)


def split_evenly(total: int, n: int, granularity: int = 1) -> list[int]:
    """`total` in n nearly equal parts, each a multiple of `granularity` (earlier parts larger)."""
    if total % granularity:
        raise ValueError(f"cannot split {total} in multiples of {granularity}")
    units = total // granularity
    return [(units // n + (j < units % n)) * granularity for j in range(n)]


def axis_granularity(t: Tensor, axis: int) -> int:
    return type_traits(t.type).blck_size if axis == 0 else 1


def resolve(state, t: Tensor, n: int) -> MetaSplitState:
    """A callback's state made complete (even split filled in) and checked against the tensor."""
    if state is None:
        return MIRRORED
    if not isinstance(state, MetaSplitState):
        raise TypeError(f"get_split_state returned {type(state).__name__} for {t.describe()}, not a MetaSplitState")
    if state.axis == SplitAxis.PARTIAL and t.type.name != "F32":
        raise ValueError(f"meta: {t.describe()} can only be PARTIAL as F32")
    if n == 1:  # one device holds every part: the whole tensor (a split of a single K/V head
        return MIRRORED  # would otherwise pass a reshape onto the rows RMS_NORM needs whole)
    if not state.is_split:
        return state
    axis, gran = int(state.axis), axis_granularity(t, int(state.axis))
    nr = tuple(int(r) for r in state.nr)
    if nr and (len(nr) != state.n_segments or min(nr) < 1):
        raise ValueError(f"meta: split state of {t.describe()} has repeats {list(nr)}, expected "
                         f"{state.n_segments} counts of at least 1")
    nr = () if all(r == 1 for r in nr) else nr
    reps = nr or (1,) * state.n_segments
    ne = list(state.ne)
    if not ne:  # equal segments (counting repeats), each split evenly
        seg, rem = divmod(t.ne[axis], sum(reps))
        if rem:
            raise ValueError(f"meta: {t.describe()}: {sum(reps)} segments do not divide ne[{axis}]={t.ne[axis]}")
        try:
            ne = split_evenly(seg, n, gran) * state.n_segments
        except ValueError:
            raise ValueError(f"meta: {t.describe()} cannot be split evenly over {n} devices along axis "
                             f"{axis} in whole blocks of {gran}") from None
    if len(ne) != n * state.n_segments:
        raise ValueError(f"meta: split state of {t.describe()} has {len(ne)} sizes, expected "
                         f"{n} devices x {state.n_segments} segments")
    total = sum(reps[s] * ne[s * n + j] for s in range(state.n_segments) for j in range(n))
    if total != t.ne[axis] or any(x < 0 or x % gran for x in ne):
        raise ValueError(f"meta: split sizes {ne} (repeats {list(reps)}) of {t.describe()} must be multiples "
                         f"of {gran} adding up to ne[{axis}]={t.ne[axis]}")
    return MetaSplitState(SplitAxis(axis), tuple(ne), state.n_segments, nr)


# ---------------------------------------------------------------- derivation

def _fail(t: Tensor, states, why: str):
    srcs = ", ".join(f"{s.name or '?'}: {st.describe()}" for s, st in zip(t.src, states) if s is not None)
    raise UnsupportedSplitError(f"meta: op {t.op.name} of {t.describe()} cannot run split: {why} "
                                f"(sources {srcs})")


def _by_ratio(out_axis: int, t: Tensor, src: Tensor, st: MetaSplitState, n: int) -> MetaSplitState:
    """Output split along out_axis in the same proportions as `src` along its axis."""
    ne = []
    for j in range(n):
        num = st.device_ne(j, n) * t.ne[out_axis]
        if num % src.ne[st.axis]:
            raise UnsupportedSplitError(f"meta: {t.describe()}: device {j}'s share of {src.describe()} "
                                        f"does not map to whole elements of axis {out_axis}")
        ne.append(num // src.ne[st.axis])
    return MetaSplitState(SplitAxis(out_axis), tuple(ne))


def _same_split(a: MetaSplitState, b: MetaSplitState) -> bool:
    return a.axis == b.axis and a.ne == b.ne and a.n_segments == b.n_segments and a.nr == b.nr


def _elementwise(t, S, n, per_row=False):
    """Sources split alike, or MIRRORED where they broadcast along the split axis."""
    srcs = [(s, st) for s, st in zip(t.src, S) if s is not None]
    split = [(s, st) for s, st in srcs if st.is_split]
    if not split:
        return MIRRORED
    s0, st0 = split[0]
    if st0.segmented:
        _fail(t, S, "segmented sources must pass through a matrix product first")
    if per_row and st0.axis == SplitAxis.AXIS_0:
        _fail(t, S, "the op works on whole rows, which are split")
    for s, st in srcs:
        if st.is_split:
            if not _same_split(st, st0) or s.ne[st.axis] != t.ne[st.axis]:
                _fail(t, S, "sources are split differently")
        elif s.ne[st0.axis] != 1:
            _fail(t, S, f"a MIRRORED source must broadcast along the split axis {int(st0.axis)}")
    return _by_ratio(int(st0.axis), t, s0, st0, n)


def _per_row(t, S, n):
    return _elementwise(t, S, n, per_row=True)


def _mirrored_only(t, S, n, why="the op needs MIRRORED sources"):
    if any(st.axis != SplitAxis.MIRRORED for s, st in zip(t.src, S) if s is not None):
        _fail(t, S, why)
    return MIRRORED


def _mul_mat(t, S, n):
    a, b = t.src[0], t.src[1]
    sa, sb = S[0], S[1]
    M = SplitAxis.MIRRORED
    if sa.axis == M and sb.axis == M:
        return MIRRORED
    if sa.axis == SplitAxis.AXIS_1 and sb.axis == M:         # column split weights
        return MetaSplitState(SplitAxis.AXIS_0, tuple(sa.device_ne(j, n) for j in range(n)))
    if sa.axis == SplitAxis.AXIS_0 and sb.axis == SplitAxis.AXIS_0:  # row split: partial sums
        if sa.segmented or sb.segmented or sa.ne != sb.ne:
            _fail(t, S, "both sources must be split alike along ne[0]")
        return PARTIAL
    if sa.axis == M and sb.is_split and sb.axis != SplitAxis.AXIS_0:   # rows of b / batches
        return _by_ratio(int(sb.axis), t, b, sb, n)
    if sa.axis == sb.axis and sa.axis in (SplitAxis.AXIS_2, SplitAxis.AXIS_3):  # batched heads
        ax = int(sa.axis)
        for j in range(n):
            if sb.device_ne(j, n) * a.ne[ax] != sa.device_ne(j, n) * b.ne[ax]:
                _fail(t, S, "each device must keep the broadcast ratio of the batch dimension")
        return _by_ratio(ax, t, b, sb, n)
    _fail(t, S, "supported: MIRRORED x MIRRORED, weights split on axis 1 x MIRRORED, "
                "both split on axis 0 (PARTIAL), MIRRORED x split rows/batches, both split on axis 2 or 3")


def _rope(t, S, n):
    if any(st.axis != SplitAxis.MIRRORED for s, st in zip(t.src[1:3], S[1:3]) if s is not None):
        _fail(t, S, "positions and frequency factors must be MIRRORED")
    if S[0].axis == SplitAxis.AXIS_0:
        _fail(t, S, "rotated pairs lie along ne[0], which is split")
    if S[0].axis == SplitAxis.AXIS_2:
        _fail(t, S, "positions are per ne[2] index, and they are MIRRORED")
    return S[0] if not S[0].is_split else _by_ratio(int(S[0].axis), t, t.src[0], S[0], n)


def _get_rows(t, S, n):
    if S[1].axis != SplitAxis.MIRRORED:
        _fail(t, S, "the row indices must be MIRRORED")
    if S[0].axis == SplitAxis.MIRRORED:
        return MIRRORED
    if S[0].axis == SplitAxis.AXIS_0 and not S[0].segmented:
        return _by_ratio(0, t, t.src[0], S[0], n)
    _fail(t, S, "the table must be MIRRORED or split along ne[0]")


def _set_rows(t, S, n):
    """src0: the new rows, src1: their indices, src2: the destination (t is a view of it)."""
    if S[1].axis != SplitAxis.MIRRORED:
        _fail(t, S, "the row indices must be MIRRORED")
    if S[0].axis == SplitAxis.MIRRORED and S[2].axis == SplitAxis.MIRRORED:
        return MIRRORED
    if S[0].axis == SplitAxis.AXIS_0 and _same_split(S[0], S[2]):
        return S[2]
    _fail(t, S, "destination and rows must both be MIRRORED or split alike along ne[0]")


def _flash_attn_ext(t, S, n):
    q, k, v = S[0], S[1], S[2]
    if q.axis == k.axis == v.axis == SplitAxis.MIRRORED and all(
            st.axis == SplitAxis.MIRRORED for s, st in zip(t.src[3:5], S[3:5]) if s is not None):
        return MIRRORED
    if not (q.axis == k.axis == v.axis == SplitAxis.AXIS_2):
        _fail(t, S, "q, k and v must be split by heads (axis 2)")
    if t.src[3] is not None and (S[3].axis != SplitAxis.MIRRORED or t.src[3].ne[2] > 1):
        _fail(t, S, "the mask must be MIRRORED and shared by all heads")
    _check_alibi(t, S, 1)
    for j in range(n):
        if q.device_ne(j, n) * t.src[1].ne[2] != k.device_ne(j, n) * t.src[0].ne[2] or not _same_split(k, v):
            _fail(t, S, "each device must hold the query heads of its KV heads")
    if t.src[4] is not None and not _same_split(S[4], _by_ratio(0, t.src[4], t.src[0], q, n)):
        _fail(t, S, "the sinks must be split like the heads")
    out = _by_ratio(2, t.src[0], t.src[0], q, n)
    return MetaSplitState(SplitAxis.AXIS_1, out.ne)


def _check_alibi(t, S, i_max_bias: int) -> None:
    """ALiBi slopes depend on the global head index: heads cannot be split with max_bias."""
    from ...tensor import get_op_params_f32
    if get_op_params_f32(t, i_max_bias) != 0.0 and any(st is not None and st.is_split for st in S):
        _fail(t, S, "ALiBi (max_bias) slopes depend on the global head index")


def _soft_max(t, S, n):
    """Rows of src0 with a broadcast mask (src1) and per-head sinks (src2)."""
    st = S[0]
    _check_alibi(t, S, 1)
    if not st.is_split:
        return _mirrored_only(t, S, n, "mask and sinks cannot be split when the scores are not")
    if st.axis == SplitAxis.AXIS_0:
        _fail(t, S, "the op works on whole rows, which are split")
    mask, sinks = t.src[1], t.src[2]
    if mask is not None and (S[1].axis != SplitAxis.MIRRORED or mask.ne[st.axis] > 1):
        _fail(t, S, "the mask must be MIRRORED and broadcast along the split axis")
    if sinks is not None:
        want = MetaSplitState(SplitAxis.AXIS_0, st.ne) if st.axis == SplitAxis.AXIS_2 else MIRRORED
        if not _same_split(S[2], want):
            _fail(t, S, f"the sinks must be {want.describe()}")
    return _by_ratio(int(st.axis), t, t.src[0], st, n)


def _product(xs) -> int:
    p = 1
    for x in xs:
        p *= x
    return p


def _copy_logical(t, S, n):
    """CONT/CPY/DUP copy src0's elements in logical order into t's shape."""
    src, st = t.src[0], S[0]
    if not st.is_split:
        return st
    if st.segmented:
        _fail(t, S, "segmented sources must pass through a matrix product first")
    a = int(st.axis)
    inner = _product(src.ne[:a])
    target = inner * src.ne[a]
    for d in range(MAX_DIMS):
        below = _product(t.ne[:d])
        if below * t.ne[d] == target and (t.ne[d] > 1 or target == below):
            if all((inner * st.device_ne(j, n)) % below == 0 for j in range(n)):
                return MetaSplitState(SplitAxis(d), tuple(inner * st.device_ne(j, n) // below for j in range(n)))
    _fail(t, S, "the new shape cuts through the split axis")


_ELEMENTWISE = (Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.SCALE, Op.UNARY, Op.SQR, Op.SQRT, Op.LOG,
                Op.SIN, Op.COS, Op.CLAMP, Op.LEAKY_RELU, Op.ADD1)
_PER_ROW = (Op.RMS_NORM, Op.NORM, Op.L2_NORM, Op.SUM_ROWS, Op.MEAN, Op.ARGMAX,
            Op.ARGSORT)

RULES = {op: _elementwise for op in _ELEMENTWISE}
RULES.update({op: _per_row for op in _PER_ROW})
RULES.update({
    Op.MUL_MAT: _mul_mat, Op.ROPE: _rope, Op.SOFT_MAX: _soft_max, Op.GET_ROWS: _get_rows, Op.SET_ROWS: _set_rows,
    Op.FLASH_ATTN_EXT: _flash_attn_ext, Op.CONT: _copy_logical, Op.CPY: _copy_logical,
    Op.DUP: _copy_logical,
    Op.GLU: lambda t, S, n: _elementwise(t, S, n, per_row=t.src[1] is None),
})


def derive_split_state(t: Tensor, src_states: list, n: int, root_state=None) -> MetaSplitState:
    """The split state of a computed tensor from its sources' (synced) states. A tensor with a
    view_src takes its state from the root's (`root_state`) and its geometry; for ops whose
    result is a view (SET_ROWS, CPY) the op's own rule must agree."""
    S = [st if s is not None else None for s, st in zip(t.src, src_states)]
    if t.view_src is not None:
        state = view_split(t, t.view_src, root_state, n)
        if not is_view_op(t.op):  # in-place ops and SET_ROWS/CPY: their own rule must agree
            own = RULES[t.op](t, S, n) if t.op in RULES else _mirrored_only(t, S, n)
            if not _same_split(own, state):
                _fail(t, S, f"its result would be {own.describe()}, but it is a view of "
                            f"{t.view_src.describe()} split as {root_state.describe()}")
        return state
    rule = RULES.get(t.op)
    if rule is None:
        return _mirrored_only(t, S, n, "only MIRRORED sources are supported for this op")
    return rule(t, S, n)


# ---------------------------------------------------------------- views

def _root_extent(root: Tensor, a: int) -> int:
    """Bytes one index step of axis a+1 spans in the (contiguous) root."""
    return root.nb[a + 1] if a + 1 < MAX_DIMS else root.nb[a] * root.ne[a]


def decompose(nbytes_: int, root: Tensor) -> list[int]:
    """A byte offset or stride of the contiguous root as per-axis index steps (axis 0 in blocks)."""
    coords = [0] * MAX_DIMS
    rest = nbytes_
    for b in range(MAX_DIMS - 1, -1, -1):
        if root.nb[b] and root.ne[b] > 1 or b == 0:
            coords[b], rest = divmod(rest, root.nb[b])
    if rest:
        raise UnsupportedSplitError(f"meta: {nbytes_} bytes do not fall on an element of {root.describe()}")
    return coords


def view_split(t: Tensor, root: Tensor, rs: MetaSplitState, n: int) -> MetaSplitState:
    if not rs.is_split:
        return rs
    same = list(t.ne) == list(root.ne) and list(t.nb) == list(root.nb) and t.view_offs == 0
    if same:
        return rs
    where = f"meta: view {t.describe()} of {root.describe()} split as {rs.describe()}"
    if rs.segmented:
        raise UnsupportedSplitError(f"{where}: views of segmented tensors are not supported")
    a = int(rs.axis)
    lo, hi = root.nb[a], _root_extent(root, a)
    if decompose(t.view_offs, root)[a]:
        raise UnsupportedSplitError(f"{where}: the view starts inside the split axis")
    # the view dimension that ends exactly where one period of the split axis ends carries the
    # split (it may walk the axis in bigger steps, or merge it with the dimensions inside it)
    dims = [d for d in range(MAX_DIMS) if t.ne[d] > 1 and t.nb[d] * t.ne[d] // _blck(t, d) == hi]
    if not dims:
        raise UnsupportedSplitError(f"{where}: no view dimension spans the split axis")
    d = max(dims, key=lambda i: t.nb[i])
    ne = []
    for j in range(n):
        share = rs.device_ne(j, n) * lo // axis_granularity(root, a)  # bytes of device j's share
        if (share * _blck(t, d)) % t.nb[d]:
            raise UnsupportedSplitError(f"{where}: device {j}'s share is not whole elements of view dimension {d}")
        ne.append(share * _blck(t, d) // t.nb[d])
    return MetaSplitState(SplitAxis(d), tuple(ne))


def _blck(t: Tensor, d: int) -> int:
    """Elements per stride step of dimension d (a block along ne[0] of block types)."""
    return type_traits(t.type).blck_size if d == 0 else 1
