"""Where a model lives: which device holds the input embeddings, each layer (its weights and
its KV cache), and the output head, by llama.cpp's rules (devices, n_gpu_layers, tensor_split)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

from ..backend.device import Device, DeviceType

log = logging.getLogger(__name__)


def cpu_device() -> Device:
    from ..devices.cpu import cpu_device as _cpu
    return _cpu()


def _registry():
    try:
        from ..backend import registry
    except ImportError:
        return None
    return registry


def all_devices() -> list[Device]:
    """Every device the registry knows (just the CPU until the registry exists)."""
    reg = _registry()
    if reg is None:
        return [cpu_device()]
    return [reg.backend_dev_get(i) for i in range(reg.backend_dev_count())]


def find_device(spec) -> Device:
    """A Device from a Device, or a name such as "CPU", "CUDA0", "SIM0" (case-insensitive)."""
    if isinstance(spec, Device):
        return spec
    name = str(spec)
    for dev in all_devices():
        if dev.get_name().lower() == name.lower():
            return dev
    known = ", ".join(d.get_name() for d in all_devices())
    raise ValueError(f"unknown device {name!r} (available: {known})")


def gpu_devices() -> list[Device]:
    """The accelerators, remote (RPC) devices first as llama.cpp orders them (the first layers
    go to the network, the last to the local GPUs: fewer transfers)."""
    gpus = [d for d in all_devices() if d.get_type() != DeviceType.CPU]
    if not gpus:
        return []
    from ..devices.rpc import RPCDevice
    return [d for d in gpus if isinstance(d, RPCDevice)] + [d for d in gpus if not isinstance(d, RPCDevice)]


@dataclass
class Placement:
    """Which device holds the input embeddings, each layer, and the output head."""
    input: Device
    layers: list[Device]
    output: Device

    @property
    def devices(self) -> list[Device]:
        """Distinct devices, accelerators first, the CPU last (the scheduler's priority order)."""
        seen = []
        for d in [*self.layers, self.input, self.output]:
            if all(d is not s for s in seen):
                seen.append(d)
        return sorted(seen, key=lambda d: d.get_type() == DeviceType.CPU)

    @property
    def single(self) -> bool:
        return len(self.devices) == 1

    def describe(self) -> str:
        runs = []
        for il, d in enumerate(self.layers):
            if runs and runs[-1][0] is d:
                runs[-1][2] = il
            else:
                runs.append([d, il, il])
        layers = ", ".join(f"{d.get_name()}: layers {a}-{b}" for d, a, b in runs)
        return f"input {self.input.get_name()}, {layers}, output {self.output.get_name()}"


def split_layers(n_layer: int, devices: Sequence[Device], tensor_split: Sequence[float] | None) -> list[Device]:
    """Consecutive runs of layers per device, in proportion to tensor_split (equal by default)."""
    if tensor_split is None:
        tensor_split = [1.0] * len(devices)
    if len(tensor_split) != len(devices) or any(s < 0 for s in tensor_split) or sum(tensor_split) <= 0:
        raise ValueError(f"tensor_split {list(tensor_split)} must give a non-negative share to each of "
                         f"the {len(devices)} devices")
    total = float(sum(tensor_split))
    bounds, acc = [], 0.0
    for s in tensor_split:
        acc += s
        bounds.append(round(n_layer * acc / total))
    out, start = [], 0
    for dev, end in zip(devices, bounds):
        out += [dev] * (end - start)
        start = end
    return out


def plan_placement(n_layer: int, devices=None, n_gpu_layers: int | None = None,
                   tensor_split: Sequence[float] | None = None) -> Placement:
    """llama.cpp's rules, with explicit devices as the shortcut:
    - nothing given: everything on the CPU;
    - devices only: the layers are split over them (tensor_split proportions), the input on the
      first and the output on the last;
    - n_gpu_layers (with `devices` or every accelerator): the last n_gpu_layers layers are split
      over the accelerators, the rest and the input stay on the CPU, the output moves when
      n_gpu_layers > n_layer."""
    devs = None if devices is None else [find_device(d) for d in ([devices] if isinstance(devices, (str, Device)) else devices)]
    if devs is not None and not devs:
        raise ValueError("devices is empty")
    cpu = cpu_device()
    if n_gpu_layers is None:
        if devs is None:
            return Placement(cpu, [cpu] * n_layer, cpu)
        layers = split_layers(n_layer, devs, tensor_split)
        return Placement(devs[0], layers, devs[-1])
    gpus = [d for d in (devs if devs is not None else gpu_devices()) if d.get_type() != DeviceType.CPU]
    n_gpu = max(0, min(int(n_gpu_layers), n_layer + 1))
    if not gpus or n_gpu == 0:
        if n_gpu and not gpus:
            log.warning("n_gpu_layers=%d but there is no accelerator: running on the CPU", n_gpu_layers)
        return Placement(cpu, [cpu] * n_layer, cpu)
    n_offload = min(n_gpu, n_layer)
    layers = [cpu] * (n_layer - n_offload) + split_layers(n_offload, gpus, tensor_split)
    return Placement(cpu, layers, layers[-1] if n_gpu > n_layer else cpu)
