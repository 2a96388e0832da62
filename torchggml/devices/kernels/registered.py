"""Kernels registered from user code: `register_kernel(op, kernel, device=...)`.

A registered kernel is tried before a device's built-in table for the nodes it supports, on
every backend of its device type ("CPU", "CUDA", "SIM", ... : the device's reg name). Every
KernelTable lookup asks here first (`registered_entry`), so the CPU table, the GPU table and
any device file's table honour registrations alike, and `supports_op` reflects them.

Registering or removing a kernel bumps `generation()`; graph plans compiled under another
generation are recompiled before their next compute, so no plan keeps a removed kernel.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import itertools
import sys
import threading
from pathlib import Path
from typing import Callable

from ...enums import Op, VIEW_OPS
from ...tensor import Tensor

_lock = threading.Lock()
_by_device: dict[str, list["KernelRegistration"]] = {}  # device type -> newest first
_generation = itertools.count(1)
_current_generation = 0
_suspended = 0  # > 0: lookups ignore registrations (test-ops times the built-in kernel)


def generation() -> int:
    """Changes whenever a kernel is registered, removed, suspended or resumed."""
    return _current_generation


def _bump() -> None:
    global _current_generation
    _current_generation = next(_generation)


def device_type_name(device) -> str:
    """The device type a registration is for: a name ("cuda" -> "CUDA") or a Device, whose
    type is its reg's name (SIM0 -> "SIM", CUDA1 -> "CUDA", CPU -> "CPU")."""
    if isinstance(device, str):
        name = device.strip().upper()
        if not name:
            raise ValueError("register_kernel: device must name a device type such as 'CPU', 'CUDA' or 'SIM'")
        return name
    reg = getattr(device, "reg", None)
    if reg is not None:
        return reg.get_name().upper()
    name = getattr(device, "name", None)
    if isinstance(name, str) and name:
        return name.rstrip("0123456789").upper()
    raise TypeError(f"register_kernel: device must be a device type name or a Device, got {type(device).__name__}")


class KernelRegistration:
    """The handle `register_kernel` returns; `.remove()` unregisters (idempotent). Usable as a
    context manager: the kernel is removed on exit."""

    def __init__(self, op: Op, kernel: Callable, supports: Callable | None, device_type: str, name: str):
        self.op = op
        self.kernel = kernel
        self.supports = supports
        self.device_type = device_type
        self.name = name
        self.active = True

    def __repr__(self):
        state = "" if self.active else " removed"
        return f"<ggml.KernelRegistration {self.name} for {self.op.name} on {self.device_type}{state}>"

    def takes(self, node: Tensor) -> bool:
        return self.active and node.op == self.op and (self.supports is None or bool(self.supports(node)))

    def remove(self) -> None:
        with _lock:
            if not self.active:
                return
            self.active = False
            _by_device[self.device_type].remove(self)
            _bump()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


def _as_op(op) -> Op:
    if isinstance(op, Op):
        return op
    if isinstance(op, str):
        try:
            return Op[op.strip().upper()]
        except KeyError:
            raise ValueError(f"register_kernel: no op named {op!r}") from None
    try:
        return Op(op)
    except ValueError:
        raise ValueError(f"register_kernel: no op with id {op!r}") from None


def register_kernel(op, kernel: Callable[[Tensor], None], *, device, supports: Callable[[Tensor], bool] | None = None,
                    name: str | None = None) -> KernelRegistration:
    """Register `kernel(node)` for `op` on every backend of `device`'s type.

    `kernel(node)` computes the node: it reads its sources through `ggml.to_torch(src)` (raw
    uint8 blocks for block types: `to_torch(src, raw=True)`) and writes `ggml.to_torch(node)`.
    `device`: a device type name ("CPU", "CUDA", "SIM", ...) or a Device. `supports(node) ->
    bool` picks the nodes it takes (default: every node of `op`); the others run the built-in
    kernels. The newest registration that supports a node wins. Returns a handle; `.remove()`
    unregisters it."""
    op = _as_op(op)
    if op in VIEW_OPS:
        raise ValueError(f"register_kernel: {op.name} is a view op: it computes nothing, so it takes no kernel")
    if not callable(kernel):
        raise TypeError(f"register_kernel({op.name}): kernel must be callable as kernel(node), got {type(kernel).__name__}")
    if supports is not None and not callable(supports):
        raise TypeError(f"register_kernel({op.name}): supports must be callable as supports(node) -> bool, "
                        f"got {type(supports).__name__}")
    device_type = device_type_name(device)
    reg = KernelRegistration(op, kernel, supports, device_type,
                             name or getattr(kernel, "__name__", None) or repr(kernel))
    with _lock:
        _by_device.setdefault(device_type, []).insert(0, reg)
        _bump()
    return reg


def registered_kernels(device=None) -> list[KernelRegistration]:
    """The active registrations (of one device type when `device` is given), newest first."""
    if device is None:
        return [r for regs in _by_device.values() for r in regs]
    return list(_by_device.get(device_type_name(device), ()))


def registered_entry(node: Tensor, device_type: str | None) -> KernelRegistration | None:
    """The registration that computes `node` on a device of this type, or None."""
    if device_type is None or _suspended:
        return None
    for reg in tuple(_by_device.get(device_type, ())):  # a snapshot: another thread may register
        if reg.takes(node):
            return reg
    return None


@contextlib.contextmanager
def builtin_kernels_only():
    """Within the block lookups ignore registrations (and plans recompile on both edges): how
    test-ops times the built-in kernel next to a registered one."""
    global _suspended
    with _lock:
        _suspended += 1
        _bump()
    try:
        yield
    finally:
        with _lock:
            _suspended -= 1
            _bump()


def load_kernel_files(paths) -> list:
    """Import Python files (`path/to/kernels.py`) or modules (`package.kernels`) that register
    kernels when imported; returns the modules. Used by `torchggml test-ops/run/eval/serve
    --kernels`. A missing file or a failing import raises an error naming it."""
    modules = []
    for spec in ([paths] if isinstance(paths, (str, Path)) else paths):
        text = str(spec)
        path = Path(text)
        if text.endswith(".py") or path.exists():
            if not path.is_file():
                raise FileNotFoundError(f"--kernels: no kernel file {text}")
            name = f"torchggml_user_kernels_{path.stem}_{abs(hash(str(path.resolve())))}"
            loader_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[name] = module
            try:
                loader_spec.loader.exec_module(module)
            except Exception as e:
                del sys.modules[name]
                raise RuntimeError(f"--kernels: loading {text} failed: {type(e).__name__}: {e}") from e
        else:
            try:
                module = importlib.import_module(text)
            except ImportError as e:
                raise ValueError(f"--kernels: {text} is neither a file nor an importable module: {e}") from e
        modules.append(module)
    return modules
