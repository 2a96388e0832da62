"""CGraph: nodes (tensors with an op) and leafs (inputs and weights) in evaluation order."""
from __future__ import annotations

import itertools

from .enums import Op, TensorFlag
from .tensor import Tensor, format_name

DEFAULT_GRAPH_SIZE = 2048

_uids = itertools.count(1)
_COMPUTE = int(TensorFlag.COMPUTE)


class CGraph:
    """ggml_cgraph. `uid` changes whenever the graph's content changes, so backends can cache
    plans (e.g. a captured CUDA graph) per uid."""

    __slots__ = ("size", "nodes", "leafs", "visited", "uid", "order", "grads", "grad_accs", "parent")

    def __init__(self, size: int = DEFAULT_GRAPH_SIZE, grads: bool = False):
        self.size = int(size)
        self.nodes: list[Tensor] = []
        self.leafs: list[Tensor] = []
        self.visited: set[int] = set()  # id() of every tensor in the graph
        self.uid = next(_uids)
        # backward graphs (grads=True): id(tensor) -> its gradient / its gradient accumulator
        self.grads: dict[int, Tensor] | None = {} if grads else None
        self.grad_accs: dict[int, Tensor] | None = {} if grads else None
        self.parent: "CGraph | None" = None  # the whole graph a graph_view shows part of

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    @property
    def n_leafs(self) -> int:
        return len(self.leafs)

    def __repr__(self):
        return f"<ggml.CGraph {self.n_nodes} nodes, {self.n_leafs} leafs>"


def new_graph(ctx=None) -> CGraph:
    return CGraph(DEFAULT_GRAPH_SIZE)


def new_graph_custom(ctx=None, size: int = DEFAULT_GRAPH_SIZE, grads: bool = False) -> CGraph:
    """A graph of up to `size` nodes; grads=True gives it gradients (build_backward_expand)."""
    return CGraph(size, grads)


def graph_size(graph: CGraph) -> int:
    return graph.size


def graph_n_nodes(graph: CGraph) -> int:
    return len(graph.nodes)


def graph_node(graph: CGraph, i: int) -> Tensor:
    """The i-th node; negative i counts from the end as in ggml (-1 is the last node)."""
    n = len(graph.nodes)
    if not -n <= i < n:
        raise IndexError(f"graph_node: index {i} out of range for a graph of {n} nodes")
    return graph.nodes[i]


def graph_nodes(graph: CGraph) -> list[Tensor]:
    return graph.nodes


def graph_add_node(graph: CGraph, t: Tensor) -> None:
    if len(graph.nodes) >= graph.size:
        raise RuntimeError(f"graph is full ({graph.size} nodes): create it with new_graph_custom(size=...)")
    graph.nodes.append(t)
    graph.visited.add(id(t))
    graph.uid = next(_uids)


def _visit(graph: CGraph, root: Tensor, compute: bool) -> None:
    """Post-order DFS over sources (left to right), iteratively: deep graphs exceed Python's stack.
    A tensor that is its own (indirect) source, a cycle made by editing `src` by hand, raises
    ValueError naming it instead of growing the stack without end."""
    visited = graph.visited
    if id(root) in visited:
        return
    stack = [(root, 0)]
    open_ = set()  # tensors whose sources are being visited: reaching one again is a cycle
    while stack:
        t, i = stack.pop()
        if i == 0 and id(t) in visited:
            continue
        open_.add(id(t))
        src = t.src
        while i < len(src) and (src[i] is None or id(src[i]) in visited):
            i += 1
        if i < len(src):
            if id(src[i]) in open_:
                raise ValueError(f"build_forward_expand: the graph has a cycle: {src[i].describe()} depends on "
                                 f"itself (through src[{i}] of {t.describe()})")
            stack.append((t, i + 1))
            stack.append((src[i], 0))
            continue
        open_.discard(id(t))
        if id(t) in visited:
            continue
        visited.add(id(t))
        if t.op == Op.NONE and not (t.flags & TensorFlag.PARAM):
            if len(graph.leafs) >= graph.size:
                raise RuntimeError(f"graph is full ({graph.size} leafs): create it with new_graph_custom(size=...)")
            if not t.name:
                format_name(t, "leaf_%d", len(graph.leafs))
            graph.leafs.append(t)
        else:
            if len(graph.nodes) >= graph.size:
                raise RuntimeError(f"graph is full ({graph.size} nodes): create it with new_graph_custom(size=...)")
            if not t.name:
                format_name(t, "node_%d", len(graph.nodes))
            if compute:
                t.flags |= _COMPUTE
            graph.nodes.append(t)


def build_forward_expand(graph: CGraph, tensor: Tensor) -> None:
    """Add `tensor` and everything it depends on that is not yet in the graph."""
    n0 = len(graph.nodes)
    _visit(graph, tensor, compute=True)
    if len(graph.nodes) != n0:
        graph.uid = next(_uids)


def build_forward_select(graph: CGraph, tensors, idx: int) -> Tensor:
    """Add every tensor's dependencies but mark only tensors[idx]'s own nodes for compute:
    the graph keeps the same topology for several variants (upstream's ggml_build_forward_select)."""
    for i, t in enumerate(tensors):
        if i != idx:
            _visit(graph, t, compute=False)
    _visit(graph, tensors[idx], compute=True)
    graph.uid = next(_uids)
    return tensors[idx]


def graph_view(graph: CGraph, i0: int, i1: int) -> CGraph:
    """A graph of nodes [i0, i1) of `graph`, without leafs (they belong to the parent)."""
    view = CGraph(i1 - i0)
    view.nodes = graph.nodes[i0:i1]
    view.visited = {id(t) for t in view.nodes}
    view.parent = graph.parent or graph
    return view


def graph_cpy(src: CGraph, dst: CGraph) -> None:
    if dst.size < len(src.nodes) or dst.size < len(src.leafs):
        raise ValueError("graph_cpy: destination graph too small")
    dst.nodes = list(src.nodes)
    dst.leafs = list(src.leafs)
    dst.visited = set(src.visited)
    dst.uid = next(_uids)
    if dst.grads is not None:
        dst.grads, dst.grad_accs = {}, {}
    if src.grads is not None:
        if dst.grads is None:
            raise ValueError("graph_cpy: the source has gradients, the destination none (grads=True)")
        dst.grads.update(src.grads)
        dst.grad_accs.update(src.grad_accs)


def graph_dup(ctx, graph: CGraph, force_grads: bool = False) -> CGraph:
    g = CGraph(graph.size, graph.grads is not None or force_grads)
    graph_cpy(graph, g)
    return g


def graph_clear(graph: CGraph) -> None:
    graph.nodes = []
    graph.leafs = []
    graph.visited = set()
    graph.uid = next(_uids)


def graph_get_tensor(graph: CGraph, name: str) -> Tensor | None:
    for t in graph.leafs:
        if t.name == name:
            return t
    for t in graph.nodes:
        if t.name == name:
            return t
    return None
