"""Time ggml's vision/audio graphs on a torchggml device against the same work in plain torch
(float32, same threads): whisper's conv_1d stem (im2col + mul_mat), a UNet-sized conv_2d, CLIP's
patch embedding (conv_2d_sk_p0), the direct conv_2d, max pooling and upscaling.

    PYTHONPATH=. python scripts/bench_vision_ops.py [--device CPU] [--seconds 0.3]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torchggml as ggml  # noqa: E402
from torchggml.test_ops.cases.table import OpCase  # noqa: E402
from torchggml.test_ops.runner import time_case  # noqa: E402

T = ggml.Type


def _conv_1d(ctx, k, ic, oc, length, s):
    a = ggml.new_tensor_3d(ctx, T.F16, k, ic, oc)
    b = ggml.new_tensor_2d(ctx, T.F32, length, ic)
    return ggml.conv_1d(ctx, a, b, s, 1, 1), [a, b]


def _conv_2d(ctx, k, ic, oc, size, direct=False):
    a = ggml.new_tensor_4d(ctx, T.F16 if not direct else T.F32, k, k, ic, oc)
    b = ggml.new_tensor_4d(ctx, T.F32, size, size, ic, 1)
    fn = ggml.conv_2d_direct if direct else ggml.conv_2d
    return fn(ctx, a, b, 1, 1, k // 2, k // 2, 1, 1), [a, b]


def _patch_embed(ctx):
    a = ggml.new_tensor_4d(ctx, T.F16, 14, 14, 3, 768)
    b = ggml.new_tensor_4d(ctx, T.F32, 224, 224, 3, 1)
    return ggml.conv_2d_sk_p0(ctx, a, b), [a, b]


def _pool(ctx):
    a = ggml.new_tensor_4d(ctx, T.F32, 64, 64, 128, 1)
    return ggml.pool_2d(ctx, a, ggml.OpPool.MAX, 2, 2, 2, 2, 0, 0), [a]


def _upscale(ctx, mode):
    a = ggml.new_tensor_4d(ctx, T.F32, 32, 32, 320, 1)
    return ggml.upscale(ctx, a, 2, mode), [a]


# name -> (ggml build, torch equivalent (a zero-arg callable), flops)
WORKLOADS = {
    "whisper-base conv1: conv_1d k3 80->512 x3000": (
        lambda c: _conv_1d(c, 3, 80, 512, 3000, 1),
        lambda x=torch.randn(1, 80, 3000), w=torch.randn(512, 80, 3): F.conv1d(x, w, padding=1),
        2 * 3000 * 512 * 80 * 3),
    "whisper-base conv2: conv_1d k3 512->512 x3000 s2": (
        lambda c: _conv_1d(c, 3, 512, 512, 3000, 2),
        lambda x=torch.randn(1, 512, 3000), w=torch.randn(512, 512, 3): F.conv1d(x, w, stride=2, padding=1),
        2 * 1500 * 512 * 512 * 3),
    "conv_2d 3x3 128->128 64x64 (im2col)": (
        lambda c: _conv_2d(c, 3, 128, 128, 64),
        lambda x=torch.randn(1, 128, 64, 64), w=torch.randn(128, 128, 3, 3): F.conv2d(x, w, padding=1),
        2 * 64 * 64 * 128 * 128 * 9),
    "conv_2d_direct 3x3 128->128 64x64": (
        lambda c: _conv_2d(c, 3, 128, 128, 64, direct=True),
        lambda x=torch.randn(1, 128, 64, 64), w=torch.randn(128, 128, 3, 3): F.conv2d(x, w, padding=1),
        2 * 64 * 64 * 128 * 128 * 9),
    "CLIP patch embedding 14x14 3->768 224x224": (
        _patch_embed,
        lambda x=torch.randn(1, 3, 224, 224), w=torch.randn(768, 3, 14, 14): F.conv2d(x, w, stride=14),
        2 * 256 * 768 * 588),
    "pool_2d max 2x2 64x64x128": (
        _pool, lambda x=torch.randn(1, 128, 64, 64): F.max_pool2d(x, 2), 0),
    "upscale nearest x2 32x32x320": (
        lambda c: _upscale(c, ggml.ScaleMode.NEAREST),
        lambda x=torch.randn(1, 320, 32, 32): F.interpolate(x, scale_factor=2, mode="nearest"), 0),
    "upscale bilinear x2 32x32x320": (
        lambda c: _upscale(c, ggml.ScaleMode.BILINEAR),
        lambda x=torch.randn(1, 320, 32, 32): F.interpolate(x, scale_factor=2, mode="bilinear"), 0),
}


def torch_seconds(fn, min_seconds: float) -> float:
    fn()
    runs, t0 = 0, time.perf_counter()
    while runs < 3 or time.perf_counter() - t0 < min_seconds:
        fn()
        runs += 1
    return (time.perf_counter() - t0) / runs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="CPU")
    p.add_argument("--seconds", type=float, default=0.3)
    args = p.parse_args(argv)
    backend = ggml.backend_init_by_name(args.device)
    print(f"device {args.device}, torch threads {torch.get_num_threads()}")
    print("| workload | torchggml ms | GFLOP/s | torch ms | ratio |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, (build, reference, flops) in WORKLOADS.items():
        case = OpCase(name, "", build, None)
        seconds, _, _ = time_case(case, backend, min_seconds=args.seconds)
        ref = torch_seconds(reference, args.seconds)
        rate = f"{flops / seconds / 1e9:.1f}" if flops else "-"
        print(f"| {name} | {seconds * 1e3:.2f} | {rate} | {ref * 1e3:.2f} | {seconds / ref:.2f} |")
    ggml.backend_free(backend)
    return 0


if __name__ == "__main__":
    sys.exit(main())
