"""Host cost of one llama-shaped decode step on the CPU backend.

A 32-layer llama graph at dim 256 (GQA, F16 KV cache written with set_rows, RoPE, attention by
mul_mat + soft_max or by flash_attn_ext, SwiGLU FFN, output head) is allocated once with
gallocr; each step writes new inputs (token, position, cache cell, mask) and computes it,
through backend_graph_compute (compile + run) and through a graph plan (the bound calls only).
The per-op torch calls are the same in both; the difference is binding and dispatch.

Prints, per variant, the median, the [p10, p90] range and the mean over many repeats (the
machine is shared and noisy), in ms per step, and the median per node; --by-op adds the plan's
time per op.

    python scripts/bench_step.py [--layers 32] [--dim 256] [--tokens 1] [--n-kv 64]
                                 [--wtype F32] [--repeats 200] [--threads 1] [--by-op]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torchggml as ggml  # noqa: E402
from torchggml.test_ops.runner import fill_input  # noqa: E402

T = ggml.Type


def make_weights(backend, n_layers, dim, ffn, n_head_kv, head_dim, n_vocab, wtype):
    """Embeddings, per-layer weights and the head in one WEIGHTS buffer, random values."""
    ctx = ggml.init(no_alloc=True)
    kv_dim = n_head_kv * head_dim
    mat = lambda k, n: ggml.new_tensor_2d(ctx, wtype, k, n)  # noqa: E731
    model = {"tok_embd": mat(dim, n_vocab), "output_norm": ggml.new_tensor_1d(ctx, T.F32, dim),
             "output": mat(dim, n_vocab), "layers": []}
    for _ in range(n_layers):
        model["layers"].append({
            "attn_norm": ggml.new_tensor_1d(ctx, T.F32, dim), "ffn_norm": ggml.new_tensor_1d(ctx, T.F32, dim),
            "wq": mat(dim, dim), "wk": mat(dim, kv_dim), "wv": mat(dim, kv_dim), "wo": mat(dim, dim),
            "gate": mat(dim, ffn), "up": mat(dim, ffn), "down": mat(ffn, dim),
        })
    buf = ggml.backend_alloc_ctx_tensors(ctx, backend)
    ggml.backend_buffer_set_usage(buf, ggml.BufferUsage.WEIGHTS)
    gen = torch.Generator().manual_seed(0)
    tensors = [model["tok_embd"], model["output_norm"], model["output"]]
    tensors += [t for layer in model["layers"] for t in layer.values()]
    for t in tensors:
        values = (torch.rand(tuple(reversed(t.ne[:2])), generator=gen) - 0.5) * 0.2
        fill_input(t, values)
    return ctx, buf, model


def make_cache(backend, n_layers, n_ctx, kv_dim):
    ctx = ggml.init(no_alloc=True)
    k = [ggml.new_tensor_2d(ctx, T.F16, kv_dim, n_ctx) for _ in range(n_layers)]
    v = [ggml.new_tensor_2d(ctx, T.F16, kv_dim, n_ctx) for _ in range(n_layers)]
    buf = ggml.backend_alloc_ctx_tensors(ctx, backend)
    ggml.backend_buffer_clear(buf, 0)
    return ctx, buf, k, v


def build_step(model, cache_k, cache_v, args, flash: bool):
    """The llama graph of torchggml/models/archs/llama.py, for n_tokens tokens over n_kv cells."""
    dim, n_head, n_head_kv, n_tokens, n_kv = args.dim, args.heads, args.kv_heads, args.tokens, args.n_kv
    hd = dim // n_head
    ctx = ggml.init(no_alloc=True)

    def new_input(type, *ne):
        t = ggml.new_tensor(ctx, type, list(ne))
        ggml.set_input(t)
        return t
    tokens, pos = new_input(T.I32, n_tokens), new_input(T.I32, n_tokens)
    kv_idx, mask = new_input(T.I64, n_tokens), new_input(T.F16, n_kv, n_tokens)

    def rms_norm(x, w):
        return ggml.mul(ctx, ggml.rms_norm(ctx, x, 1e-5), w)

    def rope(x):
        return ggml.rope_ext(ctx, x, pos, None, hd, 0, 4096, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)

    def cells(cache, rows):
        written = ggml.set_rows(ctx, cache, rows, kv_idx)
        return ggml.view_3d(ctx, written, hd, n_kv, n_head_kv, written.nb[1], ggml.row_size(T.F16, hd), 0)

    def attention(il, q, k, v):
        k_cells = cells(cache_k[il], ggml.reshape_2d(ctx, k, hd * n_head_kv, n_tokens))
        v_cells = cells(cache_v[il], ggml.reshape_2d(ctx, v, hd * n_head_kv, n_tokens))
        q = ggml.permute(ctx, q, 0, 2, 1, 3)
        if flash:
            out = ggml.flash_attn_ext(ctx, q, k_cells, v_cells, mask, hd ** -0.5, 0.0, 0.0)
            return ggml.reshape_2d(ctx, out, dim, n_tokens)
        kq = ggml.soft_max_ext(ctx, ggml.mul_mat(ctx, k_cells, q), mask, hd ** -0.5, 0.0)
        v_t = ggml.cont(ctx, ggml.permute(ctx, v_cells, 1, 0, 2, 3))
        out = ggml.permute(ctx, ggml.mul_mat(ctx, v_t, kq), 0, 2, 1, 3)
        return ggml.cont_2d(ctx, out, dim, n_tokens)

    x = ggml.get_rows(ctx, model["tok_embd"], tokens)
    for il, w in enumerate(model["layers"]):
        h = rms_norm(x, w["attn_norm"])
        q = rope(ggml.reshape_3d(ctx, ggml.mul_mat(ctx, w["wq"], h), hd, n_head, n_tokens))
        k = rope(ggml.reshape_3d(ctx, ggml.mul_mat(ctx, w["wk"], h), hd, n_head_kv, n_tokens))
        v = ggml.reshape_3d(ctx, ggml.mul_mat(ctx, w["wv"], h), hd, n_head_kv, n_tokens)
        x = ggml.add(ctx, x, ggml.mul_mat(ctx, w["wo"], attention(il, q, k, v)))
        h = rms_norm(x, w["ffn_norm"])
        h = ggml.swiglu_split(ctx, ggml.mul_mat(ctx, w["gate"], h), ggml.mul_mat(ctx, w["up"], h))
        x = ggml.add(ctx, x, ggml.mul_mat(ctx, w["down"], h))
    logits = ggml.mul_mat(ctx, model["output"], rms_norm(x, model["output_norm"]))
    ggml.set_output(logits)
    graph = ggml.new_graph_custom(ctx, 16384)
    ggml.build_forward_expand(graph, logits)
    return ctx, graph, (tokens, pos, kv_idx, mask), logits


def set_step_inputs(inputs, step: int, args) -> None:
    """Token, positions and cells of step `step`; the mask lets each token see cells <= its own."""
    tokens, pos, kv_idx, mask = inputs
    n_tokens, n_kv = args.tokens, args.n_kv
    first = step % (n_kv - n_tokens + 1)
    cells = torch.arange(first, first + n_tokens)
    ggml.backend_tensor_set(tokens, (cells * 7919 % args.vocab).to(torch.int32))
    ggml.backend_tensor_set(pos, cells.to(torch.int32))
    ggml.backend_tensor_set(kv_idx, cells.to(torch.int64))
    visible = torch.arange(n_kv)[None, :] <= cells[:, None]
    ggml.backend_tensor_set(mask, torch.where(visible, 0.0, float("-inf")).to(torch.float16))


def timed_ms(fn, repeats: int, setup=None) -> list[float]:
    """Wall times of fn() in ms; setup() runs before each, untimed."""
    times = []
    for _ in range(repeats):
        if setup is not None:
            setup()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def by_op_us(plan, repeats: int, setup) -> dict[str, float]:
    """Median µs per step spent in each op's calls of a compiled plan (CPU: calls are synchronous)."""
    samples: dict[str, list[float]] = {}
    for _ in range(repeats):
        setup()
        totals: dict[str, float] = {}
        for fn, node in plan.calls:
            t0 = time.perf_counter()
            fn(node)
            totals[node.op.name] = totals.get(node.op.name, 0.0) + (time.perf_counter() - t0) * 1e6
        for op, us in totals.items():
            samples.setdefault(op, []).append(us)
    return {op: statistics.median(v) for op, v in samples.items()}


