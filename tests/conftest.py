"""Test session set-up: two simulated accelerators and Triton's CPU interpreter, so every
multi-device and kernel path runs on a machine without a GPU. Set before torchggml or triton
is imported by any test module."""
import os
from pathlib import Path

os.environ.setdefault("TORCHGGML_SIM_DEVICES", "2")
os.environ.setdefault("TRITON_INTERPRET", "1")
# tests check results, not speed: sleeping OpenMP workers keep a shared 2-core runner usable
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TORCHGGML_GOLDEN", str(Path(__file__).resolve().parents[1].parent / "shared" / "golden"))
