"""Triton kernels for ggml's quantized weights, on raw GGUF block rows (no repacked copy).

    dequantize(qtype, blocks, dtype=torch.float16)        uint8 [R, row_bytes] -> [R, n_cols]
    get_rows(qtype, blocks, ids, dtype=torch.float32)     rows ids, decoded -> [len(ids), n_cols]
    mul_mat(qtype, blocks, x, out=None)                   x[M, K] @ dequant(blocks).T -> f32 [M, N]
    mul_mat_id(qtype, blocks, x, ids, out=None)           ggml MUL_MAT_ID over experts
    assert_ids_async(name, ids, limit)                    range check on the device, no host sync
    supports(qtype), SUPPORTED_TYPES, runs_on(torch_device)

`qtype` is a torchggml.Type or its int id. Tensors are CUDA tensors, or CPU tensors when
TRITON_INTERPRET=1 was set before triton was first imported.
"""
from ._common import SUPPORTED_TYPES, runs_on, supports
from .dequant import assert_ids_async, dequantize, get_rows
from .matmul import mul_mat, mul_mat_id

__all__ = ["SUPPORTED_TYPES", "runs_on", "supports", "assert_ids_async", "dequantize", "get_rows", "mul_mat",
           "mul_mat_id"]
