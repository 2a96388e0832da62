"""load(): a GGUF file to a Model: the architecture and hyper-parameters, the placement of
every layer, and each weight's buffer type (the device's, or an extra buffer type with its own
layout such as the CPU's CPU_REPACK), then the weights themselves."""
from __future__ import annotations

import functools
import gc

from ..backend.device import Device
from ..backend.impl import ExtraBufferType
from ..gguf.loader import load_weights
from ..gguf.reader import GGUFError
from ..text.vocab_types import VOCAB_TYPES
from .arch_names import LLAMA_CPP_ARCHS
from .archs import SUPPORTED, arch_for
from .builder import bind_weights, is_matmul_weight, is_output_tensor, tensor_layer
from .hparams import read_hparams
from .kv_cache import kv_type_from_name
from .model import Model
from .params import ModelParams
from .placement import plan_placement


# experts, read only by MUL_MAT_ID: offered to extra buffer types too (llama.cpp asks them about
# the op that reads each weight; the CPU's fused repack layout serves MUL_MAT_ID)
EXPERT_WEIGHTS = tuple(f"ffn_{n}_exps.weight" for n in ("gate", "up", "down", "gate_up"))


def extra_buffer_types(device: Device) -> list:
    """The device's extra buffer types that take weights in their own layout (ggml's
    ggml_backend_dev_get_extra_bufts, e.g. the CPU's CPU_REPACK), as llama.cpp uses them."""
    reg = getattr(device, "reg", None)
    get = reg.get_proc_address("ggml_backend_dev_get_extra_bufts") if reg is not None else None
    return [b for b in (get(device) if get is not None else []) if isinstance(b, ExtraBufferType)]


def add_rpc_servers(endpoints) -> list[Device]:
    """The devices of ggml RPC servers, registered (so that names such as "RPC0" find them)."""
    from ..backend.registry import backend_register
    from ..devices.rpc import backend_rpc_add_server
    devices = []
    for endpoint in [endpoints] if isinstance(endpoints, str) else endpoints:
        reg = backend_rpc_add_server(endpoint)
        if reg is None:
            raise ValueError(f"RPC server at {endpoint} has no devices")
        backend_register(reg)
        devices += reg.get_devices()
    return devices


@functools.lru_cache(maxsize=None)
def _freeze_imported() -> None:
    """The objects alive before the first model's (the imported modules': torch's, torchggml's)
    frozen out of the cyclic GC: they live as long as the process, and each full collection
    walked them all. Once a process: a later load's would freeze earlier models' garbage too.
    (numba is not imported by a load: its start freezes its own objects, devices/cpu/jit/loader.py.)"""
    gc.freeze()


def load(path, params: ModelParams | None = None, **options) -> Model:
    """See torchggml.load_model."""
    from ..gguf.loader import open_gguf
    params = (params or ModelParams()).with_options(**options)
    if not params.vocab_only:
        _freeze_imported()
    file = open_gguf(path)  # the tokenizer is built from it on first use
    vocab = file.get("tokenizer.ggml.model")  # as llama.cpp, which needs it ("none": no vocabulary)
    if vocab not in VOCAB_TYPES:  # llama.cpp refuses the file
        raise GGUFError(f"{file.path}: metadata key 'tokenizer.ggml.model' = {vocab!r} is not a tokenizer "
                        f"llama.cpp knows ({', '.join(sorted(VOCAB_TYPES))})")
    if params.vocab_only:
        if file.arch not in LLAMA_CPP_ARCHS and file.arch not in SUPPORTED:
            raise GGUFError(f"{file.path}: architecture {file.arch!r} is unknown (to llama.cpp too)")
        model = Model(file, None, params)
        model.loader = load
        return model
    arch = arch_for(file.arch, file.path)
    hp = read_hparams(file, arch)
    bind_weights(arch, file.tensors, hp, file.path)  # names and shapes checked before any upload
    devices = params.devices
    if params.rpc:
        rpc_devices = add_rpc_servers(params.rpc)
        if devices is None and params.n_gpu_layers is None:
            from .placement import cpu_device
            devices = rpc_devices + [cpu_device()]
    if params.tensor_parallel is not None:
        if devices is not None or params.n_gpu_layers is not None or params.tensor_split is not None:
            raise ValueError("tensor_parallel replaces devices, n_gpu_layers and tensor_split: give only it")
        from .tensor_parallel import tensor_parallel_device
        devices = [tensor_parallel_device(file, hp, params.tensor_parallel, kv_type_from_name(params.kv_type))]
    placement = plan_placement(hp.n_layer, devices, params.n_gpu_layers, params.tensor_split)

    def device_of(name: str) -> Device:
        il = tensor_layer(name)
        if il is not None:
            if il >= hp.n_layer:
                raise ValueError(f"{path}: tensor {name!r} belongs to layer {il}, but the model has {hp.n_layer}")
            return placement.layers[il]
        if is_output_tensor(name):
            return placement.output
        return placement.input

    def buft_of(name: str):
        device = device_of(name)
        if params.repack and (is_matmul_weight(name) or name.endswith(EXPERT_WEIGHTS)):
            info = file.tensor_info(name)
            for extra in extra_buffer_types(device):
                if extra.supports_weight(info.type, info.ne):
                    return extra
        return device.get_buffer_type()

    # use_mmap=False: every CPU weight read into CPU memory (huge pages) instead of mapped
    # the skipped prediction blocks' tensors stay in the file (llama.cpp's TENSOR_SKIP)
    names = [n for n in file.tensors if not hp.n_layer_nextn or (tensor_layer(n) or 0) < hp.n_layer]
    weights = load_weights(file, buft_of, names, progress=params.progress, check_values=params.check_tensors,
                           copy=None if params.use_mmap else (lambda name: True))
    model = Model(file, None, params, arch, hp, weights, placement)
    model.loader = load
    return model
