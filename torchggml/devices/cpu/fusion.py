"""Fused calls in the CPU's compiled graphs, as ggml's GPU backends fuse node patterns when they
compute a graph (ggml_can_fuse): a run of nodes whose intermediate results nobody else reads
becomes one kernel call at the last node, the others' calls dropped.

    rounding    a prompt's int8 GEMMs of the same rows (a layer's Q, K and V products; gate and
                up): the first rounds the rows, the others read its rounding
                (layouts/fused.shared_rounding), where no call between them writes the rows.
    attention   MUL_MAT(K, Q) -> SOFT_MAX(mask, scale) -> MUL_MAT(CONT(V^T), .): attention
                without flash_attn_ext (llama.cpp's default graph), one numba call a layer
                instead of four nodes, the V^T copy among them: jit/op_kernels.decode_attention
                for a decode step's few rows, prompt_attention for a prompt's (which reads only
                the cells the mask lets each block of rows see: a causal prompt's scores are a
                triangle, not the square of the unfused products and softmax). A decode step's
                CONT(PERMUTE(KQV)) after it (the heads side by side for the output projection)
                fuses too: the attention writes its rows there.

A pattern fuses only when each intermediate has one consumer in the whole graph (the scheduler's
splits and the eval callback's ranges are views of it: a node another split or the callback
reads is not fused away) and no OUTPUT flag. TORCHGGML_CPU_FAST_OPS=0 turns fusion off with the
numba layer.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from ...enums import Op, TensorFlag, VIEW_OPS
from ...ops.matmul import mul_mat_separate_rows
from ...tensor import get_op_params_f32, nbytes, nelements
from ...types import Type
from ..kernels.common import view
from .fast_ops import as_numpy, flat_span, reads_within
from .jit.loader import BoundKernel, import_numba, numba_available, op_kernels
from .layouts.fused import rounding_key, shared_rounding

# query rows per head the decode attention takes (a few tokens), and any number of a batched
# decode step's (ops.mul_mat_set_separate_rows: each row's attention is computed as its own);
# more rows take the prompt attention
ATTENTION_MAX_ROWS = 4

_OUTPUT = int(TensorFlag.OUTPUT)


def use_counts(nodes) -> Counter:
    """id(tensor) -> how many sources of `nodes` (and views) refer to it."""
    counts = Counter()
    for node in nodes:
        for src in node.src:
            if src is not None:
                counts[id(src)] += 1
        if node.view_src is not None and node.op in VIEW_OPS:
            counts[id(node.view_src)] += 1
    return counts


def fuse(calls, graph) -> list:
    """The compiled calls with the fusable patterns of `graph` (or of the graph it is a view of)
    replaced by fused calls."""
    if not numba_available():
        return calls
    position = {id(node): i for i, (_, node) in enumerate(calls)}
    counts = use_counts((graph.parent or graph).nodes)
    fused, dropped = {}, set()
    work = {}  # the fused calls' work areas by shape: one for all layers (the calls run one at a time)
    for i, (_, node) in enumerate(calls):
        found = _attention_pattern(node, counts, position)
        if found is None:
            continue
        kq, probs, v_t = found
        at, heads_out = i, _heads_out(node, calls, i, counts, position)
        if heads_out is not None:  # the attention writes CONT(PERMUTE(KQV))'s rows: KQV's call dropped too
            at = i + 1
            found = found + (node,)
        skipped = dropped | {position[id(t)] for t in found}
        # the fused call reads K, Q, the mask and V when the last node runs: memory the graph
        # allocator gave back after their last unfused reader must not have been written since
        reads = [(kq.src[0], kq), (kq.src[1], kq), (probs.src[1], probs), (v_t.src[0], v_t)]
        if not all(t is None or _untouched(t, calls, position[id(reader)], at, skipped) for t, reader in reads):
            continue
        call = _bind_attention(node, kq, probs, v_t, work=work, out=heads_out)
        if call is not None:
            fused[at] = call
            dropped = skipped
    if fused:
        calls = [(fused.get(i, fn), node) for i, (fn, node) in enumerate(calls) if i not in dropped]
    return _share_rounding(_fuse_norm_mul(calls, counts))


def _fuse_norm_mul(calls, counts) -> list:
    """The calls with each decode step's RMS_NORM / NORM and the MUL by its weight right after it
    (row_norm's and binary's bound calls, the norm read by the MUL alone) as one norm_mul call."""
    kernels = op_kernels()
    out, norm_call = [], None
    for fn, node in calls:
        norm = node.src[0] if node.op == Op.MUL else None
        prev = out[-1] if out else None
        if (norm is not None and prev is not None and prev[1] is norm and _norm_mul_takes(prev[0], fn, norm, node, counts)):
            norm_call = prev[0]
            out[-1] = (BoundKernel(kernels.norm_mul, norm_call.args[0], fn.args[1], fn.args[2], *norm_call.args[2:]), node)
            if len(out) > 1 and _add_takes(out[-2], norm.src[0], node):
                add = out[-2][0]
                out[-2:] = [(BoundKernel(kernels.add_norm_mul, *add.args[:3], *out[-1][0].args[1:]), node)]
            continue
        out.append((fn, node))
    return out


def _add_takes(call, x, mul) -> bool:
    """The call before a norm_mul of x into mul is x's ADD (binary's serial call) of two F32
    operands of x's shape, and mul is x or apart from it and, for more than one row, apart from
    the operands (add_norm_mul writes a row's output after reading the row's operands, and the
    next rows' after that): x = a + b then fuses into add_norm_mul (x is still written: the
    residual stream reads it again)."""
    fn, node = call
    if not (node is x and node.op == Op.ADD and isinstance(fn, BoundKernel) and fn.kernel is op_kernels().binary
            and fn.args[3] == 0):
        return False
    a, b = node.src[0], node.src[1]
    if not all(t is not None and t.type == Type.F32 and list(t.ne) == list(x.ne) for t in (a, b)):
        return False
    one_row = nelements(x) == x.ne[0]
    return (one_row or (_apart(mul, a) and _apart(mul, b))) and (_apart(mul, x) or _same_memory(mul, x))


def _apart(t, other) -> bool:
    return t.data + nbytes(t) <= other.data or other.data + nbytes(other) <= t.data


def _same_memory(t, other) -> bool:
    return t.data == other.data and nbytes(t) == nbytes(other)


def _norm_mul_takes(norm_fn, mul_fn, norm, mul, counts) -> bool:
    """norm_mul takes the pair: the serial numba kernels bound, F32 rows, the norm read once and
    not an output, the weight's rows as long as the norm's, and the MUL's output the norm's input
    or memory apart from it (norm_mul writes its rows while it reads them)."""
    kernels = op_kernels()
    if not (isinstance(norm_fn, BoundKernel) and norm_fn.kernel is kernels.row_norm and isinstance(mul_fn, BoundKernel)
            and mul_fn.kernel is kernels.binary and mul_fn.args[3] == 2):
        return False
    x, w = norm.src[0], mul.src[1]
    if (counts[id(norm)] != 1 or norm.flags & _OUTPUT or mul.src[0] is not norm or w is None
            or any(t.type != Type.F32 for t in (x, norm, w, mul)) or w.ne[0] != norm.ne[0]
            or list(mul.ne) != list(norm.ne)):
        return False
    return _same_memory(mul, x) or _apart(mul, x)


def _share_rounding(calls) -> list:
    """The calls with each group of int8 GEMMs of the same rows (fused.rounding_key) rounding
    them once, at the group's first call, where no call up to its last writes the rows."""
    groups = {}
    for i, (fn, node) in enumerate(calls):
        key = rounding_key(fn)
        if key is not None:  # the same rows node (its memory may hold another node's rows elsewhere in the plan)
            groups.setdefault((id(node.src[1]), key), []).append(i)
    calls = list(calls)
    areas = []  # (rounded rows' areas, the position of the last call that reads them)
    for at in groups.values():
        rows = calls[at[0]][1].src[1]
        if len(at) < 2 or not _untouched(rows, calls, at[0], at[-1], ()):
            continue
        free = next((a for a in areas if a[1] < at[0]), None)  # areas no other group reads in between
        if free is None:
            free = [{}, 0]
            areas.append(free)
        free[1] = at[-1]
        for i in at:
            fn, node = calls[i]
            calls[i] = (shared_rounding(fn, free[0], rounded=i != at[0]), node)
    return calls


