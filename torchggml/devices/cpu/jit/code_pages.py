"""LLVM's own machine code handed back to the page cache once the kernels it loaded run.

libllvmlite.so (LLVM: numba's optimizer, code generator and JIT linker) runs only while numba
compiles a kernel or loads one from its disk cache; the kernels then run their own machine code.
Its start-up (static initializers spread over the whole library, each page fault mapping its
neighbours too) leaves ~50 MB of its code resident in every process that imports numba, a
seventh of a small model's resident memory. After a computation that loaded or compiled
kernels, its executable mappings get MADV_DONTNEED: they are clean file pages (never written:
the library's relocations are in its other, writable mappings), so the page cache keeps them
and a later load or compile faults back in what it runs.

    note_loading()   a kernel is being loaded or compiled (loader.py)
    release()        after a computation (the CPU backend's): the pages handed back when a
                     kernel was loaded since the last time; Linux only, else nothing
"""
from __future__ import annotations

import os
import sys

LIBRARIES = ("libllvmlite",)  # file names' starts: LLVM as llvmlite ships it
_pending = []  # a kernel loaded or compiled since the last release


def note_loading() -> None:
    _pending.append(True)


def release() -> int:
    """The bytes of the libraries' executable mappings handed back (0 when no kernel was loaded
    since the last call)."""
    if not _pending:
        return 0
    _pending.clear()
    return release_code_pages(LIBRARIES)


def release_code_pages(libraries) -> int:
    """madvise(MADV_DONTNEED) over the executable file mappings ("r-xp") of the libraries whose
    file names start with one of `libraries`; the bytes of those mappings."""
    madvise = _madvise()
    if madvise is None:
        return 0
    released = 0
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 6 and fields[1] == "r-xp" and os.path.basename(fields[5]).startswith(libraries):
                    lo, hi = (int(v, 16) for v in fields[0].split("-"))
                    if madvise(lo, hi - lo) == 0:
                        released += hi - lo
    except OSError:
        pass
    return released


_madvise_fn = []


def _madvise():
    """madvise(addr, length) with MADV_DONTNEED as a callable, or None off Linux."""
    if not _madvise_fn:
        fn = None
        if sys.platform.startswith("linux"):
            import ctypes
            import mmap
            libc = ctypes.CDLL(None, use_errno=True)
            libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            libc.madvise.restype = ctypes.c_int
            fn = lambda addr, length: libc.madvise(addr, length, mmap.MADV_DONTNEED)  # noqa: E731
        _madvise_fn.append(fn)
    return _madvise_fn[0]