def summary(times: list[float], n_nodes: int) -> str:
    """median [p10, p90] ms, the mean (which shows rare stalls such as Python's full garbage
    collections), and the median per node."""
    q = statistics.quantiles(times, n=10)
    med = statistics.median(times)
    return (f"{med:8.2f} [{q[0]:7.2f}, {q[-1]:7.2f}] ms  mean {statistics.mean(times):7.2f} ms  "
            f"{med * 1e3 / n_nodes:6.1f} µs/node")


def bench_variant(backend, model, cache, args, flash: bool):
    _, graph, inputs, _ = build_step(model, *cache, args, flash)
    galloc = ggml.gallocr_new(ggml.backend_cpu_buffer_type())
    assert ggml.gallocr_alloc_graph(galloc, graph)
    n_nodes = ggml.graph_n_nodes(graph)
    step = iter(range(1 << 30))

    def next_inputs():
        set_step_inputs(inputs, next(step), args)

    plan = ggml.backend_graph_plan_create(backend, graph)
    compute = lambda: ggml.backend_graph_compute(backend, graph)  # noqa: E731
    plan_compute = lambda: ggml.backend_graph_plan_compute(backend, plan)  # noqa: E731
    timed_ms(compute, 2, next_inputs), timed_ms(plan_compute, 2, next_inputs)  # warm up
    # interleave the two so that machine noise hits both alike
    t_compute, t_plan = [], []
    for _ in range(max(1, args.repeats // 10)):
        t_compute += timed_ms(compute, 10, next_inputs)
        t_plan += timed_ms(plan_compute, 10, next_inputs)
    t_create = timed_ms(lambda: ggml.backend_graph_plan_free(backend, ggml.backend_graph_plan_create(backend, graph)),
                        max(10, args.repeats // 10))
    ops = by_op_us(plan, max(5, args.repeats // 10), next_inputs) if args.by_op else {}
    n_of: dict[str, int] = {}
    for _, node in plan.calls:
        n_of[node.op.name] = n_of.get(node.op.name, 0) + 1
    ggml.backend_graph_plan_free(backend, plan)
    label = "flash_attn_ext" if flash else "mul_mat+soft_max"
    print(f"attention: {label}, {n_nodes} nodes")
    print(f"  {'backend_graph_compute':<28}{summary(t_compute, n_nodes)}")
    print(f"  {'backend_graph_plan_compute':<28}{summary(t_plan, n_nodes)}")
    print(f"  {'backend_graph_plan_create':<28}{summary(t_create, n_nodes)}")
    if ops:
        print("  plan calls by op (median µs per step, µs per call):")
        for op, us in sorted(ops.items(), key=lambda kv: -kv[1]):
            print(f"    {op:<16}{n_of[op]:5d} calls {us:9.0f} µs {us / n_of[op]:7.1f} µs/call")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=704)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--n-kv", type=int, default=64, help="cache cells attended to (the graph's KV length)")
    ap.add_argument("--wtype", default="F32", help="weight type: F32, F16, BF16, Q8_0, Q4_0, ...")
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--by-op", action="store_true", help="also time the plan's calls op by op")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (small products gain nothing from more; on a loaded machine "
                         "OpenMP's barrier waits cost milliseconds per call)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.tokens > args.n_kv:
        ap.error("--tokens must not exceed --n-kv")

    backend = ggml.backend_cpu_init()
    hd = args.dim // args.heads
    _, _, model = make_weights(backend, args.layers, args.dim, args.ffn, args.kv_heads, hd, args.vocab,
                               T[args.wtype])
    cache_ctx, cache_buf, *cache = make_cache(backend, args.layers, args.n_kv, args.kv_heads * hd)
    print(f"llama step: {args.layers} layers, dim {args.dim}, {args.heads}/{args.kv_heads} heads, ffn {args.ffn}, "
          f"{args.tokens} token(s) over {args.n_kv} cells, {args.wtype} weights, F16 KV cache; CPU backend, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads; median [p10, p90] of {args.repeats}")
    for flash in (False, True):
        bench_variant(backend, model, cache, args, flash)


if __name__ == "__main__":
    main()
