#!/usr/bin/env python
"""Prompt processing (pp) and generation (tg) speed of torchggml, side by side with llama.cpp.

    python scripts/bench_model.py [MODEL.gguf ...] [-p 128] [-n 32] [-t THREADS] [--device CPU]
    python scripts/bench_model.py --shape 1b [--types F16,Q4_K_M]
    python scripts/bench_model.py REAL.gguf --types Q5_0,IQ4_XS --conditions quiet,busy

--types with MODEL files: each file as it is, then the first one requantized by llama.cpp's
quantizer (llama_model_quantize, allow_requantize and pure: `llama-quantize --allow-requantize --pure`) to
each type, once, into $TORCHGGML_CACHE/requantized (rows that are not a multiple of 256 take
llama.cpp's fallback type for the K-quants and IQ4_XS, as llama-quantize writes them).
--conditions quiet,busy runs every model on the quiet machine, then with a competing busy
process (a spinning Python loop pinned to the last core, taskset's -c) for the whole run of
both engines (--busy: that condition only); the summary's "busy/quiet" is decode busy over
decode quiet, per engine.

With no MODEL it generates (once, in the cache directory, $TORCHGGML_CACHE or ~/.cache/torchggml)
llama models with the demo generator's seeded weights, of one of two shapes (--shape):
  small  ~168M parameters: dim 1024, 8 layers, 16 heads, FFN 2816, vocab 32000 (issue 9's shape),
         in F16, Q8_0 and Q4_0 (gguf's quantizer), and Q4_K_M, Q6_K, Q5_K_M through llama.cpp's
         quantizer (llama_cpp.llama_model_quantize) from the F16 file;
  1b     TinyLlama-1.1B's shape: dim 2048, 22 layers, 32 heads / 4 KV heads, FFN 5632, vocab
         32000, in F16 and, through llama.cpp's quantizer, Q8_0, Q4_0, Q4_K_M and Q6_K.
Types that need llama.cpp's quantizer are skipped with a message without llama-cpp-python.
--types picks some. The header names the CPU's features and torchggml's CPU product path
(TORCHGGML_CPU_PATH).

llama.cpp runs through llama-cpp-python when it is installed (`pip install llama-cpp-python`,
which builds llama.cpp from source; for CUDA: CMAKE_ARGS="-DGGML_CUDA=on" pip install
llama-cpp-python). Same file, same machine, same thread count. Tests never need it.

pp: tokens/s of one call that evaluates P prompt tokens (one micro-batch) from an empty cache,
with the logits of the last token only, as llama-bench's pp and llama-cpp-python's eval
(logits_all=False) do: torchggml's model.eval(tokens, logits="last"), so neither engine runs the
output head (a P x n_embd x n_vocab product) for the other tokens. --pp-all also measures
eval(tokens, logits="all") (every token's logits), interleaved with the last-only runs in the same
process, and prints the speed-up of last-only over it.
tg: tokens/s of N single-token calls after one warm-up token, as llama-bench's tg.
pp cpu, tg cpu: tokens per CPU second of the process (t/c: all its threads' CPU time, so a
figure that depends less on a busy machine; run with OMP_WAIT_POLICY=PASSIVE so that spinning
OpenMP workers do not count as work; tg's calls include their first token).
load: seconds of the load call (load_model / Llama(...)) in the fresh process, wall and CPU time
(CPU time depends less on a busy machine). Both engines map the file (llama.cpp's default);
--no-mmap makes both read the weights into memory (torchggml's in huge pages), whose load then
pays the first touch of that memory. The description line says whether the kernel maps the
file in huge pages (which depends on how its pages entered the page cache). RSS: the process's resident memory after the runs
(VmRSS; peak: VmHWM), with torchggml's baseline (torch and numba imported, ~0.25-0.3 GB on
x86 Linux; llama-cpp-python's ~0.04 GB) included.
--profile prints where torchggml spends its time during generation (cProfile, top functions).
Each engine runs in its own process (llama.cpp's spinning OpenMP threads would slow torch down).
--paired N adds decode paired token by token in one process: both engines loaded, N single-token
calls of each alternated (a machine whose speed drifts from minute to minute slows both alike),
median ms a token and the median of the per-pair ratios; llama.cpp's OpenMP workers spin after
its calls unless OMP_WAIT_POLICY=PASSIVE, which can only slow torchggml's calls in this mode.
--paired-pp N does the same for prompts: N pp calls of each engine alternated in that process (one
warm-up pair first), each after a pause of PAIRED_PAUSE s so the other engine's spinning workers
have gone to sleep; tokens/s of the median call and the median of the per-pair ratios.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
# a torchggml engine's process imports torchggml before torch, as a program using it does: it
# chooses OpenMP's wait policy before torch loads the runtime (torchggml/openmp.py); llama.cpp's
# runs under the environment's policy
if "--engine" not in sys.argv or sys.argv[sys.argv.index("--engine") + 1:][:1] != ["llama.cpp"]:
    import torchggml  # noqa: F401,E402

import torch  # noqa: E402


# shape -> (model config, types the demo generator writes (gguf's quantizer), types llama.cpp's
# quantizer writes from the F16 file (gguf's numpy quantizer would take minutes on a 1B model))
SHAPES = {
    "small": (dict(n_embd=1024, n_layer=8, n_head=16, n_head_kv=16, n_ff=2816),
              ("F16", "Q8_0", "Q4_0"), ("Q4_K_M", "Q6_K", "Q5_K_M")),
    "1b": (dict(n_embd=2048, n_layer=22, n_head=32, n_head_kv=4, n_ff=5632),
           ("F16",), ("Q8_0", "Q4_0", "Q4_K_M", "Q6_K")),
}


def bench_config(shape: str = "small"):
    from dataclasses import replace
    from torchggml.gguf.writer.demo import DEMO_CONFIG
    return replace(DEMO_CONFIG, **SHAPES[shape][0], n_vocab=32000, n_ctx=1024)


def default_types(shape: str) -> tuple[str, ...]:
    return SHAPES[shape][1] + SHAPES[shape][2]


def llama_quantized(src: str, ftype_name: str) -> str:
    """src quantized by llama.cpp (cached beside it)."""
    import ctypes
    import llama_cpp
    dst = src.replace("-F16-", f"-{ftype_name}-")
    if not os.path.exists(dst):
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype_name}")
        params.nthread = torch.get_num_threads()
        if llama_cpp.llama_model_quantize(src.encode(), (dst + ".part").encode(), ctypes.byref(params)) != 0:
            raise RuntimeError(f"llama.cpp could not quantize {src} to {ftype_name}")
        os.replace(dst + ".part", dst)
    return dst


def _pad_vocab_to_target(demo) -> None:
    """The demo corpus trains only ~700 tokens: pad the vocabulary with unused control tokens to
    the config's n_vocab, so the embedding and output head have issue 9's size (32000 rows)."""
    train = demo.train_vocab

    def padded(n_vocab, *rest, **kw):
        vocab = train(n_vocab, *rest, **kw)
        extra = n_vocab - len(vocab.tokens)
        vocab.tokens += [f"<unused{i}>" for i in range(extra)]
        vocab.types += [3] * extra
        return vocab
    demo.train_vocab = padded


def bench_models(types, shape: str = "small") -> list[str]:
    from torchggml.gguf.writer import demo
    _pad_vocab_to_target(demo)
    directory = os.path.join(demo.cache_dir(), "bench-padded-vocab")
    os.makedirs(directory, exist_ok=True)
    generated_model = lambda cfg, wtype: demo.generated_model(cfg, wtype, directory=directory)  # noqa: E731
    cfg, paths = bench_config(shape), []
    for wtype in types:
        print(f"preparing the {shape} {wtype} benchmark model (written once, then cached)...", file=sys.stderr)
        if wtype in SHAPES[shape][2]:
            if not llama_cpp_available():
                print(f"skipping {wtype}: llama.cpp's quantizer needs llama-cpp-python", file=sys.stderr)
                continue
            paths.append(llama_quantized(generated_model(cfg, "F16"), wtype))
        else:
            paths.append(generated_model(cfg, wtype))
    return paths


def requantized(src: str, type_name: str) -> str:
    """src requantized by llama.cpp to type_name (a llama_ftype's name: Q5_0, Q2_K, IQ4_XS...),
    cached under the cache directory."""
    import ctypes
    import llama_cpp
    from torchggml.gguf.writer.demo import cache_dir
    directory = os.path.join(cache_dir(), "requantized")
    os.makedirs(directory, exist_ok=True)
    dst = os.path.join(directory, f"{os.path.splitext(os.path.basename(src))[0]}.to-{type_name}.gguf")
    if not os.path.exists(dst):
        print(f"requantizing {os.path.basename(src)} to {type_name} (once, cached)...", file=sys.stderr)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{type_name}", None) or \
            getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{type_name}_M")  # Q3_K: Q3_K_M, pure: all Q3_K
        params.allow_requantize = True
        params.pure = True  # every tensor of that type, not the mix, but where its rows need a fallback
        params.nthread = torch.get_num_threads()
        if llama_cpp.llama_model_quantize(src.encode(), (dst + ".part").encode(), ctypes.byref(params)) != 0:
            raise RuntimeError(f"llama.cpp could not requantize {src} to {type_name}")
        os.replace(dst + ".part", dst)
    return dst


class BusyCore:
    """A competing busy process for the duration of a `with`: a spinning Python loop pinned to
    the machine's last core (another program's work on one of the cores both engines use)."""

    def __enter__(self):
        core = max(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        # it spins until this process ends (its parent changes), however this one ends
        self.proc = subprocess.Popen([sys.executable, "-c", "import os\nparent = os.getppid()\nwhile os.getppid() == parent: pass"])
        if core is not None:
            os.sched_setaffinity(self.proc.pid, {core})
        self.core = core
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def weight_types(path: str) -> str:
    """The file's quantized weight types, most weights first (e.g. "Q5_0 64%, Q8_0 ...")."""
    from collections import Counter
    from torchggml.gguf.loader import open_gguf
    counts = Counter()
    for info in open_gguf(path).tensors.values():
        if len(info.ne) >= 2 and info.ne[1] > 1:
            counts[info.type.name] += info.n_elements
    total = sum(counts.values())
    return " ".join(f"{name} {100 * n / total:.0f}%" for name, n in counts.most_common())


