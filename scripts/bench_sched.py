"""Scheduler host overhead on a 32-layer llama-shaped graph.

Measures, per placement (CPU only; half the layers on SIM0; and on CUDA when present):
  - split: backend_sched_split_graph on a fresh graph (ms),
  - alloc: backend_sched_alloc_graph (split + gallocr) in steady state (ms),
  - build: building the graph itself in Python (ms),
  - step : a whole decode step (build + alloc + compute + read logits), n_tokens = 1 (ms),
and the pipelining throughput of two backends vs one on a GPU when one is present.

    python scripts/bench_sched.py [--layers 32] [--dim 256] [--reps 20]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TORCHGGML_SIM_DEVICES", "1")

import torch  # noqa: E402

import torchggml as ggml  # noqa: E402

T = ggml.Type


def make_layer_weights(backend, n_layers, dim, ffn, n_kv, head_dim, seed):
    """Per-layer weights in one WEIGHTS buffer of backend's device."""
    ctx = ggml.init(no_alloc=True)
    layers = []
    for il in range(n_layers):
        w = {
            "attn_norm": ggml.new_tensor_1d(ctx, T.F32, dim),
            "wq": ggml.new_tensor_2d(ctx, T.F32, dim, dim),
            "wk": ggml.new_tensor_2d(ctx, T.F32, dim, n_kv * head_dim),
            "wv": ggml.new_tensor_2d(ctx, T.F32, dim, n_kv * head_dim),
            "wo": ggml.new_tensor_2d(ctx, T.F32, dim, dim),
            "ffn_norm": ggml.new_tensor_1d(ctx, T.F32, dim),
            "gate": ggml.new_tensor_2d(ctx, T.F32, dim, ffn),
            "up": ggml.new_tensor_2d(ctx, T.F32, dim, ffn),
            "down": ggml.new_tensor_2d(ctx, T.F32, ffn, dim),
        }
        for k, t in w.items():
            ggml.set_name(t, f"blk.{il}.{k}")
        layers.append(w)
    buf = ggml.backend_alloc_ctx_tensors(ctx, backend)
    ggml.backend_buffer_set_usage(buf, ggml.BufferUsage.WEIGHTS)
    g = torch.Generator().manual_seed(seed)
    for w in layers:
        for t in w.values():
            ggml.backend_tensor_set(t, (torch.rand(ggml.nelements(t), generator=g) - 0.5) * 0.1)
    return ctx, buf, layers


