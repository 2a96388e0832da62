"""graph_function: a ggml graph as a torch callable, registered as the custom op
`torchggml::graph_call` (with a fake implementation, so torch.compile(fullgraph=True) traces
it and torch.export exports it) and differentiable (see evaluate.py for the backward).

    f = ggml.graph_function(graph, [x_in], [y_out], backend)
    y = f(x)                     # torch in, torch out; the plan is compiled once
    y.sum().backward()           # gradients to x and to f.parameters() (PARAM-flagged weights)
"""
from __future__ import annotations

import itertools
import weakref

import torch

from ..backend.backend import (Backend, backend_graph_plan_create, backend_graph_plan_compute,
                               backend_graph_plan_free, backend_synchronize)
from ..backend.tensor_io import backend_tensor_set
from ..enums import TensorFlag
from ..interop import to_torch
from ..profiler import split_range
from ..tensor import Tensor, nelements
from ..types import type_traits
from .evaluate import GraphEvaluator

# live GraphFunctions by key: the custom op takes the key, a string (torch.compile keeps
# strings constant, where it may turn an int that changes between calls into a symbol);
# entries go when their function is collected
_FUNCTIONS: "weakref.WeakValueDictionary[str, GraphFunction]" = weakref.WeakValueDictionary()
_ids = itertools.count(1)


_PLAIN = (torch.Tensor, torch.nn.Parameter)  # not fake, functional or other traced tensors


def _torch_shape(t: Tensor) -> tuple:
    """The shape to_torch gives t (trailing unit ggml dims dropped)."""
    from ..tensor import n_dims
    return tuple(reversed(t.ne[:n_dims(t)]))


def _dtype(t: Tensor, what: str) -> torch.dtype:
    dtype = type_traits(t.type).dtype
    if dtype is None:
        raise TypeError(f"graph_function: {what} {t.describe()} is a block type; inputs and outputs "
                        f"must be plain types")
    return dtype


def _cuda_stream(backend) -> torch.cuda.Stream | None:
    """The torch.cuda.Stream a backend runs on, if it is a CUDA backend."""
    stream = getattr(getattr(backend, "stream", None), "stream", None)
    return stream if isinstance(stream, torch.cuda.Stream) else None


