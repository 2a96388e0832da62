"""Tensor parallel on SIM devices: time per decoded token on one device vs Meta(SIM0..), and
the all-reduces per decoded token (count and bytes).

    TORCHGGML_SIM_DEVICES=2 TRITON_INTERPRET=1 python scripts/bench_meta.py MODEL.gguf [--devices SIM0,SIM1] [-n 16]
"""
import argparse
import os
import time

os.environ.setdefault("TORCHGGML_SIM_DEVICES", "2")
os.environ.setdefault("TRITON_INTERPRET", "1")

import torchggml as ggml  # noqa: E402


def decode_time(model, n_tokens: int) -> tuple[float, int, int]:
    """(seconds per decoded token, all-reduces per token, bytes per token) after an 8-token prompt."""
    model.reset()
    model.eval(list(range(1, 9)))
    comm = getattr(model.backend, "comm", None) if model.backend is not None else None
    n0, b0 = (comm.n_allreduce, comm.bytes_allreduce) if comm else (0, 0)
    t0 = time.perf_counter()
    for i in range(n_tokens):
        model.eval([10 + i])
    dt = (time.perf_counter() - t0) / n_tokens
    n1, b1 = (comm.n_allreduce, comm.bytes_allreduce) if comm else (0, 0)
    return dt, (n1 - n0) // n_tokens, (b1 - b0) // n_tokens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--devices", default="SIM0,SIM1")
    ap.add_argument("-n", type=int, default=16, help="decoded tokens to time")
    args = ap.parse_args()
    devs = args.devices.split(",")
    single = ggml.load_model(args.model, devices=[devs[0]], progress=False)
    meta = ggml.load_model(args.model, tensor_parallel=devs, progress=False)
    for name, model in ((devs[0], single), (meta.placement.layers[0].get_name(), meta)):
        decode_time(model, 2)  # warm-up
        dt, n, b = decode_time(model, args.n)
        print(f"{name:24s} {dt * 1e3:8.2f} ms/token   all-reduces/token {n}   bytes/token {b}")


if __name__ == "__main__":
    main()
