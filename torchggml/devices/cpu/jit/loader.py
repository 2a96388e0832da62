"""The CPU's numba kernels, under one loader: each kernel module is imported on first use (so
numba loads only when a kernel first runs), its functions compiled for this CPU per argument
types and cached on disk by numba.

    quant_kernels()    the fused quantized products over the (q, scale, bias) layouts
                       (quant_kernels.py: matvec, quantize_rows, dequantize_*)
    op_kernels()       decode's small nodes (op_kernels.py: norms, softmax, rope, copies...)
    repack_kernels()   ggml blocks to the fused layouts at load (repack_kernels.py)
    recurrent_kernels() the recurrent ops' scans (recurrent_kernels.py)
    gemm_kernels()     the prompt's int8 GEMM over ggml's blocks (gemm_kernels.py, AVX512-VNNI/AVX-VNNI/AVX2)
    quantize_kernels() ggml's quantizers, rows in parallel (quantize_kernels.py: quantize_rows)
    dequantize_kernels() ggml's block types to float32, rows in parallel (dequantize_kernels.py)
    plan_kernels()     runs of a plan's bound kernels in one native call (plan_kernels.py)

Where numba's cache holds nothing for a module (the first use after an install), one line on
stderr says that the kernels are being compiled, once per process.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import importlib
import sys
import types
from pathlib import Path

from .code_pages import note_loading, release

# CPU seconds numba takes to compile the kernels a quantized model's first prompt and token use
# (measured on a Q4_K_M model, most of it the prompt's int8 GEMM and the decode step's native run
# with the kernels it calls): the notice's estimate
COMPILE_SECONDS = 35
_noticed = []  # the notice is printed once per process
IR_FILES = ("llvm_ir.py", "gemm_ir.py", "rounding_ir.py", "halves.py")  # the LLVM IR and helpers the kernels inline
# the kernel modules whose kernels a module's cached code holds (it calls them): an edit there too
# drops its cached kernels (else a native run would keep running the old decode products)
CALLEE_FILES = {"plan_kernels": ("quant_kernels.py", "op_kernels.py")}


def numba_available() -> bool:
    """Whether numba is installed: found on the path, not imported (a load needs no kernel, so
    numba's import waits for the first one: _load)."""
    return "numba" in sys.modules or _numba_found()


@functools.lru_cache(maxsize=None)
def _numba_found() -> bool:
    import importlib.util
    return importlib.util.find_spec("numba") is not None


def import_numba():
    """numba, imported (the first time) without the two packages its import reads only to check
    or configure, where this numba is one of LOADS_WITHOUT_REFRESH (whose import was read for
    it), a tenth of its import:
    - SciPy, whose version numba checks (>= 1.0) if it is installed: blocked for the import;
      numba's linear algebra imports it when a kernel using it compiles.
    - YAML, read by numba's config only where a .numba_config.yaml is in the working directory:
      a _Deferred module stands for it, which imports it on first use."""
    if "numba" in sys.modules:
        return sys.modules["numba"]
    import importlib.metadata
    import importlib.util
    try:
        version = importlib.metadata.version("numba")
    except importlib.metadata.PackageNotFoundError:
        version = ""
    if ".".join(version.split(".")[:2]) not in LOADS_WITHOUT_REFRESH:
        import numba
        return numba
    blocked = "scipy" not in sys.modules
    if blocked:
        sys.modules["scipy"] = None  # `import scipy` raises ImportError
    if "yaml" not in sys.modules and importlib.util.find_spec("yaml") is not None:
        sys.modules["yaml"] = _Deferred("yaml")
    try:
        import numba
    finally:
        if blocked:
            del sys.modules["scipy"]
    return numba


class _Deferred(types.ModuleType):
    """A module not imported yet: the first attribute read imports it (in its place in
    sys.modules) and every read is the module's."""

    def __getattr__(self, name):
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), name)


_started = []  # start_numba has run
_threads = []  # the worker count asked for before numba's start, which applies it


def set_numba_threads(n: int) -> None:
    """numba's worker count, capped at the pool it started with; before numba's start (a model
    loaded, no kernel run yet) kept for start_numba to apply."""
    if not _started:
        _threads[:] = [int(n)]
        return
    import numba
    numba.set_num_threads(max(1, min(int(n), numba.config.NUMBA_NUM_THREADS)))


