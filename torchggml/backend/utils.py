"""Graph utilities: copy an allocated graph to another backend, and compare two backends node
by node (ggml_backend_graph_copy / ggml_backend_compare_graph_backend)."""
from __future__ import annotations

import warnings
from dataclasses import dataclass

from ..context import Context
from ..graph import CGraph, graph_view
from ..tensor import Tensor, are_same_layout, set_name
from ..enums import VIEW_OPS
from .tensor_io import backend_tensor_copy


@dataclass
class GraphCopy:
    """ggml_backend_graph_copy: the copied graph, its buffer and its two contexts (all None
    when the copy could not be allocated)."""
    buffer: object
    ctx_allocated: Context | None
    ctx_unallocated: Context | None
    graph: CGraph | None


def _dup(src: Tensor, copies: dict, ctx_allocated: Context, ctx_unallocated: Context) -> Tensor:
    """A tensor with src's layout, op, params, name and flags; sources and view source copied
    too. Tensors with memory of their own go to ctx_allocated, views to ctx_unallocated."""
    done = copies.get(id(src))
    if done is not None:
        return done
    if src.data is None:
        raise ValueError(f"backend_graph_copy: {src.describe()} is not allocated (the graph must be allocated)")
    ctx = ctx_unallocated if src.view_src is not None else ctx_allocated
    dst = Tensor(ctx, src.type, list(src.ne), list(src.nb))
    ctx.tensors.append(dst)
    copies[id(src)] = dst
    if src.view_src is not None:
        dst.view_src = _dup(src.view_src, copies, ctx_allocated, ctx_unallocated)
        dst.view_offs = src.view_offs
    dst.op = src.op
    dst.op_params[:] = src.op_params
    dst.flags = src.flags
    set_name(dst, src.name)
    for i, s in enumerate(src.src):
        if s is not None:
            dst.src[i] = _dup(s, copies, ctx_allocated, ctx_unallocated)
    return dst


def _init(src: Tensor, copies: dict, initialised: set) -> None:
    """Give the copy its memory content: views point into their copied source, others get the
    source's bytes."""
    from ..alloc import backend_view_init
    if id(src) in initialised:
        return
    initialised.add(id(src))
    dst = copies[id(src)]
    if dst.view_src is not None:
        _init(src.view_src, copies, initialised)
        backend_view_init(dst)
    else:
        backend_tensor_copy(src, dst)
    for s in src.src:
        if s is not None:
            _init(s, copies, initialised)


def backend_graph_copy(backend, graph: CGraph) -> GraphCopy:
    """A copy of an allocated graph whose tensors live in a new buffer of `backend`, with the
    same data. All fields are None when the buffer cannot be allocated (a warning says why)."""
    from ..alloc import backend_alloc_ctx_tensors
    ctx_allocated, ctx_unallocated = Context(no_alloc=True), Context(no_alloc=True)
    copies: dict[int, Tensor] = {}
    for node in graph.nodes:
        _dup(node, copies, ctx_allocated, ctx_unallocated)
    try:
        buffer = backend_alloc_ctx_tensors(ctx_allocated, backend)
    except MemoryError as e:
        warnings.warn(f"backend_graph_copy: cannot allocate the copy on {backend.get_name()}: {e}",
                      RuntimeWarning, stacklevel=2)
        return GraphCopy(None, None, None, None)
    initialised: set[int] = set()
    for node in graph.nodes:
        _init(node, copies, initialised)
    copy = CGraph(graph.size)
    copy.nodes = [copies[id(n)] for n in graph.nodes]
    copy.leafs = [copies[id(t)] for t in graph.leafs if id(t) in copies]
    copy.visited = {id(t) for t in copy.nodes + copy.leafs}
    return GraphCopy(buffer, ctx_allocated, ctx_unallocated, copy)


def backend_graph_copy_free(copy: GraphCopy) -> None:
    if copy.buffer is not None:
        copy.buffer.free()
    for ctx in (copy.ctx_allocated, copy.ctx_unallocated):
        if ctx is not None:
            ctx.free()


def backend_compare_graph_backend(backend1, backend2, graph: CGraph, callback, test_nodes=None, *,
                                  test_node: Tensor | None = None) -> bool:
    """Run `graph` on backend1 and a copy of it on backend2, and hand each pair of results to
    `callback(index, t1, t2) -> bool` (False stops). Node by node by default; with `test_nodes`
    (a list of nodes, or one node; `test_node=` is the older spelling), both whole graphs run and
    only those nodes are compared, in graph order. False when the copy cannot be made."""
    if test_node is not None:
        test_nodes = [test_node] if test_nodes is None else list(test_nodes) + [test_node]
    if isinstance(test_nodes, Tensor):
        test_nodes = [test_nodes]
    wanted = {id(t) for t in test_nodes or ()}
    missing = [t for t in test_nodes or () if all(n is not t for n in graph.nodes)]
    if missing:
        raise ValueError(f"backend_compare_graph_backend: {missing[0].describe()} is not a node of the graph")
    copy = backend_graph_copy(backend2, graph)
    if copy.buffer is None:
        return False
    from .backend import backend_graph_compute
    try:
        g1, g2 = graph, copy.graph
        if wanted:
            backend_graph_compute(backend1, g1)
            backend_graph_compute(backend2, g2)
            for i, t1 in enumerate(g1.nodes):
                if id(t1) in wanted:
                    callback(i, t1, g2.nodes[i])
            return True
        for i, (t1, t2) in enumerate(zip(g1.nodes, g2.nodes)):
            assert t1.op == t2.op and are_same_layout(t1, t2)
            backend_graph_compute(backend1, graph_view(g1, i, i + 1))
            backend_graph_compute(backend2, graph_view(g2, i, i + 1))
            if t1.op in VIEW_OPS:
                continue
            if not callback(i, t1, t2):
                break
        return True
    finally:
        backend_graph_copy_free(copy)