class GraphFunction:
    """See graph_function."""

    def __init__(self, graph, inputs, outputs, backend_or_sched, params=None, read_weight=None):
        from ..backend.sched import Sched
        self.graph = graph
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        if params is None:  # PARAM-flagged tensors (the graph keeps them among its nodes, as upstream)
            params = [t for t in [*graph.nodes, *graph.leafs]
                      if t.flags & TensorFlag.PARAM and all(t is not i for i in self.inputs)]
        self.params = list(params)
        for t in self.inputs:
            _dtype(t, "input")
        for t in self.outputs:
            _dtype(t, "output")
        for t in self.params:
            if not t.type.name.startswith(("F", "BF")):
                raise TypeError(f"graph_function: trainable {t.describe()} must be a float type")
        self.sched = backend_or_sched if isinstance(backend_or_sched, Sched) else None
        self.backend = None if self.sched is not None else backend_or_sched
        if self.backend is not None and not isinstance(self.backend, Backend):
            raise TypeError(f"graph_function: expected a Backend or a Sched, got {type(backend_or_sched).__name__}")
        self.galloc = None
        self.plan = None
        self.weight_buffer = None
        self._allocate()
        self.out_meta = [(_torch_shape(t), _dtype(t, "output"), to_torch(t).device) for t in self.outputs]
        self._param_views = [self._trainable_view(t) for t in self.params]
        self.evaluator = GraphEvaluator(graph, self.outputs, read_weight)
        self.id = f"graph_function#{next(_ids)}"
        _FUNCTIONS[self.id] = self

    def _allocate_weights(self) -> None:
        """The graph's weights (tensors no op computes, other than the inputs) that have no
        memory yet get a buffer of their own, zeroed and kept for the function's life. In the
        graph's compute memory they would share addresses with intermediate results: a weight
        set after the function is made would be right for one call and overwritten by the next."""
        from ..alloc import backend_alloc_tensors_from_buft
        from ..enums import Op
        weights = [t for t in [*self.graph.leafs, *self.graph.nodes]
                   if t.op == Op.NONE and t.data is None and t.view_src is None
                   and all(t is not i for i in self.inputs)]
        if not weights:
            return
        buft = (self.sched.bufts[0] if self.sched is not None else self.backend.get_default_buffer_type())
        self.weight_buffer = backend_alloc_tensors_from_buft(weights, buft)
        self.weight_buffer.clear(0)

    def _allocate(self) -> None:
        """Memory for every tensor of the graph (once), and the backend's plan."""
        self._allocate_weights()
        if self.sched is not None:
            from ..backend.sched import backend_sched_alloc_graph, backend_sched_reset
            backend_sched_reset(self.sched)
            if not backend_sched_alloc_graph(self.sched, self.graph):
                raise MemoryError("graph_function: the scheduler cannot allocate the graph")
            return
        if any(t.data is None and (t.view_src is None or t.view_src.data is None)
               for t in [*self.graph.nodes, *self.graph.leafs]):
            from ..alloc import gallocr_new, gallocr_alloc_graph
            self.galloc = gallocr_new(self.backend.get_default_buffer_type())
            if not gallocr_alloc_graph(self.galloc, self.graph):
                raise MemoryError(f"graph_function: cannot allocate the graph on {self.backend.name}")
        self.plan = backend_graph_plan_create(self.backend, self.graph)

    @staticmethod
    def _trainable_view(t: Tensor) -> torch.Tensor:
        view = to_torch(t)
        view.requires_grad_(True)
        return view

    def parameters(self) -> list[torch.Tensor]:
        """Zero-copy torch views of the trainable weights (requires_grad=True): an optimizer that
        updates them updates the ggml tensors."""
        return list(self._param_views)

    def __repr__(self):
        where = "sched" if self.sched is not None else self.backend.name
        return (f"<ggml.GraphFunction {len(self.inputs)} inputs -> {len(self.outputs)} outputs on {where}, "
                f"{len(self.params)} trainable>")

    def __call__(self, *xs: torch.Tensor, params=None):
        """Outputs for inputs `xs`. `params`: torch tensors to use for the trainable weights
        (e.g. an nn.Module's Parameters over the same memory; default: parameters())."""
        if len(xs) != len(self.inputs):
            raise TypeError(f"graph_function: expected {len(self.inputs)} inputs, got {len(xs)}")
        params = self._param_views if params is None else list(params)
        if len(params) != len(self.params):
            raise TypeError(f"graph_function: expected {len(self.params)} parameter tensors, got {len(params)}")
        args = [*xs, *params]
        if self._eager_only(args):  # nothing to trace or differentiate: skip the op dispatcher
            outs = self.run(args)
        else:
            outs = torch.ops.torchggml.graph_call(self.id, args)
        return outs[0] if len(outs) == 1 else tuple(outs)

    @staticmethod
    def _eager_only(args) -> bool:
        """Plain tensors, no gradient wanted, no compiler tracing: the custom op would only add
        its dispatch cost (tens of µs) to calling run() directly."""
        if torch.compiler.is_compiling() or any(type(a) not in _PLAIN for a in args):
            return False
        return not (torch.is_grad_enabled() and any(a.requires_grad for a in args))

    # --- the forward on the ggml backend
    def run(self, xs) -> list[torch.Tensor]:
        for t, x in zip([*self.inputs, *self.params], xs):
            self._set(t, x)
        stream = _cuda_stream(self.backend) if self.backend is not None else None
        if stream is not None:  # order after the caller's work without a host sync
            stream.wait_stream(torch.cuda.current_stream(stream.device))
        if self.sched is not None:
            from ..backend.sched import backend_sched_alloc_graph, backend_sched_graph_compute
            if not self.sched.is_alloc and not backend_sched_alloc_graph(self.sched, self.graph):
                raise MemoryError("graph_function: the scheduler cannot allocate the graph")
            status = backend_sched_graph_compute(self.sched, self.graph)
        else:
            with split_range(self.backend.name, 0):  # one backend: the whole graph is one split
                status = backend_graph_plan_compute(self.backend, self.plan)
            if stream is not None:
                torch.cuda.current_stream(stream.device).wait_stream(stream)
            else:
                backend_synchronize(self.backend)
        if int(status) != 0:
            raise RuntimeError(f"graph_function: compute failed with status {status!r}")
        return [to_torch(t).clone() for t in self.outputs]

    def _set(self, t: Tensor, x: torch.Tensor) -> None:
        if x.numel() != nelements(t):
            raise ValueError(f"graph_function: {t.describe()} takes {nelements(t)} values, got a tensor "
                             f"of shape {tuple(x.shape)}")
        view = to_torch(t)
        if x.data_ptr() == view.data_ptr() and x.device == view.device and x.dtype == view.dtype:
            return  # a zero-copy view of the tensor itself (trainable weights)
        backend_tensor_set(t, x.detach().to(view.dtype).contiguous())

    # --- the same graph as differentiable torch functions
    def reference(self, *xs: torch.Tensor, dtype: torch.dtype | None = None):
        """The outputs computed by torch functions (differentiable) from the inputs and the
        parameters' current values, in the inputs' float dtype (float64 for gradcheck)."""
        outs = self.evaluate([*xs, *self._param_views], dtype)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def evaluate(self, values, dtype: torch.dtype | None = None) -> list[torch.Tensor]:
        """reference() on explicit values for the inputs followed by the parameters."""
        dtype = dtype or next((x.dtype for x in values if x.is_floating_point()), torch.float32)
        device = values[0].device if values else None
        given = {t: (x.to(dtype) if x.is_floating_point() else x)
                 for t, x in zip([*self.inputs, *self.params], values)}
        return [o.reshape(shape) for o, (shape, _, _) in zip(self.evaluator(given, dtype, device), self.out_meta)]

    def free(self) -> None:
        """Free the plan and the compute memory this function allocated."""
        _FUNCTIONS.pop(self.id, None)
        if self.plan is not None:
            backend_graph_plan_free(self.backend, self.plan)
            self.plan = None
        if self.galloc is not None:
            from ..alloc import gallocr_free
            gallocr_free(self.galloc)
            self.galloc = None
        if self.weight_buffer is not None:
            self.weight_buffer.free()
            self.weight_buffer = None


