"""ggml graphs inside PyTorch programs: graph_function (a custom op with autograd), the
differentiable evaluator behind its backward."""
from .evaluate import GraphEvaluator, differentiable_ops
from .function import GraphFunction, graph_function

__all__ = ["GraphEvaluator", "GraphFunction", "graph_function", "differentiable_ops"]
