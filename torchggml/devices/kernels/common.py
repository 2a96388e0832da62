"""Helpers every kernel family uses: torch views of sources and writing results."""
from __future__ import annotations

import functools

import torch

from ...tensor import Tensor
from ...types import Type, type_traits
from ...storage import tensor_view

FLOAT_TYPES = frozenset({Type.F32, Type.F16, Type.BF16})


def view(t: Tensor) -> torch.Tensor:
    """The 4-D torch view [ne3, ne2, ne1, ne0] (raw uint8 blocks for block types)."""
    return tensor_view(t)


def as_float(t: Tensor, dtype=torch.float32) -> torch.Tensor:
    """The tensor's values as a 4-D float tensor; block types are dequantized."""
    v = tensor_view(t)
    if type_traits(t.type).is_quantized:
        from ...quants import dequantize
        return dequantize(t.type, v).to(dtype)
    return v.to(dtype)


def write(node: Tensor, value: torch.Tensor) -> None:
    """Store `value` (broadcastable to the node's torch shape) into the node's memory,
    converting to its type (quantizing for block types)."""
    dst = tensor_view(node)
    if type_traits(node.type).is_quantized:
        from ...quants import quantize
        value = value.expand(tuple(reversed(node.ne))).float().contiguous()
        dst.copy_(quantize(node.type, value))
    else:
        dst.copy_(value)


@functools.lru_cache(maxsize=None)
def _capture_query(device_type: str):
    module = getattr(torch, device_type, None)
    return getattr(module, "is_current_stream_capturing", None)


def device_graph_capturing(t: torch.Tensor) -> bool:
    """A device graph is being captured on t's device (its torch module says so): no host
    syncs allowed."""
    query = _capture_query(t.device.type)
    return query is not None and bool(query())


def is_float(t: Tensor | None) -> bool:
    return t is not None and t.type in FLOAT_TYPES


def all_float(node: Tensor, n_src: int) -> bool:
    """The node and its first n_src sources are F32/F16/BF16."""
    return is_float(node) and all(is_float(node.src[i]) for i in range(n_src))
