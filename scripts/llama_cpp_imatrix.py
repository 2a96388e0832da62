#!/usr/bin/env python
"""llama.cpp's importance matrix of a model over a text, through llama-cpp-python (for machines
where llama-imatrix is not built): llama.cpp evaluates the text (its tokenizer, its graph, its
kernels) and the scheduler's eval callback (llama_context_params.cb_eval) hands each MUL_MAT's
activations to the accumulation llama-imatrix does (tools/imatrix/imatrix.cpp's collect_imatrix):
products with a blk.* weight over 16 or more F32 rows, sum of x^2 per input column, a count of rows
per weight. Chunks as llama-imatrix: n_ctx tokens each, the first replaced by BOS where the
vocabulary adds one, each from an empty cache. Written in llama.cpp's imatrix GGUF format (torchggml.tools.imatrix.write_imatrix).

    PYTHONPATH=. python scripts/llama_cpp_imatrix.py MODEL.gguf -f TEXT -o imatrix.gguf [-c 128] [-t 2]
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MAX_DIMS, MAX_SRC, MAX_OP_PARAMS, MAX_NAME = 4, 10, 64, 64
GGML_TYPE_F32 = 0


class GGMLTensor(ctypes.Structure):
    """ggml.h's struct ggml_tensor (the fields read here and the ones before them)."""
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p),
                ("ne", ctypes.c_int64 * MAX_DIMS), ("nb", ctypes.c_size_t * MAX_DIMS),
                ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * (MAX_OP_PARAMS // 4)), ("flags", ctypes.c_int32),
                ("src", ctypes.c_void_p * MAX_SRC),
                ("view_src", ctypes.c_void_p), ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p),
                ("name", ctypes.c_char * MAX_NAME)]


def _weight_name(name: bytes) -> str:
    """llama-imatrix's filter_tensor_name: the part between '#'s, if any."""
    s = name.decode(errors="replace")
    return s.split("#")[1] if "#" in s else s


def collect(model_path: str, text: str, n_ctx: int, threads: int = 2):
    """({weight: [sums float32 [1, n], counts [1]]}, chunks)."""
    import llama_cpp
    import torch
    lib_dir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    base = ctypes.CDLL(next(os.path.join(lib_dir, f) for f in os.listdir(lib_dir) if f.startswith("libggml-base.")))
    base.ggml_op_name.restype, base.ggml_op_name.argtypes = ctypes.c_char_p, [ctypes.c_int]
    op_names = {}
    sums, counts = {}, {}

    def eval_cb(t_ptr, ask, _user):
        t = GGMLTensor.from_address(t_ptr)
        if t.op not in op_names:
            op_names[t.op] = base.ggml_op_name(t.op).decode()
        if op_names[t.op] != "MUL_MAT" or not t.src[0] or not t.src[1]:
            return False if ask else True
        src0, src1 = GGMLTensor.from_address(t.src[0]), GGMLTensor.from_address(t.src[1])
        name = _weight_name(src0.name)
        if ask:
            return bool(src1.ne[1] >= 16 and src1.type == GGML_TYPE_F32 and name.startswith("blk."))
        ne, nb = list(src1.ne), list(src1.nb)
        n_mat = src0.ne[2] * src0.ne[3]
        n_bytes = nb[3] * ne[3]
        raw = np.ctypeslib.as_array((ctypes.c_uint8 * n_bytes).from_address(src1.data))
        x = np.lib.stride_tricks.as_strided(raw.view(np.float32), shape=(ne[3], ne[2], ne[1], ne[0]),
                                            strides=(nb[3], nb[2], nb[1], nb[0]))
        acc = sums.setdefault(name, np.zeros((n_mat, ne[0]), np.float32))
        for i3 in range(ne[3]):
            for i2 in range(ne[2]):
                mat = (i3 % src0.ne[3]) * src0.ne[2] + (i2 % src0.ne[2])
                acc[mat] += (x[i3, i2].astype(np.float32) ** 2).sum(axis=0, dtype=np.float32)
        counts[name] = counts.get(name, 0) + ne[1] * ne[2] * ne[3] // n_mat
        return True

    cb = llama_cpp.ggml_backend_sched_eval_callback(eval_cb)
    # Llama takes no cb_eval: its context is made from llama_context_default_params(), given ours
    low = llama_cpp.llama_cpp
    default = low.llama_context_default_params

    def with_callback():
        params = default()
        params.cb_eval = cb
        return params

    low.llama_context_default_params = with_callback
    try:
        llm = llama_cpp.Llama(model_path=model_path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=threads,
                              logits_all=True, verbose=False)  # as llama-imatrix: every row through every layer
    finally:
        low.llama_context_default_params = default
    # as llama-imatrix: BOS (first in each chunk) only where the vocabulary asks for it
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(llama_cpp.llama_model_get_vocab(llm.model)))
    tokens = llm.tokenize(text.encode(), add_bos=add_bos, special=True)
    n_chunks = len(tokens) // n_ctx
    for c in range(n_chunks):
        chunk = list(tokens[c * n_ctx:(c + 1) * n_ctx])
        if add_bos:
            chunk[0] = llm.token_bos()
        llm.reset()
        llm.eval(chunk)
    llm.close()
    stats = {name: [torch.from_numpy(acc), torch.tensor([counts[name]] * acc.shape[0])] for name, acc in sums.items()}
    return stats, n_chunks


def main(argv=None) -> int:
    from torchggml.tools.imatrix import write_imatrix
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("-f", "--file", required=True)
    ap.add_argument("-o", "--output", default="imatrix-llama.gguf")
    ap.add_argument("-c", "--ctx", type=int, default=512)
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args(argv)
    stats, n_chunks = collect(args.model, open(args.file, encoding="utf-8").read(), args.ctx, args.threads)
    write_imatrix(args.output, stats, [args.file], n_chunks, args.ctx)
    print(f"{args.output}: {len(stats)} entries from {n_chunks} chunks of {args.ctx} tokens (llama.cpp's activations)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