def cpu_header() -> str:
    from torchggml.devices.cpu.features import cpu_features, cpu_path, fastest_gemm_dtype, int8_gemm
    feats = cpu_features()
    flags = " ".join(k for k, v in feats.items() if v == "1")
    floats = str(fastest_gemm_dtype()).split('.')[-1]
    from torchggml.devices.cpu.features import GEMM_ENV
    import os
    which = ("every block type's 2-D weights" if os.environ.get(GEMM_ENV, "").strip().lower() == "int8"
             else f"ggml's blocks in place, the load-time layouts from 16 rows but Q4_1's; short prompts in {floats}")
    gemm = f"int8 ({which}), else {floats}" if int8_gemm() else floats
    return f"CPU: {feats['CPU_CAPABILITY']} ({flags}); torchggml CPU path: {cpu_path()}, prompt GEMM in {gemm}"


def prompt_tokens(n_vocab: int, n: int) -> list[int]:
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, n_vocab, (n,), generator=gen).tolist()


def memory_mb() -> dict:
    """The process's resident memory now and at its peak (MB, Linux /proc; empty elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f)
    except OSError:
        return {}
    return {"rss": int(fields["VmRSS"].split()[0]) / 1024, "rss_peak": int(fields["VmHWM"].split()[0]) / 1024}


def timed_load(load):
    """(the loaded model, {"load": wall seconds, "load_cpu": CPU seconds of the process})."""
    wall, cpu = time.perf_counter(), time.process_time()
    model = load()
    return model, {"load": time.perf_counter() - wall, "load_cpu": time.process_time() - cpu}


def timed(reps: int, *fns) -> list[list[float]]:
    """Seconds of each call of each function, reps times, the functions interleaved (a busy
    neighbour then slows them alike), after one warm-up call each (graph build, allocation,
    first-touch of the weights). The CPU seconds of the process for each function's calls are
    appended to CPU_SECONDS (the work, whatever the machine's load)."""
    for fn in fns:
        fn()
    out, cpu = [[] for _ in fns], [0.0] * len(fns)
    for _ in range(reps):
        for i, (fn, times) in enumerate(zip(fns, out)):
            t, c = time.perf_counter(), time.process_time()
            fn()
            times.append(time.perf_counter() - t)
            cpu[i] += time.process_time() - c
    CPU_SECONDS.extend(cpu)
    return out


CPU_SECONDS: list[float] = []


def tokens_per_cpu_second(n_tokens: int, fn, reps: int) -> tuple[list, float]:
    """(fn's results over reps calls, tokens per CPU second of the process over them)."""
    c = time.process_time()
    results = [fn() for _ in range(reps)]
    return results, n_tokens * reps / max(time.process_time() - c, 1e-9)


# ---------------------------------------------------------------- torchggml

def bench_torchggml(path, args) -> dict:
    from torchggml.models import load_model
    devices = args.device.split(",") if args.device else None
    model, load = timed_load(lambda: load_model(
        path, devices=devices, n_gpu_layers=args.n_gpu_layers, n_ctx=args.n_prompt + args.n_gen + 8,
        n_batch=args.n_prompt, flash_attn=args.flash_attn, n_threads=args.threads, progress=False,
        use_mmap=args.use_mmap))
    tokens = prompt_tokens(model.n_vocab, args.n_prompt)

    def pp(logits="last"):
        model.reset()
        model.eval(tokens, logits=logits)

    def tg():
        model.reset()
        model.eval(tokens[:1])
        start = time.perf_counter()
        for t in tokens[1: args.n_gen + 1] if args.n_gen < len(tokens) else [tokens[0]] * args.n_gen:
            model.eval([t])
        return time.perf_counter() - start

    CPU_SECONDS.clear()
    pp_times, *pp_all_times = timed(args.reps, pp, *([lambda: pp("all")] if args.pp_all else []))
    pp_cpu = args.n_prompt * args.reps / CPU_SECONDS[0]
    tg()  # warm-up
    tg_times, tg_cpu = tokens_per_cpu_second(args.n_gen + 1, tg, args.reps)
    result = {"pp": args.n_prompt / statistics.median(pp_times), "tg": args.n_gen / statistics.median(tg_times),
              "pp_cpu": pp_cpu, "tg_cpu": tg_cpu,
              "desc": model.describe() + ("; file mapped in huge pages" if model.file.maps_in_huge_pages()
                                          else "; file mapped in 4 KiB pages"), "params": sum(t.n_elements for t in model.file.tensors.values()),
              **load, **memory_mb()}
    if pp_all_times:
        result["pp_all"] = args.n_prompt / statistics.median(pp_all_times[0])
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        tg()
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(args.profile)
        result["profile"] = s.getvalue()
    model.close()
    return result


# ---------------------------------------------------------------- llama.cpp

def llama_cpp_available() -> bool:
    try:
        import llama_cpp  # noqa: F401
        return True
    except ImportError:
        return False


def bench_llama_cpp(path, args, n_vocab: int) -> dict:
    from llama_cpp import Llama
    n_gpu = -1 if args.device and not args.device.upper().startswith("CPU") else (args.n_gpu_layers or 0)
    threads = args.threads or torch.get_num_threads()
    llm, load = timed_load(lambda: Llama(
        model_path=str(path), n_ctx=args.n_prompt + args.n_gen + 8, n_batch=args.n_prompt,
        n_ubatch=args.n_prompt, n_threads=threads, n_threads_batch=threads, n_gpu_layers=n_gpu,
        flash_attn=args.flash_attn, use_mmap=args.use_mmap, verbose=False))
    tokens = prompt_tokens(n_vocab, args.n_prompt)

    def pp():
        llm.reset()
        llm.eval(tokens)

    def tg():
        llm.reset()
        llm.eval(tokens[:1])
        start = time.perf_counter()
        for i in range(args.n_gen):
            llm.eval([tokens[1 + i % (len(tokens) - 1)] if len(tokens) > 1 else tokens[0]])
        return time.perf_counter() - start

    CPU_SECONDS.clear()
    (pp_times,) = timed(args.reps, pp)
    pp_cpu = args.n_prompt * args.reps / CPU_SECONDS[0]
    tg()
    tg_times, tg_cpu = tokens_per_cpu_second(args.n_gen + 1, tg, args.reps)
    return {"pp": args.n_prompt / statistics.median(pp_times), "tg": args.n_gen / statistics.median(tg_times),
            "pp_cpu": pp_cpu, "tg_cpu": tg_cpu,
            **load, **memory_mb()}


def bench_paired(path, args, n_vocab: int) -> dict:
    """Both engines in one process: decode's single-token calls alternated (--paired), and
    prompt calls alternated (--paired-pp), each after a pause that lets the other engine's
    spinning workers go to sleep."""
    from llama_cpp import Llama

    from torchggml.models import load_model
    threads = args.threads or torch.get_num_threads()
    warm = prompt_tokens(n_vocab, 8)
    prompt = prompt_tokens(n_vocab, args.n_prompt)
    n_ctx, n_batch = max(64, args.n_prompt + 8), max(len(warm), args.n_prompt if args.paired_pp else 0)
    llm = Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, n_threads=threads,
                n_threads_batch=threads, verbose=False)
    model = load_model(path, n_ctx=n_ctx, n_batch=n_batch, n_threads=args.threads, progress=False)
    result = {}
    theirs, ours = [], []
    for i in range(args.paired):
        if i % (64 - len(warm)) == 0:  # (re)start both sequences after the same prompt
            llm.reset(), llm.eval(warm), model.reset(), model.eval(warm, logits="last")
        token = warm[i % len(warm)]
        start = time.perf_counter()
        llm.eval([token])
        middle = time.perf_counter()
        model.eval([token], logits="last")
        theirs.append(middle - start), ours.append(time.perf_counter() - middle)
    if theirs:
        result.update({"llama.cpp ms": 1e3 * statistics.median(theirs), "torchggml ms": 1e3 * statistics.median(ours),
                       "per-pair ratio": statistics.median(t / o for t, o in zip(theirs, ours))})
    theirs, ours = [], []
    for i in range(args.paired_pp + 1):  # the first pair warms both up
        for engine, times in ((lambda: (llm.reset(), llm.eval(prompt)), theirs),
                              (lambda: (model.reset(), model.eval(prompt, logits="last")), ours)):
            time.sleep(PAIRED_PAUSE)
            start = time.perf_counter()
            engine()
            if i:
                times.append(time.perf_counter() - start)
    if theirs:
        result.update({"llama.cpp pp": args.n_prompt / statistics.median(theirs),
                       "torchggml pp": args.n_prompt / statistics.median(ours),
                       "pp per-pair ratio": statistics.median(t / o for t, o in zip(theirs, ours))})
    model.close()
    return result


