"""Zero-copy torch interop: to_torch (a view of a tensor's memory) and from_torch."""
from __future__ import annotations

import warnings

import torch

from .tensor import Tensor, n_dims, set_name
from .types import dtype_to_type, type_traits


def to_torch(t: Tensor, raw: bool = False) -> torch.Tensor:
    """A zero-copy torch view of the tensor's memory on its device: shape reversed(ne) (trailing
    unit ggml dims dropped), strides from nb. Block types need raw=True (uint8 blocks per row)."""
    from .storage import tensor_view
    if type_traits(t.type).is_quantized and not raw:
        raise TypeError(f"to_torch: {t.describe()} is a block type; pass raw=True for its uint8 blocks "
                        f"or dequantize with torchggml.quants.dequantize")
    view = tensor_view(t)
    n = n_dims(t)
    return view[(0,) * (4 - n)] if n < 4 else view


def from_torch(ctx, x: torch.Tensor, name: str | None = None) -> Tensor:
    """A ggml tensor whose memory is x's storage (no copy). x's dims map to ne reversed; its
    strides become nb, so non-contiguous views work as permuted ggml tensors."""
    from .devices import buffer_type_for_torch_device
    from .storage import buffer_from_torch
    if x.dim() > 4:
        raise ValueError(f"from_torch: ggml tensors have at most 4 dims, got shape {tuple(x.shape)}")
    if x.requires_grad:
        warnings.warn("from_torch: the ggml tensor shares the memory of a tensor that requires grad, but "
                      "gradients do not flow through it; use ggml.graph_function for a differentiable graph",
                      UserWarning, stacklevel=2)
    type = dtype_to_type(x.dtype)
    es = x.element_size()
    ne = list(reversed(x.shape)) or [1]
    nb = [s * es for s in reversed(x.stride())] or [es]
    ne += [1] * (4 - len(ne))
    for i in range(len(nb), 4):
        nb.append(nb[i - 1] * ne[i - 1])
    t = Tensor(ctx, type, ne, nb)
    ctx.tensors.append(t)
    # the buffer spans the whole storage so every view of it shares one buffer
    storage = x.untyped_storage()
    whole = torch.empty(0, dtype=torch.uint8, device=x.device).set_(storage, 0, (storage.nbytes(),), (1,))
    t.buffer = buffer_from_torch(buffer_type_for_torch_device(x.device), whole, owner=x)
    t.data = x.data_ptr()
    if name:
        set_name(t, name)
    return t