def graph_function(graph, inputs, outputs, backend_or_sched, params=None, read_weight=None) -> GraphFunction:
    """A torch callable running `graph`: f(*tensors for inputs) -> tensor(s) for outputs.

    The graph is allocated (when its tensors have no memory yet) and compiled into a plan once;
    each call copies the inputs in, computes (CUDA-graph replay on CUDA) and returns copies of
    the outputs. A scheduler is reset and allocates this graph (give each graph function its
    own scheduler). `params`: weights that receive gradients (default: the graph's leafs flagged
    with set_param); `f.parameters()` gives them as zero-copy torch views for an optimizer.
    `read_weight(tensor) -> float values`: for the backward, the values of weights stored in a
    layout other than ggml's (CPU_REPACK), which cannot be read from memory."""
    return GraphFunction(graph, inputs, outputs, backend_or_sched, params, read_weight)


def _lookup(fid: str) -> GraphFunction:
    fn = _FUNCTIONS.get(fid)
    if fn is None:
        raise RuntimeError(f"torchggml::graph_call: graph function {fid} was freed")
    return fn


# ---------------------------------------------------------------- the custom op

@torch.library.custom_op("torchggml::graph_call", mutates_args=())
def graph_call(fid: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Run graph function `fid` on its inputs followed by its trainable parameters."""
    return _lookup(fid).run(inputs)


@graph_call.register_fake
def _graph_call_fake(fid: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.empty(shape, dtype=dtype, device=device) for shape, dtype, device in _lookup(fid).out_meta]


def _setup_context(ctx, inputs, output) -> None:
    fid, xs = inputs
    ctx.function = _lookup(fid)  # alive until the backward ran, even if its owner drops it
    ctx.wants = [x.requires_grad and x.is_floating_point() for x in xs]
    ctx.save_for_backward(*xs)


def _backward(ctx, grads):
    """Recompute the forward with torch functions and differentiate it (evaluate.py says why)."""
    fn = ctx.function
    xs = ctx.saved_tensors
    with torch.enable_grad():
        leaves = [x.detach().requires_grad_(w) for x, w in zip(xs, ctx.wants)]
        outs = fn.evaluate(leaves, dtype=torch.float32)
        wanted = [x for x, w in zip(leaves, ctx.wants) if w]
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
        got = iter(torch.autograd.grad([o for o, _ in pairs], wanted, [g.to(o.dtype) for o, g in pairs],
                                       allow_unused=True) if pairs and wanted else [None] * len(wanted))
    result = [next(got) if w else None for w in ctx.wants]
    return None, [g.to(x.dtype) if g is not None else None for g, x in zip(result, xs)]


torch.library.register_autograd("torchggml::graph_call", _backward, setup_context=_setup_context)
