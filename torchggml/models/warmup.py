"""A model's warm-up before its first prompt (llama.cpp's), and a line on stderr whenever
compiling a CPU kernel takes more than a second.

warm_up(model) runs a short prompt and a token, then empties the cache, as llama.cpp does
after loading: the kernels the model's prompts and decode steps use are compiled (or loaded
from numba's cache) and the backends' one-time set-up is done, so that the first prompt's
time is its own.

numba compiles a kernel for this CPU the first time it is called with new argument types (a
weight type the machine has not run yet, a prompt long enough for the threaded kernels) and
keeps it in its disk cache; a kernel found there is loaded without compiling. numba announces
each compile (its "numba:compile" event, not sent for a kernel loaded from the cache): when a
top-level compile is still going after THRESHOLD_S seconds, one line names the kernel and why.
"""
from __future__ import annotations

import sys
import threading
import time

THRESHOLD_S = 1.0
KERNEL_PACKAGE = "torchggml."  # the kernels named: torchggml's (not a user's own numba code)

_installed = []


class CompileNotice:
    """numba:compile listener: a timer per top-level compile prints the notice past threshold_s."""

    def __init__(self, threshold_s: float = THRESHOLD_S, package: str = KERNEL_PACKAGE, stream=None):
        self.threshold_s, self.package, self.stream = threshold_s, package, stream
        self.depth = 0
        self.timer = None
        self.lock = threading.Lock()

    def describe(self, data) -> str:
        fn = data["dispatcher"].py_func
        args = ", ".join(str(a) for a in data.get("args", ()))[:120]
        return f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__qualname__}({args})"

    def _print(self, what: str) -> None:
        print(f"torchggml: compiling the CPU kernel {what}: its first use with these argument types on "
              f"this machine (numba keeps it in its cache: later runs load it; `torchggml compile-kernels` "
              f"compiles them ahead)", file=self.stream or sys.stderr, flush=True)

    def on_start(self, event) -> None:
        with self.lock:
            self.depth += 1
            if self.depth > 1 or not event.data["dispatcher"].py_func.__module__.startswith(self.package):
                return  # a kernel compiled inside another's compile: the outer one is named
            self.timer = threading.Timer(self.threshold_s, self._print, (self.describe(event.data),))
            self.timer.daemon = True
            self.timer.start()

    def on_end(self, event) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth == 0 and self.timer is not None:
                self.timer.cancel()
                self.timer = None


def install(threshold_s: float = THRESHOLD_S, package: str = KERNEL_PACKAGE, stream=None):
    """Listen to numba's compiles (once per process unless `package` differs; no numba: nothing).
    Returns the listener, or None."""
    from ..devices.cpu.jit.loader import import_numba, numba_available
    if not numba_available():
        return None
    import_numba()  # without SciPy where it can (this may be numba's first import)
    from numba.core import event
    for listener in _installed:
        if listener.package == package:
            return listener
    notice = CompileNotice(threshold_s, package, stream)

    class Listener(event.Listener):
        def on_start(self, ev):
            notice.on_start(ev)

        def on_end(self, ev):
            notice.on_end(ev)

    notice.listener = Listener()
    event.register("numba:compile", notice.listener)
    _installed.append(notice)
    return notice


def uninstall(notice) -> None:
    from numba.core import event
    event.unregister("numba:compile", notice.listener)
    _installed.remove(notice)


WARMUP_TOKENS = 16  # a micro-batch long enough to take the prompt's path (dequantize + GEMM)


def warm_up(model, n_prompt: int | None = None) -> float:
    """Run a prompt and then one token (the prompt's and decode's kernels), and empty the cache.
    The prompt: WARMUP_TOKENS tokens, then the threaded kernels long prompts reach; or, given
    n_prompt, the length of the prompt that comes next (`run`'s), whose graph and kernels are
    then the ones it uses: built, planned and loaded once, here. Returns the seconds it took."""
    install()
    start = time.perf_counter()
    tok = model.tokenizer.bos_id if model.tokenizer.bos_id is not None else 0
    with model.lock:
        model.reset()
        model.eval([tok] * min(n_prompt or WARMUP_TOKENS, model.n_ctx - 1), logits="last")
        model.eval([tok], logits="last")
        model.reset()
    if not n_prompt:
        compile_prompt_kernels()  # the CPU is in every model's scheduler (its inputs live there)
    return time.perf_counter() - start


def compile_prompt_kernels() -> None:
    """The threaded kernels a real prompt's nodes take past the small-node limit (softmax,
    norms, swiglu, rope), with the model graphs' argument types (F32 rows, the KV cache's F16 mask as
    uint16 bits, gate and up as separate tensors or halves of one; rope's those the short
    prompt gave the serial kernel), which a short prompt is too short to reach."""
    from ..devices.cpu.jit.loader import numba_available, op_kernels
    if not numba_available():
        return
    import numpy as np
    ops = op_kernels()
    x = np.zeros((1, 2, 2, 8), np.float32)
    padded = np.zeros((1, 1, 4, 8), np.uint16)
    for mask in (padded[:, :, :2], padded[:, :, :2].copy()):  # the mask's padded rows cut or not
        ops.soft_max_rows(x, np.empty_like(x), mask, np.ones(2, np.float32), np.zeros(1, np.float32),
                          np.float32(1.0), True, False)
    ops.row_norm_rows(x, np.empty_like(x), np.float32(1e-5), True)
    both = np.zeros((1, 2, 2, 16), np.float32)
    for a, g in ((x, x), (both[..., :8], both[..., 8:])):
        ops.glu_rows(a, g, np.empty_like(x), False)
    from numba import types
    work = (types.float32[:, :, ::1], types.int64[::1])  # rope_rows's shared angles (fast_ops._shared_angles)
    for signature in ops.rope.signatures:
        ops.rope_rows.compile((*signature, *work))