def _apply_threads(n: int) -> None:
    """numba's worker count set, torch's kept: numba's OpenMP layer, which setting the count
    starts, resets the OpenMP count it shares with torch."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    set_numba_threads(n)
    if before is not None:
        torch.set_num_threads(before)


def cache_is_cold(module) -> bool:
    """Whether numba's disk cache holds nothing fresh for any kernel of the module (first use
    after an install or an upgrade): its first calls will compile. (A kernel a model has not
    used yet has no entry either, so one cached kernel means the cache is warm.)"""
    from numba.core.registry import CPUDispatcher
    indexes = [fn._cache._cache_file for fn in vars(module).values()
               if isinstance(fn, CPUDispatcher) and hasattr(getattr(fn, "_cache", None), "_cache_file")]
    return bool(indexes) and not any(index._load_index() for index in indexes)


def _drop_cache_of_older_ir(module) -> None:
    """numba keys a cached kernel on its own file only; the LLVM IR the kernels inline lives in
    IR_FILES (and the kernels some call in CALLEE_FILES), so a change there drops the module's
    cached kernels (else they would run the old IR). Installs change every file; this is for
    edits in a checkout."""
    from numba.core.registry import CPUDispatcher
    caches = [fn._cache for fn in vars(module).values()
              if isinstance(fn, CPUDispatcher) and hasattr(getattr(fn, "_cache", None), "cache_path")]
    if not caches:
        return
    name = module.__name__.rsplit('.', 1)[-1]
    files = IR_FILES + CALLEE_FILES.get(name, ())
    ir_hash = hashlib.sha256(b"".join(Path(__file__).with_name(f).read_bytes() for f in files)).hexdigest()[:16]
    stamp = Path(caches[0].cache_path) / f"{name}.llvm_ir-hash"
    if stamp.exists() and stamp.read_text() == ir_hash:
        return
    for cache in caches:
        cache.flush()
    try:
        stamp.write_text(ir_hash)
    except OSError:  # a read-only cache: numba does not write there either
        pass


def _lean_caches(module) -> None:
    """The module's kernels drop their parsed LLVM IR once loaded from numba's cache (linking_ir.py)."""
    from numba.core.registry import CPUDispatcher
    from .linking_ir import lean_cache
    for fn in vars(module).values():
        if isinstance(fn, CPUDispatcher):
            lean_cache(fn)


_warm = []  # a module loaded in this process found its kernels in numba's cache


# numba versions whose C symbols _set_up_for_loading registers as its refresh does (checked by
# reading their sources: every llvmlite add_symbol outside the contexts' construction is in the
# runtime's initialize, numba.cpython.hashing's import and the parallel kernels' reload_init)
LOADS_WITHOUT_REFRESH = ("0.68",)


@functools.lru_cache(maxsize=None)
def start_numba() -> None:
    """numba imported (import_numba) and set up once, before the first kernel loads (_load), then
    the worker count asked for before (set_numba_threads) applied and the process's objects
    frozen for the cyclic GC.
    - Where numba's version is in LOADS_WITHOUT_REFRESH, only what a kernel loaded from numba's
      disk cache needs (_set_up_for_loading), and the kernels load with that alone
      (_load_cached); a kernel that compiles gets numba's full set-up from numba's compiler.
    - Elsewhere numba's own refresh, as its first kernel load does, with its numpy support
      imported without SciPy's linear algebra: numba.np.arraymath imports scipy.linalg only to
      learn whether np.convolve and np.correlate may call BLAS (SciPy's array API layer,
      numpy.f2py, ...: a third of a small model's load). Blocked for it, numba uses its own loop
      for those two (no kernel here calls them); np.dot and np.linalg still import SciPy when a
      kernel using them compiles.
    - The objects alive now are almost all module state (numba's, and the model's that runs the
      kernel) that lives as long as the process; each full collection walked them all.
      gc.freeze() leaves them out of later collections.
    - LLVM's code pages that numba's start left resident are handed back (code_pages.py)."""
    import_numba()
    from numba.core.registry import cpu_target
    if _loads_without_refresh():
        _set_up_for_loading(cpu_target.target_context)
    else:
        with _arraymath_without_scipy():
            import numba.np.arraymath  # noqa: F401
        cpu_target.target_context.refresh()
    note_loading()
    release()  # LLVM's start-up code (code_pages.py): what the kernels' loads run comes back then
    _started.append(True)
    # numba's thread pool started now, whether or not a count was asked: a parallel kernel
    # loaded from the disk cache does not start it (its first call crashed)
    import numba
    _apply_threads(_threads.pop() if _threads else numba.config.NUMBA_NUM_THREADS)
    gc.freeze()


@contextlib.contextmanager
def _arraymath_without_scipy():
    """numba.np.arraymath imported (where it is not yet) with `import scipy.linalg` failing."""
    if "numba.np.arraymath" in sys.modules or "scipy.linalg" in sys.modules:
        yield
        return
    sys.modules["scipy.linalg"] = None  # `import scipy.linalg` raises ImportError
    try:
        yield
    finally:
        del sys.modules["scipy.linalg"]


def _loads_without_refresh() -> bool:
    """Whether this numba is one of LOADS_WITHOUT_REFRESH and has the pieces _load_cached uses."""
    import numba
    from numba.core import caching
    from numba.core.runtime import rtsys
    return (".".join(numba.__version__.split(".")[:2]) in LOADS_WITHOUT_REFRESH and hasattr(rtsys, "initialize")
            and hasattr(caching.Cache, "_load_overload") and hasattr(caching.Cache, "_guard_against_spurious_io_errors"))


def _set_up_for_loading(context) -> None:
    """What code from numba's disk cache links against: numba's runtime (NRT: its C functions
    and the helpers it compiles, here loaded from a cache of their own: runtime_cache.py) and
    the hash secrets numba.cpython.hashing registers as C symbols on import. numba's refresh,
    which its Cache.load_overload calls, also imports every lowering and typing registry (its
    @overload declarations, most of the set-up): only a compile reads those, and numba's
    compiler refreshes both contexts itself before each compile (CompilerBase)."""
    import numba.cpython.hashing  # noqa: F401
    from .runtime_cache import initialize
    initialize(context)


def _load_cached(cache, sig, target_context):
    """numba's Cache.load_overload (a kernel's compiled code from the disk cache, or None), with
    _set_up_for_loading in place of its refresh."""
    _set_up_for_loading(target_context)
    note_loading()  # LLVM runs: its code pages are handed back after the computation (code_pages.py)
    # a kernel whose code calls numba's numpy implementations imports numba.np.arraymath as its
    # environment is rebuilt: without SciPy's linear algebra there too
    with cache._guard_against_spurious_io_errors(), _arraymath_without_scipy():
        return cache._load_overload(sig, target_context)


def _load_kernels_without_refresh(module) -> None:
    """The module's kernels load from numba's cache with _load_cached."""
    from numba.core.registry import CPUDispatcher
    if not _loads_without_refresh():
        return
    for fn in vars(module).values():
        cache = getattr(fn, "_cache", None) if isinstance(fn, CPUDispatcher) else None
        if cache is not None and hasattr(cache, "_load_overload"):  # NullCache: a kernel without cache=True
            cache.load_overload = functools.partial(_load_cached, cache)


@functools.lru_cache(maxsize=None)
def _load(name: str):
    try:
        start_numba()
    except ImportError as e:  # found on the path (numba_available) but broken
        raise ImportError(f"torchggml's CPU kernels need numba, and importing it failed: {e} "
                          f"(reinstall it: pip install --force-reinstall numba)") from e
    note_loading()  # its kernels load (or compile) on their first calls
    module = importlib.import_module(f"{__package__}.{name}")
    _lean_caches(module)
    _load_kernels_without_refresh(module)
    try:
        _drop_cache_of_older_ir(module)
        cold = cache_is_cold(module)
    except (AttributeError, OSError, ValueError):  # numba's cache internals moved: no notice
        cold = False
    if not cold:
        _warm.append(name)
    # a module can be cold in a warm cache: its kernels called only from another module's
    # (plan_kernels runs the decode matvecs), whose cached code holds them
    if cold and not _noticed and not _warm:
        _noticed.append(name)
        print(f"torchggml: compiling CPU kernels (first use, ~{COMPILE_SECONDS} s; cached for later runs)...",
              file=sys.stderr, flush=True)
    return module


class BoundKernel:
    """A numba kernel bound to its arguments (numpy views of fixed memory, scalars) when a plan
    is compiled: call(node) runs kernel(*args). `check`, when given, receives the kernel's
    result and raises for a failure it reports (an index out of range). native_plan.py reads
    kernel and args to run many bound kernels in one native call."""

    __slots__ = ("kernel", "args", "check")

    def __init__(self, kernel, *args, check=None):
        self.kernel, self.args, self.check = kernel, args, check

    def __call__(self, _node=None) -> None:
        result = self.kernel(*self.args)
        if self.check is not None:
            self.check(result)

    def __repr__(self):
        return f"<BoundKernel {getattr(self.kernel, '__name__', self.kernel)}>"


def quant_kernels():
    """The fused products' kernels (quant_kernels.py)."""
    return _load("quant_kernels")


def op_kernels():
    """The small nodes' kernels (op_kernels.py)."""
    return _load("op_kernels")


def repack_kernels():
    """The load's conversions to the fused layouts (repack_kernels.py)."""
    return _load("repack_kernels")


def recurrent_kernels():
    """The recurrent ops' scans (recurrent_kernels.py)."""
    return _load("recurrent_kernels")


def plan_kernels():
    """Runs of a plan's bound kernels in one native call (plan_kernels.py)."""
    return _load("plan_kernels")


def gemm_kernels():
    """The prompt's int8 GEMM (gemm_kernels.py)."""
    return _load("gemm_kernels")


def quantize_kernels():
    """ggml's quantizers (quantize_kernels.py)."""
    return _load("quantize_kernels")


def dequantize_kernels():
    """ggml's block types to float32 (dequantize_kernels.py)."""
    return _load("dequantize_kernels")
