"""Imports every kernel family module in this package, so each registers its table entries."""
import importlib
import pkgutil
import sys

_package = sys.modules[__package__]
for _mod in pkgutil.iter_modules(_package.__path__):
    if _mod.name not in ("families", "common"):
        importlib.import_module(f"{__package__}.{_mod.name}")