# seconds before each paired prompt call: OpenMP's workers spin a while after a call (GNU's
# default: ~0.1-0.3 ms of spinning, or longer with OMP_WAIT_POLICY=ACTIVE), on the cores the
# other engine's call would take
PAIRED_PAUSE = 0.05


# ---------------------------------------------------------------- main

# both engines run under the same OpenMP wait policy: the environment's (default: the runtime's
# own, spinning a while before sleeping, what torch and llama.cpp users get). On a machine shared
# with other busy processes, OMP_WAIT_POLICY=PASSIVE keeps spinning workers off the cores.
OMP_POLICY = os.environ.get("OMP_WAIT_POLICY", "unset (OpenMP's default)")


def engine_env() -> dict:
    """The engines' environment: Python's bytecode cached (under the cache directory, not beside
    the sources) even where PYTHONDONTWRITEBYTECODE is set, so that torchggml's load is timed
    as an installed package's (pip compiles its modules at install), not compiling its sources."""
    from torchggml.gguf.writer.demo import cache_dir
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.setdefault("PYTHONPYCACHEPREFIX", os.path.join(cache_dir(), "pycache"))
    return env


def run_engine(engine: str, path: str, args) -> dict:
    """One engine on one model in a fresh process: llama.cpp's OpenMP threads keep spinning after
    each call and would steal the cores from torch if both ran in one process."""
    cmd = [sys.executable, os.path.abspath(__file__), "--engine", engine, path,
           "-p", str(args.n_prompt), "-n", str(args.n_gen), "-r", str(args.reps), "--profile", str(args.profile),
           "--paired", str(args.paired), "--paired-pp", str(args.paired_pp)]
    for flag, value in (("-t", args.threads), ("-d", args.device), ("-ngl", args.n_gpu_layers)):
        if value is not None:
            cmd += [flag, str(value)]
    if args.flash_attn:
        cmd.append("-fa")
    if not args.use_mmap:
        cmd.append("--no-mmap")
    if args.pp_all:
        cmd.append("--pp-all")
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=engine_env())
    if out.returncode != 0:
        raise RuntimeError(f"{engine} on {path} failed (exit code {out.returncode})")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", help="GGUF files (default: generated ~168M models, see --types)")
    p.add_argument("--shape", choices=sorted(SHAPES), default="small",
                   help="generated models' shape: small (~168M) or 1b (TinyLlama-1.1B's)")
    p.add_argument("--types", default=None, help="generated models' weight types (default: the shape's); with "
                   "MODEL files, the types each is also requantized to (llama.cpp's quantizer, cached)")
    p.add_argument("--conditions", default=None, help="quiet, busy or quiet,busy: the machine as it is, and/or "
                   "with a competing busy process pinned to one core (default: quiet)")
    p.add_argument("--busy", action="store_true", help="the busy condition only (--conditions busy)")
    p.add_argument("-p", "--n-prompt", type=int, default=128, help="prompt tokens for pp (default 128)")
    p.add_argument("-n", "--n-gen", type=int, default=32, help="generated tokens for tg (default 32)")
    p.add_argument("-r", "--reps", type=int, default=3, help="repetitions (the median is reported)")
    p.add_argument("--rounds", type=int, default=1,
                   help="alternate the two engines' processes this many times (medians over rounds)")
    p.add_argument("-t", "--threads", type=int, default=None, help="threads for both (default: torch's)")
    p.add_argument("-d", "--device", default=None, help="torchggml device(s), e.g. CPU or CUDA0 (default: CPU)")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=None)
    p.add_argument("-fa", "--flash-attn", action="store_true")
    p.add_argument("--no-mmap", dest="use_mmap", action="store_false",
                   help="both engines read the weights into memory instead of mapping the file (use_mmap=False)")
    p.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp even when installed")
    p.add_argument("--pp-all", action="store_true",
                   help="also measure torchggml's pp with every token's logits (logits='all')")
    p.add_argument("--profile", type=int, default=0, metavar="K",
                   help="print torchggml's top K functions by own time during generation")
    p.add_argument("--paired", type=int, default=0, metavar="N",
                   help="also time N decode tokens of both engines alternated in one process")
    p.add_argument("--paired-pp", type=int, default=0, metavar="N",
                   help="also time N prompts (pp) of both engines alternated in one process")
    p.add_argument("--engine", choices=("torchggml", "llama.cpp", "paired"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.engine:  # a child process: one engine, one model, JSON on the last line
        path = args.models[0]
        bench = {"torchggml": lambda: bench_torchggml(path, args),
                 "llama.cpp": lambda: bench_llama_cpp(path, args, _n_vocab(path)),
                 "paired": lambda: bench_paired(path, args, _n_vocab(path))}[args.engine]
        result = bench()
        print(json.dumps(result))
        return 0
    types = args.types.split(",") if args.types else default_types(args.shape)
    models = args.models or bench_models(types, args.shape)
    if args.models and args.types:
        models = list(args.models) + [requantized(args.models[0], t) for t in types]
    conditions = (args.conditions or ("busy" if args.busy else "quiet")).split(",")
    if set(conditions) - {"quiet", "busy"}:
        p.error(f"--conditions {args.conditions}: expected quiet, busy or quiet,busy")
    with_llama = not args.no_llama_cpp and llama_cpp_available()
    if not with_llama and not args.no_llama_cpp:
        print("llama-cpp-python is not installed: torchggml only (pip install llama-cpp-python)", file=sys.stderr)
    print(cpu_header() + f"; OMP_WAIT_POLICY {OMP_POLICY} for both engines")
    print(f"threads: {args.threads or torch.get_num_threads()}, pp{args.n_prompt}, tg{args.n_gen}, "
          f"median of {args.reps}, each engine in its own process\n")
    header = f"{'model':44s} {'params':>8s} {'test':>8s} {'torchggml':>14s}" + \
             (f" {'llama.cpp':>14s} {'ratio':>6s}" if with_llama else "")
    print(header)
    print("-" * len(header))
    summary = {}
    for path, condition in [(path, c) for path in models for c in conditions]:
        # the engines alternate, round after round: a machine whose speed drifts (shared hosts,
        # clocks) moves both alike, and each figure is the median over the rounds
        with BusyCore() if condition == "busy" else contextlib.nullcontext() as busy:
            if busy is not None:
                print(f"{os.path.basename(path)}: with a busy process on core {busy.core} (pid {busy.proc.pid})")
            rounds = [(run_engine("torchggml", path, args), run_engine("llama.cpp", path, args) if with_llama else None)
                      for _ in range(args.rounds)]
        ours = rounds[0][0]
        summary[path, condition] = {test: (statistics.median(r[0][test] for r in rounds),
                                           statistics.median(r[1][test] for r in rounds) if with_llama else None)
                                    for test in ("pp", "tg", "load", "rss")}
        for test, label, unit in (("pp", f"pp{args.n_prompt}", "t/s"), ("tg", f"tg{args.n_gen}", "t/s"),
                                  ("pp_cpu", "pp cpu", "t/c"), ("tg_cpu", "tg cpu", "t/c"),
                                  ("load", "load", "s"), ("load_cpu", "load cpu", "s"), ("rss", "RSS", "MB"),
                                  ("rss_peak", "peak", "MB")):
            if test not in ours:
                continue
            mine = statistics.median(r[0][test] for r in rounds)
            line = f"{os.path.basename(path)[:44]:44s} {ours['params'] / 1e6:7.1f}M {label:>8s} {mine:10.2f} {unit:3s}"
            if with_llama:
                ref = statistics.median(r[1][test] for r in rounds)
                ratios = sorted(r[0][test] / r[1][test] for r in rounds)
                line += f" {ref:14.2f} {mine / ref:6.3f}"
                if len(rounds) > 1:
                    line += f"  (rounds {ratios[0]:.2f}-{ratios[-1]:.2f})"
            print(line, flush=True)
        if "pp_all" in ours:
            print(f"  pp{args.n_prompt} with logits='all': {ours['pp_all']:.2f} t/s; logits='last' is "
                  f"{ours['pp'] / ours['pp_all']:.3f}x that (interleaved in one process, medians of {args.reps})")
        if (args.paired or args.paired_pp) and with_llama:
            paired = run_engine("paired", path, args)
            if args.paired:
                print(f"  decode paired in one process ({args.paired} tokens each): torchggml "
                      f"{paired['torchggml ms']:.2f} ms, llama.cpp {paired['llama.cpp ms']:.2f} ms a token "
                      f"({paired['llama.cpp ms'] / paired['torchggml ms']:.3f}x; per-pair median "
                      f"{paired['per-pair ratio']:.3f}x)")
            if args.paired_pp:
                print(f"  pp{args.n_prompt} paired in one process ({args.paired_pp} prompts each): torchggml "
                      f"{paired['torchggml pp']:.1f} t/s, llama.cpp {paired['llama.cpp pp']:.1f} t/s "
                      f"({paired['torchggml pp'] / paired['llama.cpp pp']:.3f}x; per-pair median "
                      f"{paired['pp per-pair ratio']:.3f}x)")
        print(f"  {ours['desc']}")
        if args.profile:
            print(ours["profile"])
    if with_llama and len(summary) > 1:
        print_summary(summary, models, conditions, args)
    return 0


def print_summary(summary: dict, models, conditions, args) -> None:
    """One markdown row a model: torchggml / llama.cpp and their ratio, per test and condition."""
    ratio = lambda pair: f"{pair[0]:.3g} / {pair[1]:.3g} ({pair[0] / pair[1]:.2f}x)"  # noqa: E731
    head = ["file", "weights", f"pp{args.n_prompt} t/s", f"tg{args.n_gen} t/s", "load s", "RSS MB"]
    if "busy" in conditions:
        head += [f"busy pp{args.n_prompt}", f"busy tg{args.n_gen}", "busy/quiet tg (ours, theirs)"]
    print("\n| " + " | ".join(head) + " |\n|" + " --- |" * len(head))
    for path in models:
        quiet, busy = summary.get((path, "quiet")), summary.get((path, "busy"))
        row = [os.path.basename(path), weight_types(path)]
        row += [ratio(quiet[test]) for test in ("pp", "tg", "load", "rss")] if quiet else ["-"] * 4
        if busy:
            row += [ratio(busy["pp"]), ratio(busy["tg"])]
            row.append(f"{busy['tg'][0] / quiet['tg'][0]:.2f}, {busy['tg'][1] / quiet['tg'][1]:.2f}" if quiet else "-")
        print("| " + " | ".join(row) + " |")


def _n_vocab(path) -> int:
    from torchggml.gguf.loader import open_gguf
    return open_gguf(path).tensor_info("token_embd.weight").ne[1]


if __name__ == "__main__":
    sys.exit(main())
