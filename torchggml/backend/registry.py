"""The backend registry (ggml-backend-reg): regs and their devices, enumeration by index, name
and type, backend initialisation, and plugins loaded from Python modules.

Built-in regs come from the device files of the devices package: every module there
with a `backend_reg()` function is one, found by scanning the package (as upstream's registry
finds backend libraries in a directory), so a new device is a new file. backend_reg() returns
the reg, or None when its devices are absent; the module's REG_ORDER (default 50) orders them:
CUDA, MPS, ..., SIM, CPU last (upstream's order). Regs registered or loaded later follow.
Every registry call asks the device files again (cheap: their regs are cached), so a reg that
follows the environment (SIM: TORCHGGML_SIM_DEVICES) takes effect without restarting.

A plugin is a Python module (a .py file or a dotted module name) with a `backend_reg()`
function returning a `Reg`. `backend_load_all()` loads the `torchggml.backends` entry-point
group (each entry point names such a module or the function itself) and every file or
directory listed in TORCHGGML_BACKEND_PATH (os.pathsep-separated).
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import pkgutil
import re
import sys
import threading
import warnings
from pathlib import Path

import torch

from .. import config
from .impl import Device, DeviceType, Reg

ENTRY_POINT_GROUP = "torchggml.backends"
BACKEND_PATH_ENV = "TORCHGGML_BACKEND_PATH"


DEVICE_PACKAGE = "torchggml.devices"
DEFAULT_REG_ORDER = 50


class _Registry:
    def __init__(self):
        self.device_files = _device_files()
        self.builtin: list[Reg] = []               # the device files' regs now present
        self.regs: list[Reg] = []
        self.extra_devices: list[Device] = []     # backend_device_register
        self.plugins: dict[str, Reg] = {}          # module name or entry point -> its reg
        self.unloaded: list[Reg] = []              # built-in regs the user unloaded stay out


_lock = threading.RLock()
_state: _Registry | None = None


def _device_files() -> list:
    """The device modules of the devices package (those with backend_reg()), in REG_ORDER."""
    package = importlib.import_module(DEVICE_PACKAGE)
    shared = set(getattr(package, "SHARED", ()))
    modules = [importlib.import_module(f"{DEVICE_PACKAGE}.{m.name}")
               for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_") and m.name not in shared]
    files = [m for m in modules if callable(getattr(m, "backend_reg", None))]
    return sorted(files, key=lambda m: getattr(m, "REG_ORDER", DEFAULT_REG_ORDER))


def _sync_builtin(state: _Registry) -> None:
    """The device files' regs in their order ahead of the others; a reg a device file no
    longer gives (the environment changed) leaves, an unloaded one stays out."""
    current = [reg for reg in (f.backend_reg() for f in state.device_files) if reg is not None]
    if current == state.builtin:
        return
    others = [r for r in state.regs if r not in state.builtin and r not in current]
    state.builtin = current
    state.regs = [r for r in current if r not in state.unloaded] + others


def _registry() -> _Registry:
    global _state
    with _lock:
        if _state is None:
            _state = _Registry()
        _sync_builtin(_state)
        return _state


def _devices() -> list[Device]:
    state = _registry()
    devices = [d for reg in state.regs for d in reg.get_devices()]
    return devices + [d for d in state.extra_devices if d not in devices]


# ---------------------------------------------------------------- registration

def _check_reg(reg, where: str) -> Reg:
    if not isinstance(reg, Reg):
        raise TypeError(f"{where}: expected a torchggml Reg, got {type(reg).__name__}")
    if getattr(reg, "api_version", None) != Reg.api_version:
        raise ValueError(f"{where}: reg {reg.get_name()} has API version {getattr(reg, 'api_version', None)}, "
                         f"torchggml needs {Reg.api_version}")
    return reg


def backend_register(reg: Reg) -> None:
    """Add a reg (and its devices) to the registry; registering it again does nothing."""
    _check_reg(reg, "backend_register")
    state = _registry()
    with _lock:
        if reg in state.regs:
            return
        if reg in state.unloaded:  # a built-in reg is back in its place
            state.unloaded.remove(reg)
            state.regs = [r for r in state.builtin if r not in state.unloaded] + \
                [r for r in state.regs if r not in state.builtin]
        else:
            state.regs.append(reg)


def backend_device_register(device: Device) -> None:
    """Add a single device (outside any registered reg's list) to the device enumeration."""
    if not isinstance(device, Device):
        raise TypeError(f"backend_device_register: expected a torchggml Device, got {type(device).__name__}")
    state = _registry()
    with _lock:
        if device not in _devices():
            state.extra_devices.append(device)


# ---------------------------------------------------------------- regs

def backend_reg_count() -> int:
    return len(_registry().regs)


def backend_reg_get(index: int) -> Reg:
    regs = _registry().regs
    if not 0 <= index < len(regs):
        raise IndexError(f"backend_reg_get: {len(regs)} regs are registered, no index {index}")
    return regs[index]


def backend_reg_by_name(name: str) -> Reg | None:
    """The reg called `name` (case-insensitive), or None."""
    name = name.lower()
    return next((r for r in _registry().regs if r.get_name().lower() == name), None)


# ---------------------------------------------------------------- devices

def backend_dev_count() -> int:
    return len(_devices())


def backend_dev_get(index: int) -> Device:
    devices = _devices()
    if not 0 <= index < len(devices):
        raise IndexError(f"backend_dev_get: {len(devices)} devices are registered, no index {index}")
    return devices[index]


def backend_dev_by_name(name: str) -> Device | None:
    """The device called `name` (case-insensitive), or None."""
    name = name.lower()
    return next((d for d in _devices() if d.get_name().lower() == name), None)


def backend_dev_by_type(type: DeviceType) -> Device | None:
    """The first device of `type`, or None."""
    type = DeviceType(type)
    return next((d for d in _devices() if d.get_type() == type), None)


def backend_dev_for_torch_device(device) -> Device:
    """The ggml device whose memory is `device`'s (cpu -> CPU, cuda:N -> CUDAN, mps -> MPS):
    the last built-in device on that torch device (the CPU, past simulated devices on CPU
    memory)."""
    device = torch.device(device)
    index = device.index
    if index is None and device.type != "cpu":
        try:
            index = torch.get_device_module(device.type).current_device()
        except (AttributeError, RuntimeError):
            index = 0
    state = _registry()
    found = None
    for reg in state.builtin:
        for d in reg.get_devices():
            own = getattr(d, "torch_device", None)
            if own is not None and own.type == device.type and (own.index or 0) == (index or 0):
                found = d
    if found is None:
        kinds = sorted({d.torch_device.type for r in state.builtin for d in r.get_devices()
                        if getattr(d, "torch_device", None) is not None})
        raise ValueError(f"no ggml device for torch device {device} (devices here: {', '.join(kinds)})")
    return found


# ---------------------------------------------------------------- backends

def backend_init_by_name(name: str, params: str | None = None):
    """A new backend on the device called `name` (case-insensitive); ValueError if none."""
    dev = backend_dev_by_name(name)
    if dev is None:
        names = ", ".join(d.get_name() for d in _devices())
        raise ValueError(f"backend_init_by_name: no device named {name!r} (devices: {names})")
    return dev.init_backend(params)


def backend_init_by_type(type: DeviceType, params: str | None = None):
    """A new backend on the first device of `type`, or None when there is none."""
    dev = backend_dev_by_type(type)
    return dev.init_backend(params) if dev is not None else None


def backend_init_best():
    """A backend on the best device: the first GPU, else the first IGPU, else the CPU."""
    for type in (DeviceType.GPU, DeviceType.IGPU, DeviceType.CPU):
        dev = backend_dev_by_type(type)
        if dev is not None:
            return dev.init_backend(None)
    return None


# ---------------------------------------------------------------- plugins

def _module_name_for_file(path: Path) -> str:
    stem = re.sub(r"\W", "_", path.stem)
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    return f"torchggml_plugin_{stem}_{digest}"


def _import_plugin(path: str):
    """Import a plugin from a .py file or a dotted module name; (module, key)."""
    p = Path(path).expanduser()
    if p.suffix == ".py" or os.sep in path or p.exists():
        p = p.resolve()
        if p.is_dir():
            raise ImportError(f"backend_load: {path} is a directory; use backend_load_all_from_path")
        if not p.is_file():
            raise FileNotFoundError(f"backend_load: no plugin file {path}")
        name = _module_name_for_file(p)
        if name in sys.modules:
            return sys.modules[name], name
        spec = importlib.util.spec_from_file_location(name, p)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        return module, name
    return importlib.import_module(path), path


def _reg_from(obj, where: str) -> Reg:
    """A Reg from what a plugin offers: a Reg, a module with backend_reg(), or a factory."""
    if not isinstance(obj, Reg):
        factory = obj if callable(obj) else getattr(obj, "backend_reg", None)
        if not callable(factory):
            raise ImportError(f"{where}: no backend_reg() function returning a torchggml Reg")
        obj = factory()
    return _check_reg(obj, where)


def _register_plugin(key: str, make_reg) -> Reg:
    state = _registry()
    with _lock:
        reg = state.plugins.get(key)
        if reg is None or reg not in state.regs:
            reg = make_reg()
            state.plugins[key] = reg
            backend_register(reg)
        return reg


def backend_load(path: str) -> Reg:
    """Load a plugin (a .py file or a dotted module name whose module has backend_reg()),
    register its reg and return it. Loading the same plugin again returns the same reg."""
    module, key = _import_plugin(str(path))
    return _register_plugin(key, lambda: _reg_from(module, f"backend_load({path})"))


def backend_unload(reg: Reg) -> None:
    """Unregister a reg and its devices; a plugin's module is forgotten so a later
    backend_load imports it afresh."""
    state = _registry()
    with _lock:
        if reg not in state.regs:
            raise ValueError(f"backend_unload: reg {getattr(reg, 'name', reg)!r} is not registered")
        state.regs.remove(reg)
        state.extra_devices = [d for d in state.extra_devices if d.reg is not reg]
        if reg in state.builtin:
            state.unloaded.append(reg)
        for key, loaded in list(state.plugins.items()):
            if loaded is reg:
                del state.plugins[key]
                sys.modules.pop(key, None)


def backend_load_all_from_path(dir_path: str) -> list[Reg]:
    """Load every plugin file (*.py, not starting with '_') in a directory; a file that fails
    is skipped with a warning. Returns the regs loaded."""
    regs = []
    for file in sorted(Path(dir_path).expanduser().glob("*.py")):
        if not file.name.startswith("_"):
            reg = _load_or_warn(str(file))
            if reg is not None:
                regs.append(reg)
    return regs


def _load_or_warn(path: str) -> Reg | None:
    try:
        return backend_load(path)
    except Exception as e:  # noqa: BLE001 - one broken plugin must not stop the others
        warnings.warn(f"backend_load_all: skipping {path}: {type(e).__name__}: {e}", RuntimeWarning, stacklevel=3)
        return None


def backend_load_all() -> list[Reg]:
    """Load the `torchggml.backends` entry points and the plugins in TORCHGGML_BACKEND_PATH;
    failures are warnings. Returns the regs loaded."""
    regs = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        where = f"entry point {ep.name} = {ep.value}"
        try:
            regs.append(_register_plugin(f"entry-point:{ep.value}", lambda ep=ep: _reg_from(ep.load(), where)))
        except Exception as e:  # noqa: BLE001
            warnings.warn(f"backend_load_all: skipping {where}: {type(e).__name__}: {e}", RuntimeWarning, stacklevel=2)
    for entry in config.value(BACKEND_PATH_ENV):
        if Path(entry).expanduser().is_dir():
            regs += backend_load_all_from_path(entry)
        else:
            reg = _load_or_warn(entry)
            if reg is not None:
                regs.append(reg)
    return regs
