"""Kernels loaded from numba's disk cache without their parsed LLVM IR.

numba's cache holds each kernel's machine code and the LLVM bitcode that a kernel compiled
later links in when it calls this one. Loading parses that bitcode into an LLVM module and keeps
it for the life of the process: several MB of LLVM's memory a kernel (10 MB for plan_kernels'
run_program), ~15 MB for a small model's first prompt and decode. The machine code is what runs,
so after a load the parsed module is dropped and the bitcode kept as bytes (about a tenth of
that), parsed again only if a kernel compiled later calls this one.

    lean_cache(dispatcher)   its cache's loads from now on drop the parsed IR (idempotent;
                             nothing changes where numba's internals are not as expected)
"""
from __future__ import annotations


def _lean_cache_class():
    from numba.core.caching import FunctionCache

    class LeanFunctionCache(FunctionCache):
        """numba's FunctionCache whose loaded kernels keep their linking IR as bitcode only."""

        def _load_overload(self, sig, target_context):
            # numba's own, which keeps the cached payload at hand: its bitcode is the one kept
            if not self._enabled:
                return None
            data = self._cache_file.load(self._index_key(sig, target_context.codegen()))
            if data is None:
                return None
            cres = self._impl.rebuild(target_context, data)
            drop_linking_ir(cres.library, _cached_bitcode(data))
            return cres

    return FunctionCache, LeanFunctionCache


_classes = []
_NUMBA_CACHE_PARTS = ("_enabled", "_cache_file", "_index_key", "_impl")  # what _load_overload reads


def lean_cache(dispatcher) -> None:
    if not _classes:
        _classes.extend(_lean_cache_class())
    base, lean = _classes
    cache = getattr(dispatcher, "_cache", None)
    if type(cache) is base and all(hasattr(cache, name) for name in _NUMBA_CACHE_PARTS):
        cache.__class__ = lean


def _cached_bitcode(payload) -> bytes | None:
    """The linking bitcode of a cached CompileResult's payload: (libdata, ...), libdata
    (name, "object", (object code, bitcode)); None where the payload is not of that shape."""
    try:
        _, kind, (_, bitcode) = payload[0]
    except (TypeError, ValueError, IndexError):
        return None
    return bitcode if kind == "object" and isinstance(bitcode, bytes) else None


def drop_linking_ir(library, bitcode: bytes | None = None) -> None:
    """Drop a loaded library's parsed linking module, keeping its bitcode (serialized again
    when not given) to parse on demand."""
    module = getattr(library, "_shared_module", None)
    if module is None or "_get_module_for_linking" in vars(library):
        return
    import llvmlite.binding as llvm
    bitcode = bitcode or module.as_bitcode()

    def module_for_linking():
        if library._shared_module is None:
            library._shared_module = llvm.parse_bitcode(bitcode)
        return library._shared_module

    library._get_module_for_linking = module_for_linking
    library._shared_module = None
