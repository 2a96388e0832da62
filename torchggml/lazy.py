"""A package's names imported from their modules on first use (PEP 562), so that importing the
package imports none of them:

    __getattr__ = lazy_exports(__name__, {"Model": ".model", ...})
"""
from __future__ import annotations

import importlib
import sys


def lazy_exports(package: str, exports: dict[str, str]):
    """The module __getattr__ of `package` that imports each name of `exports` from its module
    (relative to the package) when first read, and keeps it in the package."""
    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name], package), name)
        setattr(sys.modules[package], name, value)
        return value
    return __getattr__