def _untouched(t, calls, start: int, end: int, skipped) -> bool:
    """No call between positions start and end (but the skipped) writes over t's bytes."""
    lo, hi = t.data, t.data + nbytes(t)
    for j in range(start + 1, end):
        if j in skipped:
            continue
        out = calls[j][1]
        if out.data < hi and lo < out.data + nbytes(out):
            return False
    return True


def _private(t, counts, position) -> bool:
    """t is computed by this plan, read once in the whole graph, and not a graph output."""
    return id(t) in position and counts[id(t)] == 1 and not (t.flags & _OUTPUT)


def _heads_out(kqv, calls, i, counts, position):
    """The rows [n_head, 1, d_v] over the memory of the call after KQV's where that call is
    CONT(PERMUTE(kqv, 0, 2, 1, 3)) of one token, KQV read by nothing else (the heads side by side,
    as the model's output projection reads them): the decode attention writes them there and the
    copy is dropped; else None."""
    if i + 1 >= len(calls):
        return None
    cont = calls[i + 1][1]
    perm = cont.src[0]
    # (the PERMUTE refers to KQV twice: as its source and as the view's)
    if (cont.op != Op.CONT or perm is None or perm.op != Op.PERMUTE or perm.view_src is not kqv
            or perm.src[0] is not kqv or counts[id(kqv)] != 2 or id(kqv) not in position or kqv.flags & _OUTPUT
            or cont.type != Type.F32 or kqv.ne[1] != 1 or counts[id(perm)] != 1 or perm.flags & _OUTPUT):
        return None
    d_v, n_head = kqv.ne[0], kqv.ne[2]
    rows = view(kqv)[0]                            # [n_head, 1, d_v]
    if (list(perm.ne) != [d_v, n_head, 1, 1] or view(perm)[0, 0].data_ptr() != rows.data_ptr()
            or list(view(perm)[0, 0].stride()) != [rows.stride(0), 1] or nelements(cont) != d_v * n_head):
        return None
    dst = view(cont).reshape(-1)
    if not dst.is_contiguous():
        return None
    return as_numpy(dst).reshape(n_head, 1, d_v)


