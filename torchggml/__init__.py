"""torchggml: ggml's backend system on PyTorch.

    import torchggml as ggml

C names are mirrored by deleting `ggml_` (ggml_mul_mat -> ggml.mul_mat). The names (torchggml/_api.py) are
grouped by object as ggml.h, ggml-alloc.h, ggml-backend.h and ggml-cpu.h group them;
docs/architecture.md describes the layers behind them.
"""
# The names are imported on first use (PEP 562), all at once, from torchggml/_api.py: importing
# torchggml, or a submodule such as torchggml.cli, does not import torch until a name is asked for.
import builtins as _builtins
import importlib as _importlib
from importlib.util import find_spec as _find_spec

__version__ = "0.1.0"


def _load_api():
    return _importlib.import_module("torchggml._api")


def __getattr__(name: str):
    if name.startswith("__") and name != "__all__":
        raise AttributeError(f"module 'torchggml' has no attribute {name!r}")
    if _find_spec(f"{__name__}.{name}") is not None:  # a submodule: `from torchggml import config`
        return _importlib.import_module(f"{__name__}.{name}")
    api = _load_api()
    try:
        value = getattr(api, name)
    except AttributeError:
        raise AttributeError(f"module 'torchggml' has no attribute {name!r}") from None
    globals().update((n, getattr(api, n)) for n in api.__all__)
    return value


def __dir__():
    # (the ops shadow builtins such as set and abs in this module's globals)
    return _builtins.sorted(_builtins.set(globals()) | _builtins.set(_load_api().__all__))
