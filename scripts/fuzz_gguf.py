"""GGUF fuzzer: deterministic mutants of the golden and demo models, each loaded and evaluated
in a worker process with a time and a memory cap, every outcome classified.

    python scripts/fuzz_gguf.py -n 10000                  # all sources, 2 workers
    python scripts/fuzz_gguf.py -n 300 --workers 2 --json out.json --seed 7

Mutant i of seed s is always the same file: source i % n_sources, mutation drawn from
random.Random(f"{s}:{i}"). Mutations aim at the header (metadata values and types, the tensor
table, counts, raw bytes, inserted/deleted bytes, truncation) and, for one kind, at the
tensor data.

Outcomes:
    ok              loaded and evaluated, logits finite
    clear-error     an exception whose message names the file (GGUFError and friends)
    nonfinite-data  the weights' bytes were corrupted (a valid file) and eval raised
                    NonFiniteLogitsError: the expected, named error
  failures (must all be 0):
    unclear-error   an exception that does not name the file
    crash           the worker died (signal or exit)
    hang            no answer within --timeout seconds
    over-memory     the worker hit its address-space cap (RLIMIT_AS) or ran out of memory
    nonfinite-table a header/table mutation loaded and then produced non-finite logits

Workers are long-lived (importing torch once, not per mutant) and are restarted when one dies,
hangs or has handled --recycle mutants. Exit status 1 when any failure was seen.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import selectors
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(os.environ.get("TORCHGGML_GOLDEN", ROOT.parent / "shared" / "golden"))
GOLDEN_SOURCES = ("llama-Q4_0.gguf", "llama-Q4_K_M.gguf", "llama-F16.gguf", "qwen2-F32.gguf", "qwen3-F16-tied.gguf")
FAILURES = ("unclear-error", "crash", "hang", "over-memory", "nonfinite-table")
OUTCOMES = ("ok", "clear-error", "nonfinite-data") + FAILURES
TOKENS = (1, 5, 9, 200)
STARTUP_TIMEOUT = 600  # seconds for a worker's imports and warm-up (a busy machine is slow)
REPACK_EVERY = 8  # one mutant in 8 loads with repacked CPU weights (slower), the others without

# ---------------------------------------------------------------- the sources and their fields


class Source:
    """One original file, with the byte position of every header field (from the gguf reader)."""

    def __init__(self, path: Path):
        import gguf
        self.path = path
        self.data = path.read_bytes()
        r = gguf.GGUFReader(path)
        base = r.data.ctypes.data
        self.data_offset = int(r.data_offset)
        self.arch = str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8")

        def parts(field):
            return [(p.ctypes.data - base, p.dtype) for p in field.parts]
        self.counts = [parts(r.fields[k])[0] for k in ("GGUF.tensor_count", "GGUF.kv_count")]
        self.kvs = {name: parts(f) for name, f in r.fields.items() if not name.startswith("GGUF.")}
        self.tensors = [parts(t.field) for t in r.tensors]


def _interesting(rng: random.Random, value, dtype):
    kind, size = dtype.kind, dtype.itemsize
    if kind == "f":
        return rng.choice([0.0, -0.0, float("nan"), float("inf"), float("-inf"), -1.0, 1e38, 1e-38,
                           value * 2, value / 2, -value, rng.uniform(-1e6, 1e6)])
    bits = 8 * size
    lo, hi = (0, 2**bits - 1) if kind in "ub" else (-2**(bits - 1), 2**(bits - 1) - 1)
    v = int(value)
    cands = [0, 1, 2, hi, hi - 1, lo, 2**(bits - 1) - 1, v + 1, v - 1, v * 2, v // 2, v + 32, v - 32,
             rng.randint(lo, hi), rng.randint(0, 4096)]
    return min(hi, max(lo, rng.choice(cands)))


def _set_part(buf: bytearray, rng: random.Random, offset: int, dtype) -> str:
    """Overwrite one element of a header part with an interesting value of its type."""
    import numpy as np
    code = {("f", 4): "f", ("f", 8): "d", ("u", 1): "B", ("i", 1): "b", ("u", 2): "H", ("i", 2): "h",
            ("u", 4): "I", ("i", 4): "i", ("u", 8): "Q", ("i", 8): "q", ("b", 1): "B"}.get((dtype.kind, dtype.itemsize))
    if code is None or offset + struct.calcsize(code) > len(buf):
        return "skip"
    old = struct.unpack_from("<" + code, buf, offset)[0]
    new = _interesting(rng, old, np.dtype(dtype))
    struct.pack_into("<" + code, buf, offset, new)
    return f"{old!r}->{new!r}"


def mutate(src: Source, rng: random.Random) -> tuple[str, bytes]:
    """(kind, mutant bytes). Only the `data` kind touches the tensor data region."""
    buf = bytearray(src.data)
    kind = rng.choices(["kv_value", "hparam", "tensor_info", "count", "kv_type", "header_bytes",
                        "splice", "truncate", "data"],
                       weights=[22, 14, 18, 4, 6, 10, 8, 8, 6])[0]
    if kind in ("kv_value", "hparam"):
        keys = [k for k in src.kvs if kind == "kv_value" or k.startswith(src.arch + ".")]
        key = rng.choice(keys)
        parts = src.kvs[key]
        # the value parts come after key length, key bytes and value type
        off, dtype = rng.choice(parts[3:] if len(parts) > 3 else parts)
        if dtype.kind == "u" and dtype.itemsize == 1 and kind == "kv_value" and rng.random() < 0.5:
            off, dtype = rng.choice(parts)  # sometimes the key itself
        detail = _set_part(buf, rng, off, dtype)
        return f"{kind}:{key}:{detail}", bytes(buf)
    if kind == "tensor_info":
        parts = rng.choice(src.tensors)
        off, dtype = rng.choice(parts[2:])  # n_dims, dims, type, offset (not the name's length)
        return f"{kind}:{_set_part(buf, rng, off, dtype)}", bytes(buf)
    if kind == "count":
        off, _ = rng.choice(src.counts)
        n = struct.unpack_from("<Q", buf, off)[0]
        new = rng.choice([n - 1, n + 1, 0, 2**32 - 1, 2**63, n * 2])
        struct.pack_into("<Q", buf, off, max(0, new) % 2**64)
        return f"{kind}:{n}->{new}", bytes(buf)
    if kind == "kv_type":
        parts = src.kvs[rng.choice(list(src.kvs))]
        off, _ = parts[2]
        struct.pack_into("<I", buf, off, rng.choice([*range(13), 13, 255, 2**32 - 1]))
        return kind, bytes(buf)
    if kind == "header_bytes":
        for _ in range(rng.randint(1, 8)):
            buf[rng.randrange(4, src.data_offset)] = rng.randrange(256)
        return kind, bytes(buf)
    if kind == "splice":
        at = rng.randrange(4, src.data_offset)
        n = rng.randint(1, 64)
        if rng.random() < 0.5:
            return f"{kind}:delete {n} at {at}", bytes(buf[:at] + buf[at + n:])
        return f"{kind}:insert {n} at {at}", bytes(buf[:at] + bytes(rng.randrange(256) for _ in range(n)) + buf[at:])
    if kind == "truncate":
        end = rng.randrange(0, src.data_offset) if rng.random() < 0.6 else rng.randrange(src.data_offset, len(buf))
        return f"{kind}:{end}", bytes(buf[:end])
    for _ in range(rng.randint(1, 16)):
        buf[rng.randrange(src.data_offset, len(buf))] = rng.randrange(256)
    return "data", bytes(buf)


# ---------------------------------------------------------------- the worker process

def worker_main(mem_cap_mb: int) -> None:
    """Read mutant paths from stdin, answer one JSON line each."""
    import warnings
    warnings.simplefilter("ignore")
    import torch
    torch.set_num_threads(1)  # workers run side by side: more threads only oversubscribe the cores
    from torchggml.models import load_model
    from torchggml.models.model import NonFiniteLogitsError
    # warm up with a clean model so lazy initialisation is not counted against the cap
    _load_and_eval(load_model, str(GOLDEN / "models" / GOLDEN_SOURCES[0]))
    vm = _vm_bytes()
    cap = vm + mem_cap_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints must not break the protocol
    out.write(json.dumps({"ready": True}) + "\n")  # the time limit counts from here
    out.flush()
    for line in sys.stdin:
        task = json.loads(line)
        path = task["path"]
        try:
            outcome, detail = _load_and_eval(load_model, path, task["repack"]), ""
        except NonFiniteLogitsError as e:
            outcome, detail = "nonfinite", str(e)
        except MemoryError as e:
            outcome, detail = "over-memory", f"MemoryError: {e}"
        except Exception as e:
            text = f"{type(e).__name__}: {e}"
            if "not enough memory" in text or "can't allocate memory" in text.lower():
                outcome = "over-memory"
            else:
                outcome = "clear-error" if path in str(e) else "unclear-error"
            detail = text
        out.write(json.dumps({"outcome": outcome, "detail": detail[:400]}) + "\n")
        out.flush()


def _load_and_eval(load_model, path: str, repack: bool = True) -> str:
    # check_tensors: a table whose type was swapped for one of the same size decodes the bytes
    # into NaN/inf scales; the check rejects it at load instead of at eval
    model = load_model(path, n_ctx=16, n_batch=16, progress=False, repack=repack, check_tensors=True)
    try:
        ids = [t % model.n_vocab for t in TOKENS]
        model.eval(ids[:3])
        model.eval(ids[3:])  # a second call reads the cache the first one wrote
        return "ok"
    finally:
        model.close()


def _vm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


class Worker:
    def __init__(self, index: int, tmpdir: str, mem_cap_mb: int):
        self.path = os.path.join(tmpdir, f"mutant-{index}.gguf")
        self.mem_cap_mb = mem_cap_mb
        self.proc = None
        self.ready = False  # set by the worker's first line, after its imports and warm-up
        self.handled = 0
        self.task = None
        self.started = 0.0
        self.buffer = b""

    def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", "--mem-cap-mb", str(self.mem_cap_mb)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=env)
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.handled, self.buffer, self.ready = 0, b"", False
        self.started = time.monotonic()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def submit(self, task, data: bytes) -> None:
        with open(self.path, "wb") as f:
            f.write(data)
        self.task, self.started = task, time.monotonic()
        repack = task[0] % REPACK_EVERY == 0
        self.proc.stdin.write((json.dumps({"path": self.path, "repack": repack}) + "\n").encode())
        self.proc.stdin.flush()


def run(n: int, seed: int = 0, workers: int = 2, timeout: float = 60.0, mem_cap_mb: int = 2048,
        recycle: int = 400, sources=None, progress: bool = True) -> dict:
    """Run mutants 0..n-1; the summary: counts per outcome, per mutation kind, and examples."""
    sources = [Source(Path(p)) for p in (sources or default_sources())]
    counts, by_kind, examples = Counter(), defaultdict(Counter), defaultdict(list)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fuzz_gguf_") as tmpdir:
        pool = [Worker(i, tmpdir, mem_cap_mb) for i in range(workers)]
        for w in pool:
            w.start()
        try:
            sel = selectors.DefaultSelector()
            next_i, done = 0, 0

            def record(w: Worker, outcome: str, detail: str) -> None:
                nonlocal done
                i, src, kind = w.task
                if outcome == "nonfinite":
                    outcome = "nonfinite-data" if kind == "data" else "nonfinite-table"
                counts[outcome] += 1
                by_kind[kind.split(":")[0]][outcome] += 1
                if outcome != "ok" and len(examples[outcome]) < 8:
                    examples[outcome].append({"mutant": i, "source": src, "mutation": kind, "detail": detail})
                if outcome in FAILURES and progress:
                    print(f"FAIL {outcome} mutant {i} ({src}, {kind}): {detail}", file=sys.stderr, flush=True)
                w.task, done = None, done + 1
                w.handled += 1
                if progress and done % 500 == 0:
                    print(f"{done}/{n} {dict(counts)} {time.monotonic() - t0:.0f}s", file=sys.stderr, flush=True)

            def restart(w: Worker) -> None:
                if w.proc is not None:
                    sel.unregister(w.proc.stdout)
                w.stop()
                w.start()
                sel.register(w.proc.stdout, selectors.EVENT_READ, w)

            for w in pool:
                sel.register(w.proc.stdout, selectors.EVENT_READ, w)
            while done < n:
                for w in pool:
                    if w.ready and w.task is None and next_i < n:
                        if w.handled >= recycle:
                            restart(w)
                        src = sources[next_i % len(sources)]
                        kind, data = mutate(src, random.Random(f"{seed}:{next_i}"))
                        try:
                            w.submit((next_i, src.path.name, kind), data)
                        except BrokenPipeError:
                            w.task = (next_i, src.path.name, kind)
                            record(w, "crash", "the worker died before taking the mutant")
                            restart(w)
                        next_i += 1
                for key, _ in sel.select(timeout=1.0):
                    w = key.data
                    chunk = w.proc.stdout.read()
                    if chunk:
                        w.buffer += chunk
                        while b"\n" in w.buffer:
                            line, w.buffer = w.buffer.split(b"\n", 1)
                            msg = json.loads(line)
                            if msg.get("ready"):
                                w.ready = True
                            elif w.task is not None:
                                record(w, msg["outcome"], msg["detail"])
                    elif w.proc.poll() is not None:  # EOF: the worker died
                        if w.task is not None:
                            record(w, "crash", f"worker exit status {w.proc.returncode}")
                        elif not w.ready:
                            raise RuntimeError(f"a fuzz worker failed to start (exit status {w.proc.returncode})")
                        restart(w)
                now = time.monotonic()
                for w in pool:
                    if w.task is not None and now - w.started > timeout:
                        record(w, "hang", f"no answer in {timeout:.0f} s")
                        restart(w)
                    elif not w.ready and now - w.started > STARTUP_TIMEOUT:
                        raise RuntimeError(f"a fuzz worker did not start in {STARTUP_TIMEOUT} s")
        finally:  # never leave workers behind, also on an interrupt
            for w in pool:
                w.stop()
    return {"mutants": n, "seed": seed, "seconds": round(time.monotonic() - t0, 1),
            "sources": [s.path.name for s in sources], "mem_cap_mb": mem_cap_mb, "timeout_s": timeout,
            "outcomes": {k: counts.get(k, 0) for k in OUTCOMES},
            "failures": sum(counts.get(k, 0) for k in FAILURES),
            "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
            "examples": dict(examples)}


def default_sources() -> list[Path]:
    paths = [GOLDEN / "models" / name for name in GOLDEN_SOURCES]
    from torchggml.gguf_writer.demo import demo_model_path
    return [p for p in paths if p.exists()] + [Path(demo_model_path())]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--mutants", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per mutant before it counts as a hang")
    ap.add_argument("--mem-cap-mb", type=int, default=2048, help="address space a worker may add (RLIMIT_AS)")
    ap.add_argument("--recycle", type=int, default=400, help="restart a worker after this many mutants")
    ap.add_argument("--json", help="write the summary (with failure examples) here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker_main(args.mem_cap_mb)
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # run's cleanup stops the workers
    summary = run(args.mutants, args.seed, args.workers, args.timeout, args.mem_cap_mb, args.recycle)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    print(f"{summary['mutants']} mutants in {summary['seconds']} s (seed {summary['seed']}, "
          f"sources {', '.join(summary['sources'])})")
    for k in OUTCOMES:
        print(f"  {k:16s} {summary['outcomes'][k]}")
    for kind, c in summary["by_kind"].items():
        print(f"  {kind:14s} {c}")
    for k in FAILURES:
        for ex in summary["examples"].get(k, []):
            print(f"FAIL {k}: {ex}")
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    if "--worker" not in sys.argv:
        sys.path.insert(0, str(ROOT))
    sys.exit(main())
