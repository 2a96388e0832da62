"""Time the recurrent ops at real models' decode shapes (one token per sequence) on a device,
next to the layer's largest projection at Q8_0, so one sees whether a decode step is dominated by
the scan or by the weights.

    PYTHONPATH=. python scripts/bench_recurrent.py [-b CPU] [--seqs 1]
"""
from __future__ import annotations

import argparse

import torch

import torchggml as ggml
from torchggml.test_ops.cases.table import OpCase
from torchggml.test_ops.runner import time_case

T = ggml.Type


def ssm_scan(d_state, head_dim, n_head, n_group, n_seqs, A_per_state):
    def build(ctx):
        s = ggml.new_tensor_4d(ctx, T.F32, d_state, head_dim, n_head, n_seqs)
        x = ggml.new_tensor_4d(ctx, T.F32, head_dim, n_head, 1, n_seqs)
        dt = ggml.new_tensor_3d(ctx, T.F32, n_head, 1, n_seqs)
        A = ggml.new_tensor_2d(ctx, T.F32, d_state if A_per_state else 1, n_head)
        B, C = (ggml.new_tensor_4d(ctx, T.F32, d_state, n_group, 1, n_seqs) for _ in range(2))
        ids = ggml.new_tensor_1d(ctx, T.I32, n_seqs)
        return ggml.ssm_scan(ctx, s, x, dt, A, B, C, ids, 1), [s, x, dt, A, B, C, ids]
    return build


def wkv(op, S, H, n_seqs):
    def build(ctx):
        ts = [ggml.new_tensor_3d(ctx, T.F32, S, H, n_seqs) for _ in range(6)]
        state = ggml.new_tensor_2d(ctx, T.F32, S * S * H, n_seqs)
        if op == "rwkv_wkv7":
            return ggml.rwkv_wkv7(ctx, *ts, state), ts + [state]
        tf = ggml.new_tensor_2d(ctx, T.F32, S, H)
        return ggml.rwkv_wkv6(ctx, ts[0], ts[1], ts[2], tf, ts[3], state), ts[:4] + [tf, state]
    return build


def gdn(S, H, n_seqs):
    def build(ctx):
        q, k, v = (ggml.new_tensor_4d(ctx, T.F32, S, H, 1, n_seqs) for _ in range(3))
        g, beta = (ggml.new_tensor_4d(ctx, T.F32, 1, H, 1, n_seqs) for _ in range(2))
        state = ggml.new_tensor_4d(ctx, T.F32, S, S, H, n_seqs)
        return ggml.gated_delta_net(ctx, q, k, v, g, beta, state, 1), [q, k, v, g, beta, state]
    return build


def ssm_conv(d_conv, channels, n_seqs):
    def build(ctx):
        sx = ggml.new_tensor_3d(ctx, T.F32, d_conv, channels, n_seqs)
        c = ggml.new_tensor_2d(ctx, T.F32, d_conv, channels)
        return ggml.ssm_conv(ctx, sx, c), [sx, c]
    return build


def matvec(k, m, n_seqs):
    def build(ctx):
        w = ggml.new_tensor_2d(ctx, T.Q8_0, k, m)
        x = ggml.new_tensor_2d(ctx, T.F32, k, n_seqs)
        return ggml.mul_mat(ctx, w, x), [w, x]
    return build


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-b", "--backend", default="CPU")
    p.add_argument("--seqs", type=int, default=1)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (1: a shared machine's second thread only waits for a core)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from torchggml.devices.cpu.jit.loader import set_numba_threads
    set_numba_threads(args.threads)
    backend = ggml.backend_init_by_name(args.backend)
    n = args.seqs
    rows = [  # (model, op, build, the layer's largest projection at Q8_0: k x m)
        ("mamba-130m", "ssm_conv", ssm_conv(4, 1536, n), (768, 3072)),
        ("mamba-130m", "ssm_scan", ssm_scan(16, 1, 1536, 1, n, True), (768, 3072)),
        ("mamba2-2.7b", "ssm_scan", ssm_scan(128, 64, 80, 1, n, False), (2560, 10576)),
        ("granite-4.0-h-tiny", "ssm_scan", ssm_scan(128, 64, 48, 1, n, False), (1536, 6448)),
        ("rwkv6-1.6b", "rwkv_wkv6", wkv("rwkv_wkv6", 64, 32, n), (2048, 2048)),
        ("rwkv7-1.5b", "rwkv_wkv7", wkv("rwkv_wkv7", 64, 32, n), (2048, 2048)),
        ("qwen3-next-80b", "gated_delta_net", gdn(128, 32, n), (2048, 12288)),
    ]
    print(f"{args.backend}, {n} sequence(s), one token each, {args.threads} thread(s) (us per call)")
    print(f"{'model':20} {'op':16} {'op us':>9} {'Q8_0 proj us':>13}  projection")
    for model, op, build, (k, m) in rows:
        init = {6: lambda t, gen: torch.arange(t.ne[0])} if op == "ssm_scan" else {}  # the state slots
        t_op, _, _ = time_case(OpCase(op, model, build, None, init=init), backend, min_seconds=0.1)
        t_mm, _, _ = time_case(OpCase("mul_mat", model, matvec(k, m, n), None), backend, min_seconds=0.1)
        print(f"{model:20} {op:16} {t_op * 1e6:9.1f} {t_mm * 1e6:13.1f}  {k}x{m}")


if __name__ == "__main__":
    main()
