"""numba's runtime (NRT) set up with its compiled helpers from a disk cache.

numba's rtsys.initialize registers NRT's C functions with LLVM and compiles a small LLVM module
(atomic reference counts, a meminfo's data pointer, the unresolved-symbol abort) that every
kernel links against: LLVM's optimizer and code generator at every process start, before the
first kernel loads from numba's cache. Here that module's machine code is kept beside numba's
cache of the kernels and loaded as numba loads a cached kernel's (its codegen's
unserialize_library), keyed by what numba keys a cached kernel on (numba's and llvmlite's
versions, the target triple, CPU and features) and the settings its IR reads.

    initialize(context)   rtsys.initialize(context), its helpers loaded from the cache where
                          they are there (written there when not)
"""
from __future__ import annotations

import functools
import hashlib
import os
import struct
from pathlib import Path

_MAGIC = b"torchggml-nrt-1\n"  # then the payload's sha256, its object code's length, the object code, the bitcode


def initialize(context) -> None:
    """numba's rtsys.initialize, with _cached_helpers in place of the compile of its helpers."""
    from numba.core.runtime import nrtdynmod, rtsys
    if getattr(rtsys, "_init", False):
        return
    compile_helpers = nrtdynmod.compile_nrt_functions
    nrtdynmod.compile_nrt_functions = functools.partial(_cached_helpers, compile_helpers)
    try:
        rtsys.initialize(context)
    finally:
        nrtdynmod.compile_nrt_functions = compile_helpers


def _cached_helpers(compile_helpers, context):
    """NRT's helpers library: unserialized from the cache file, else compiled (with its object
    code kept) and written there; compile_helpers (numba's) where the cache is out of reach."""
    codegen = context.codegen()
    try:
        path = _cache_file(codegen)
    except (AttributeError, ImportError, OSError, TypeError):  # numba's cache internals moved
        return compile_helpers(context)
    if path is None:
        return compile_helpers(context)
    state = _read(path)
    if state is not None:
        try:
            return codegen.unserialize_library(("nrt", "object", state))
        except Exception:  # a file LLVM does not take: compiled again and rewritten
            pass
    from numba.core.runtime import nrtdynmod
    module, library = nrtdynmod.create_nrt_module(context)
    library.enable_object_caching()
    library.add_ir_module(module)
    library.finalize()
    _write(path, library.serialize_using_object_code()[2])
    return library


def _cache_file(codegen) -> Path | None:
    """Where numba would cache a kernel of this directory (its locators in their order:
    NUMBA_CACHE_DIR, beside the source, the user's cache), the file named by the key."""
    import llvmlite
    import numba
    from numba.core import config
    from numba.core import caching
    key = repr((numba.__version__, llvmlite.__version__, codegen.magic_tuple(), config.DEBUG_NRT,
                config.DEBUG_NRT_STACK_LIMIT, str(config.OPT), config.MACHINE_BITS))
    name = f"runtime.nrt-{hashlib.sha256(key.encode()).hexdigest()[:16]}.nbc"
    for locator_class in getattr(caching, "CacheImpl", None)._locator_classes:
        locator = locator_class.from_function(initialize, __file__)
        if locator is None:
            continue
        try:
            locator.ensure_cache_path()
        except OSError:
            continue
        return Path(locator.get_cache_path()) / name
    return None


def _read(path: Path) -> tuple[bytes, bytes] | None:
    """(object code, linking bitcode) from the file; None where it is absent, not one of ours
    or damaged (its checksum)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    start = len(_MAGIC) + 32 + 8
    if not data.startswith(_MAGIC) or len(data) < start or hashlib.sha256(data[len(_MAGIC) + 32:]).digest() != \
            data[len(_MAGIC):len(_MAGIC) + 32]:
        return None
    n = struct.unpack_from("<Q", data, start - 8)[0]
    return (data[start:start + n], data[start + n:]) if start + n <= len(data) else None


def _write(path: Path, state: tuple[bytes, bytes]) -> None:
    """The file written whole or not at all (renamed into place), silently not where the
    directory is read-only (numba does not write its cache there either)."""
    object_code, bitcode = state
    payload = struct.pack("<Q", len(object_code)) + object_code + bitcode
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(_MAGIC + hashlib.sha256(payload).digest() + payload)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