def build_graph(layers, dim, n_head, n_kv, head_dim, n_tokens):
    """A llama block stack: rms_norm, q/k/v, rope, attention over the batch, o, swiglu FFN."""
    ctx = ggml.init(no_alloc=True)
    x = ggml.new_tensor_2d(ctx, T.F32, dim, n_tokens)
    ggml.set_name(x, "inp_embd")
    ggml.set_input(x)
    pos = ggml.new_tensor_1d(ctx, T.I32, n_tokens)
    ggml.set_name(pos, "inp_pos")
    ggml.set_input(pos)
    mask = ggml.new_tensor_2d(ctx, T.F32, n_tokens, n_tokens)
    ggml.set_name(mask, "kq_mask")
    ggml.set_input(mask)
    h = x
    for w in layers:
        cur = ggml.mul(ctx, ggml.rms_norm(ctx, h, 1e-5), w["attn_norm"])
        q = ggml.reshape_3d(ctx, ggml.mul_mat(ctx, w["wq"], cur), head_dim, n_head, n_tokens)
        k = ggml.reshape_3d(ctx, ggml.mul_mat(ctx, w["wk"], cur), head_dim, n_kv, n_tokens)
        v = ggml.reshape_3d(ctx, ggml.mul_mat(ctx, w["wv"], cur), head_dim, n_kv, n_tokens)
        q = ggml.rope_ext(ctx, q, pos, None, head_dim, 0, 4096, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
        k = ggml.rope_ext(ctx, k, pos, None, head_dim, 0, 4096, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
        q = ggml.permute(ctx, q, 0, 2, 1, 3)
        k = ggml.permute(ctx, k, 0, 2, 1, 3)
        kq = ggml.soft_max_ext(ctx, ggml.mul_mat(ctx, k, q), mask, head_dim ** -0.5, 0.0)
        vt = ggml.cont(ctx, ggml.permute(ctx, v, 1, 2, 0, 3))
        kqv = ggml.permute(ctx, ggml.mul_mat(ctx, vt, kq), 0, 2, 1, 3)
        attn = ggml.cont_2d(ctx, kqv, dim, n_tokens)
        h = ggml.add(ctx, h, ggml.mul_mat(ctx, w["wo"], attn))
        cur = ggml.mul(ctx, ggml.rms_norm(ctx, h, 1e-5), w["ffn_norm"])
        ffn = ggml.swiglu_split(ctx, ggml.mul_mat(ctx, w["gate"], cur), ggml.mul_mat(ctx, w["up"], cur))
        h = ggml.add(ctx, h, ggml.mul_mat(ctx, w["down"], ffn))
    ggml.set_output(h)
    graph = ggml.new_graph_custom(ctx, 8192)
    ggml.build_forward_expand(graph, h)
    return ctx, graph, x, pos, mask, h


def median_ms(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def bench_placement(label, backends, layers, args, n_tokens=1):
    sched = ggml.backend_sched_new(backends, graph_size=8192)
    dims = (args.dim, args.heads, args.kv_heads, args.dim // args.heads)
    _, g0, *_ = build_graph(layers, *dims, n_tokens=max(n_tokens, 8))
    ggml.backend_sched_reserve(sched, g0)

    def build():
        return build_graph(layers, *dims, n_tokens=n_tokens)

    def split_only():
        _, g, *_ = build()
        ggml.backend_sched_split_graph(sched, g)
        ggml.backend_sched_reset(sched)

    def alloc_only():
        _, g, *_ = build()
        ggml.backend_sched_alloc_graph(sched, g)
        ggml.backend_sched_reset(sched)

    def step():
        _, g, x, pos, mask, out = build()
        ggml.backend_sched_alloc_graph(sched, g)
        ggml.backend_tensor_set(x, torch.rand(n_tokens, args.dim))
        ggml.backend_tensor_set(pos, torch.arange(n_tokens, dtype=torch.int32))
        ggml.backend_tensor_set(mask, torch.zeros(n_tokens, n_tokens))
        ggml.backend_sched_graph_compute(sched, g)
        ggml.backend_tensor_get(out)
        ggml.backend_sched_reset(sched)

    step()  # warm up
    n_nodes = ggml.graph_n_nodes(build()[1])
    t_build = median_ms(build, args.reps)
    t_split = median_ms(split_only, args.reps) - t_build
    t_alloc = median_ms(alloc_only, args.reps) - t_build
    t_step = median_ms(step, args.reps)
    splits = ggml.backend_sched_get_n_splits(sched)
    print(f"| {label:<28} | {n_nodes:5d} | {splits:6d} | {t_build:8.2f} | {t_split:8.2f} | {t_alloc:8.2f} "
          f"| {t_step:8.2f} | {t_step * 1e6 / n_nodes:8.0f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=512)
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args()
    hd = args.dim // args.heads
    cpu = ggml.backend_cpu_init()
    print(f"llama-shaped graph: {args.layers} layers, dim {args.dim}, {args.heads} heads "
          f"({args.kv_heads} KV), FFN {args.ffn}; decode step (1 token); medians of {args.reps}")
    print("| placement                    | nodes | splits | build ms | split ms | alloc ms | step ms  | ns/node  |")
    print("|------------------------------|-------|--------|----------|----------|----------|----------|----------|")
    _, _, cpu_layers = make_layer_weights(cpu, args.layers, args.dim, args.ffn, args.kv_heads, hd, 0)
    bench_placement("CPU", [cpu], cpu_layers, args)
    sim_dev = ggml.backend_dev_by_name("SIM0")
    if sim_dev is not None:
        sim = ggml.backend_dev_init(sim_dev)
        half = args.layers // 2
        _, _, sim_layers = make_layer_weights(sim, half, args.dim, args.ffn, args.kv_heads, hd, 1)
        _, _, rest = make_layer_weights(cpu, args.layers - half, args.dim, args.ffn, args.kv_heads, hd, 2)
        bench_placement("SIM0 (all layers)", [sim, cpu],
                        make_layer_weights(sim, args.layers, args.dim, args.ffn, args.kv_heads, hd, 3)[2], args)
        bench_placement("SIM0 half + CPU half", [sim, cpu], sim_layers + rest, args)
    if torch.cuda.is_available():
        gpu = ggml.backend_init_by_name("CUDA0")
        bench_placement("CUDA0 (all layers)", [gpu, cpu],
                        make_layer_weights(gpu, args.layers, args.dim, args.ffn, args.kv_heads, hd, 4)[2], args)
    else:
        print("\nno CUDA device: two-backend GPU pipelining throughput not measured")
    print("\nbuild = Python graph construction; split/alloc = scheduler time beyond build; "
          "step = build + alloc + compute + read-back; ns/node = step / nodes")


if __name__ == "__main__":
    main()