def _attention_pattern(kqv, counts, position):
    """(kq, softmax, v_t) when kqv = MUL_MAT(CONT(v^T), SOFT_MAX(MUL_MAT(k, q), mask)) fuses."""
    if kqv.op != Op.MUL_MAT:
        return None
    v_t, probs = kqv.src[0], kqv.src[1]
    if v_t is None or probs is None or v_t.op != Op.CONT or probs.op != Op.SOFT_MAX:
        return None
    kq = probs.src[0]
    if kq.op != Op.MUL_MAT or not all(_private(t, counts, position) for t in (kq, probs, v_t)):
        return None
    return kq, probs, v_t


def _bind_attention(kqv, kq, probs, v_t, work=None, out=None):
    """The fused call, or None where the kernel does not take the nodes: F16 K and V, F32 Q and
    output, a mask of one matrix (F32 or F16), no ALiBi or sinks, no dim 3, and
    nodes whose shapes are the pattern's (the kernel reads K, Q, the mask and V by sizes taken
    from them; a graph from the wire may pair them otherwise: then the nodes run unfused).
    out: where the decode attention writes its rows (_heads_out), else KQV's memory."""
    k, q, mask = kq.src[0], kq.src[1], probs.src[1]
    v = v_t.src[0]  # the permuted view of the V cells
    if v.op != Op.PERMUTE or v.view_src is None:
        return None
    if probs.src[2] is not None or get_op_params_f32(probs, 1) != 0.0:  # sinks, ALiBi
        return None
    if not (k.type == Type.F16 and v.type == Type.F16 and q.type == Type.F32 and kqv.type == Type.F32
            and kq.type == Type.F32 and probs.type == Type.F32):
        return None
    if mask is not None and (mask.type not in (Type.F32, Type.F16) or mask.ne[2] != 1 or mask.ne[3] != 1):
        return None
    d_k, n_tok, n_head = q.ne[0], q.ne[1], q.ne[2]
    n_kv, n_head_kv, d_v = k.ne[1], k.ne[2], v.ne[1]
    few_rows = n_tok <= ATTENTION_MAX_ROWS or mul_mat_separate_rows(kqv)
    if out is not None and not few_rows:
        return None
    if (any(t.ne[3] != 1 for t in (k, q, v, kqv)) or n_head % n_head_kv
            or not _pattern_shapes(kqv, kq, probs, v_t, k, v, mask, (d_k, n_kv, n_tok, n_head, n_head_kv, d_v))):
        return None
    vk, vv = view(k)[0], view(v)[0]              # [n_head_kv, n_kv, d_k]; the permuted V [n_head_kv, d_v, n_kv]
    vv = vv.transpose(1, 2)                       # back to the cells' [n_head_kv, n_kv, d_v]
    if vk.stride(2) != 1 or vv.stride(2) != 1 or min(vk.stride()) < 0 or min(vv.stride()) < 0:
        return None
    k_span, v_span = flat_span(vk), flat_span(vv)
    strides = np.array([vk.stride(0), vk.stride(1), vv.stride(0), vv.stride(1)], dtype=np.int64)
    # every K and V row the kernel reads lies in the spans (the views' own memory)
    if not (reads_within(k_span, ((n_head_kv, strides[0]), (n_kv, strides[1])), d_k)
            and reads_within(v_span, ((n_head_kv, strides[2]), (n_kv, strides[3])), d_v)):
        return None
    vq = as_numpy(view(q)[0])                     # [n_head, n_tok, d_k]
    vm = as_numpy(view(mask)[0, 0]) if mask is not None else np.zeros((1, 1), np.float32)
    if out is None:
        out = as_numpy(view(kqv)[0])              # [n_head, n_tok, d_v]
    work = {} if work is None else work

    def area(*shape):
        """A float32 work area shared by the plan's fused calls (each writes what it reads)."""
        if shape not in work:
            work[shape] = np.empty(shape, np.float32)
        return work[shape]
    scratch = area(n_head, n_tok, d_v)
    args = (k_span, v_span, strides, int(n_kv), int(n_head_kv), vq, vm, mask is not None,
            np.float32(get_op_params_f32(probs, 0)), scratch, out, import_numba().get_num_threads())
    if few_rows:
        return BoundKernel(op_kernels().decode_attention, *args)
    kernels = op_kernels()
    return BoundKernel(kernels.prompt_attention, *args, area(n_head_kv, d_k, n_kv + kernels.TILE_WIDTH),
                       area(n_head_kv, n_kv, d_v))


def _pattern_shapes(kqv, kq, probs, v_t, k, v, mask, sizes) -> bool:
    """The nodes' shapes are those of decode attention over K [d_k, n_kv, n_head_kv], Q [d_k,
    n_tok, n_head] and V^T's cells [n_kv, d_v, n_head_kv]: KQ and its softmax [n_kv, n_tok,
    n_head], CONT(V^T) V^T's own shape (a CONT that reshapes is not a transpose), KQV [d_v,
    n_tok, n_head], a mask of at least [n_kv, n_tok]."""
    d_k, n_kv, n_tok, n_head, n_head_kv, d_v = sizes
    scores = [n_kv, n_tok, n_head, 1]
    return (list(k.ne) == [d_k, n_kv, n_head_kv, 1] and list(v.ne) == [n_kv, d_v, n_head_kv, 1]
            and list(v_t.ne) == list(v.ne) and list(kq.ne) == scores and list(probs.ne) == scores
            and list(kqv.ne) == [d_v, n_tok, n_head, 1]
            and (mask is None or (mask.ne[0] >= n_kv and mask.ne[1] >= n_tok)))
