"""What every CPU weight layout shares: the CPU_REPACK buffer type (upstream's
ggml_backend_cpu_repack_buffer_type), an `ExtraBufferType` whose buffers take whole weights and
convert them as they are written, and the checks that nothing else reads them.

A layout is a subclass naming its `buffer_class` (whose `set_tensor` converts ggml blocks) and
implementing the ExtraBufferType members: `supports_weight` / `supports_tensor` (which weights),
`get_alloc_size` (its bytes), `bind_product` (MUL_MAT; `bind_rows_product` for a decode step's
fixed rows, optional) and, where it serves MUL_MAT_ID's experts,
`bind_expert_product`. The bytes are not ggml's: the buffer type is not host memory, reads and
memsets raise, and the CPU device runs no op on a repacked tensor but those its buffer type's
`reads_as_weight` accepts (`reads_repacked_only_as_weight`, `check_repacked_reads`).
"""
from __future__ import annotations

import torch

from ....backend.impl import ExtraBufferType
from ....enums import Op, VIEW_OPS
from ....storage import TorchBuffer, TorchBufferType
from ....tensor import Tensor, memory_buffer, nbytes
from ....types import Type, type_traits
from ...kernels.table import UnsupportedOpError


class RepackedTensorError(RuntimeError):
    """A repacked tensor was read or written as if it held ggml blocks."""


def is_whole_contiguous(t: Tensor) -> bool:
    """t is not a view and its rows are contiguous ggml blocks (what a repack reads whole)."""
    tr = type_traits(t.type)
    contiguous = t.nb[0] == tr.type_size and t.nb[1] == t.ne[0] // tr.blck_size * tr.type_size
    return t.view_src is None and contiguous


def is_repacked(t: Tensor | None) -> bool:
    """t (or the tensor it views) lives in an extra buffer type's layout."""
    buffer = memory_buffer(t) if t is not None else None
    return buffer is not None and isinstance(buffer.buft, ExtraBufferType)


class RepackBufferType(TorchBufferType, ExtraBufferType):
    """CPU memory holding weights in one layout of the CPU's products (not ggml's: not host)."""

    def __init__(self, device):
        super().__init__("CPU_REPACK", device, "cpu", host=False, alignment=64, huge_pages=True)

    def get_alloc_size(self, tensor: Tensor) -> int:
        return self.layout_nbytes(tensor) if self.supports_tensor(tensor) else nbytes(tensor)

    def layout_nbytes(self, t: Tensor) -> int:
        """The bytes t takes in this layout."""
        raise NotImplementedError

    def supports_tensor(self, t: Tensor) -> bool:
        return is_whole_contiguous(t) and self.supports_weight(t.type, t.ne)

    def bind_rows_product(self, t: Tensor, rows: torch.Tensor, out: torch.Tensor):
        """A layout's product of 2-D weight t by fixed rows [M, K] into out [M, N], bound as one
        call a native run can hold, or None (bind_product then)."""
        return None

    def reads_as_weight(self, node: Tensor, t: Tensor) -> bool:
        """MUL_MAT of a 2-D weight; MUL_MAT_ID of experts where the layout binds their product."""
        if node.op == Op.MUL_MAT_ID:
            return self.bind_expert_product is not None
        return node.op == Op.MUL_MAT and t.ne[2] == 1 and t.ne[3] == 1


class RepackBuffer(TorchBuffer):
    """A CPU storage whose weights are converted as they are written (whole tensors only);
    `set_tensor` is the layout's."""

    ggml_layout = False

    def check_whole_write(self, tensor: Tensor, offset: int, size: int, what: str) -> None:
        """Raise unless this buffer's type repacks `tensor` and the write covers all of it."""
        if not self.buft.supports_tensor(tensor):
            raise ValueError(f"{self.name}: cannot repack {tensor.describe()}: only {what} can live "
                             f"in this repack buffer")
        if offset != 0 or size != nbytes(tensor):
            raise ValueError(f"{self.name}: {tensor.describe()} must be written whole (offset 0, "
                             f"{nbytes(tensor)} bytes), got {size} bytes at offset {offset}")

    def get_tensor(self, tensor: Tensor, out: torch.Tensor, offset: int, size: int) -> None:
        raise RepackedTensorError(f"{self.name}: {tensor.describe()} is stored repacked for the CPU's "
                                  f"products, not as ggml blocks: its bytes cannot be read back "
                                  f"(load the weight with repack=False to read it)")

    def memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        raise RepackedTensorError(f"{self.name}: cannot memset {tensor.describe()}: repack buffers "
                                  f"only take whole ggml-format weights")

    def cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        return False  # the generic path writes through set_tensor, which repacks


# ---------------------------------------------------------------- what may read repacked tensors

def reads_repacked_only_as_weight(node: Tensor) -> bool:
    """False when the node would read a repacked tensor as ggml data: the only readers allowed
    are those its buffer type's reads_as_weight accepts, with the repacked tensor itself (not a
    view) as src0 and float rows. View ops read nothing."""
    if node.op in VIEW_OPS:
        return True
    for i, src in enumerate(node.src):
        if not is_repacked(src):
            continue
        b, buft = node.src[1], memory_buffer(src).buft
        if not (i == 0 and src.view_src is None and buft.reads_as_weight(node, src)
                and buft.supports_tensor(src)
                and b is not None and b.type in (Type.F32, Type.F16, Type.BF16)):
            return False
    return True


def check_repacked_reads(nodes, device_name: str) -> None:
    """Raise for a node that would read a repacked tensor as ggml data (checked before kernels
    bind their views)."""
    for node in nodes:
        if node.op not in VIEW_OPS and not reads_repacked_only_as_weight(node):
            srcs = ", ".join(s.describe() for s in node.src if is_repacked(s))
            raise UnsupportedOpError(f"op {node.op.name} on {device_name} cannot read repacked weights "
                                     f"({srcs}) for {node.describe()}: only MUL_MAT with the weight as "
                                     f"src0 can (and MUL_MAT_ID with experts in the fused layout)")
