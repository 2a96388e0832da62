"""A constructed speculative-decoding target: a real model made many times deeper with layers that
change nothing, so that its predictions stay the real model's while each step costs many times
its draft's.

    python scripts/make_deep_target.py SOURCE.gguf OUT.gguf [--copies 3] [--type F16|F32]

After each of SOURCE's layers come --copies copies of it whose attention output and FFN down
projections are zero: each such layer adds exactly 0 to the residual stream, so the output is
SOURCE's exactly (x + 0 = x; the products of the copies are computed all the same, their
weights are real ones, read from memory as a real layer's are). --type F32 stores the F16
matrices (the embedding too) in F32: a larger, slower target whose batched rows go through f32
GEMMs, not torch's half GEMM. It is
NOT a trained deeper model: a benchmark device for scripts/bench_speculative.py, where the only
same-vocabulary draft at hand is the target's own model in another type.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from torchggml.gguf.writer.rewrite import header_parts, serialize  # noqa: E402
from torchggml.types import Type, type_traits  # noqa: E402

ZEROED = ("attn_output.weight", "ffn_down.weight")  # a copy's contributions to the residual stream


def nbytes(ne, type_id: int) -> int:
    t = type_traits(Type(type_id))
    return int(np.prod(ne)) // t.blck_size * t.type_size


def deepen(source: str, out: str, copies: int, as_f32: bool = False) -> int:
    """Write OUT from SOURCE with `copies` zero-output copies after each layer; its layer count."""
    kvs, tensors, alignment, data = header_parts(source)
    arch = next(v for k, _, v in kvs if k == "general.architecture")
    count_kv = next(kv for kv in kvs if kv[0] == f"{arch}.block_count")
    n_layer = count_kv[2]
    count_kv[2] = n_layer * (1 + copies)
    by_layer: dict[int, list] = {}
    table, pieces, offset = [], [], 0

    def add(name, ne, type_id, raw: bytes):
        nonlocal offset
        table.append([name, ne, type_id, offset])
        pieces.append(raw + bytes(-len(raw) % alignment))
        offset += len(pieces[-1])

    def stored(ne, type_id, off) -> tuple[bytes, int]:
        raw = data[off:off + nbytes(ne, type_id)]
        if as_f32 and type_id == Type.F16 and len(ne) == 2:
            return np.frombuffer(raw, dtype="<f2").astype("<f4").tobytes(), int(Type.F32)
        return raw, type_id

    for name, ne, type_id, off in tensors:
        if name.startswith("blk."):
            by_layer.setdefault(int(name.split(".")[1]), []).append((name.split(".", 2)[2], ne, type_id, off))
        else:
            raw, type_id = stored(ne, type_id, off)
            add(name, ne, type_id, raw)
    for i in range(n_layer):
        for c in range(1 + copies):
            j = i * (1 + copies) + c
            for suffix, ne, type_id, off in by_layer[i]:
                raw, type_id = stored(ne, type_id, off)
                if c and suffix in ZEROED:
                    raw = bytes(len(raw))
                add(f"blk.{j}.{suffix}", ne, type_id, raw)
    with open(out, "wb") as f:
        f.write(serialize(kvs, table, alignment, b""))
        for p in pieces:
            f.write(p)
    return count_kv[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source")
    ap.add_argument("out")
    ap.add_argument("--copies", type=int, default=3, help="zero-output copies after each layer")
    ap.add_argument("--type", choices=["F16", "F32"], default="F16", help="the layers' matrices' type")
    args = ap.parse_args()
    n = deepen(args.source, args.out, args.copies, args.type == "F32")
    print(f"{args.out}: {n} layers, {os.path.getsize(args.out) / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
