"""What runs an op on the CPU: the CPU's kernel table, each op's layers in the order they are
tried.

A layer is a bind, fn(node) -> the node's bound call or None where it does not take the node.
When a graph is compiled (plan.compile_graph), each node's layers are tried in order and the
first that takes the node runs it. Every op ends with TORCH, the torch reference kernel
(devices/kernels/), which takes every node its supports() accepts; the CPU table keeps
the reference's supports() for each op, so supports_op answers as the reference does, and ops
not listed here run the reference kernel alone.

    numba    fast_ops.py: one numba call for a small node (decode); TORCHGGML_CPU_FAST_OPS=0
             turns these off
    layout   products.py over layouts/: a weight stored in a CPU_REPACK buffer (an
             ExtraBufferType) multiplies through its layout's product (the `fused` numba
             kernels, or torch's int4 GEMM)
    blocks   products.py: the fused kernels on a 2-D Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K weight's ggml blocks in place,
             where the loader leaves them (nothing repacked)
    torch    products.py's half GEMM, and the reference kernels
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...enums import Op
from ..rpc.shapes import check_node
from ..kernels import TORCH_KERNELS, KernelTable, binds
from . import fast_ops, recurrent
from .products import bind_block_product, bind_half_weight_product, bind_layout_experts, bind_layout_product


def _always() -> bool:
    return True


@dataclass(frozen=True)
class Layer:
    kind: str                          # "numba", "layout", "blocks" or "torch"
    bind: Callable | None              # node -> bound call or None; None for TORCH
    enabled: Callable[[], bool] = _always  # read when a graph is compiled

    def __repr__(self):
        return f"<Layer {self.kind} {self.bind.__name__ if self.bind is not None else 'reference'}>"


def numba(bind) -> Layer:
    return Layer("numba", bind, fast_ops.fast_ops_enabled)


TORCH = Layer("torch", None)   # the op's kernel in TORCH_KERNELS
LAYOUT_PRODUCT = Layer("layout", bind_layout_product)
BLOCK_PRODUCT = Layer("blocks", bind_block_product)
HALF_GEMM = Layer("torch", bind_half_weight_product)

LAYERS = {
    Op.MUL_MAT: (numba(fast_ops.bind_half_products), LAYOUT_PRODUCT, BLOCK_PRODUCT, HALF_GEMM, TORCH),
    Op.MUL_MAT_ID: (Layer("layout", bind_layout_experts), TORCH),
    Op.GET_ROWS: (numba(fast_ops.bind_get_block_rows), TORCH),
    Op.NORM: (numba(fast_ops.bind_row_norm), TORCH),
    Op.RMS_NORM: (numba(fast_ops.bind_row_norm), TORCH),
    Op.SOFT_MAX: (numba(fast_ops.bind_soft_max), TORCH),
    Op.ROPE: (numba(fast_ops.bind_rope), TORCH),
    Op.SET_ROWS: (numba(fast_ops.bind_set_rows), TORCH),
    Op.CONT: (numba(fast_ops.bind_copy), TORCH),
    Op.CPY: (numba(fast_ops.bind_copy), TORCH),
    Op.DUP: (numba(fast_ops.bind_copy), TORCH),
    Op.GLU: (numba(fast_ops.bind_glu), TORCH),
    Op.ADD: (numba(fast_ops.bind_binary), TORCH),
    Op.SUB: (numba(fast_ops.bind_binary), TORCH),
    Op.MUL: (numba(fast_ops.bind_binary), TORCH),
    Op.DIV: (numba(fast_ops.bind_binary), TORCH),
    Op.SCALE: (numba(fast_ops.bind_scale), TORCH),
}


# the recurrent ops' scans (recurrent.py)
LAYERS.update({Op.SSM_SCAN: (numba(recurrent.bind_ssm_scan), TORCH), Op.RWKV_WKV6: (numba(recurrent.bind_wkv6), TORCH),
               Op.RWKV_WKV7: (numba(recurrent.bind_wkv7), TORCH),
               Op.GATED_DELTA_NET: (numba(recurrent.bind_gated_delta_net), TORCH)})


def bind_layers(op: Op, layers, node):
    """The node's call from the first of `layers` that takes it (TORCH: the reference kernel,
    bound where it binds). A node whose shape breaks ggml's rules for its sources goes to the
    reference kernel: the others index the sources by the node's shape, unchecked."""
    well_formed = None
    for layer in layers:
        if layer is TORCH:
            reference = TORCH_KERNELS.entries[op][0]
            binder = getattr(reference, "bind", None)
            return (binder(node) if binder is not None else None) or reference
        if well_formed is None:
            well_formed = check_node(node) is None
        if well_formed and layer.enabled():
            call = layer.bind(node)
            if call is not None:
                return call
    raise AssertionError(f"CPU kernel table: the layers of {op.name} end without TORCH")


def _layered_kernel(op: Op, layers):
    @binds(lambda node: bind_layers(op, layers, node))
    def kernel(node):
        bind_layers(op, layers, node)(node)
    kernel.layers = layers
    kernel.__name__ = kernel.__qualname__ = f"cpu_{op.name.lower()}"
    return kernel


CPU_KERNELS = KernelTable("CPU", over=TORCH_KERNELS)
for _op, _layers in LAYERS.items():
    CPU_KERNELS.register(_op, supports=TORCH_KERNELS.entries[_op][1])(_layered_kernel(_op, _layers))
