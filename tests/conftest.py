"""Test session set-up: two simulated accelerators and Triton's CPU interpreter, so every
multi-device and kernel path runs on a machine without a GPU. Set before torchggml or triton
is imported by any test module."""
import os
from pathlib import Path

import pytest

os.environ.setdefault("TORCHGGML_SIM_DEVICES", "2")
os.environ.setdefault("TRITON_INTERPRET", "1")
# tests check results, not speed: sleeping OpenMP workers keep a shared 2-core runner usable
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TORCHGGML_GOLDEN", str(Path(__file__).resolve().parents[1].parent / "shared" / "golden"))


# ---------------------------------------------------------------- the slow marker

def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", help="also run the tests marked slow (the large tables)")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: large tables, run with --slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--slow"):
        return
    skip = pytest.mark.skip(reason="slow: run with pytest --slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
