"""Every TORCHGGML_* environment variable, declared once: its type, default and meaning.

    from torchggml import config
    config.value("TORCHGGML_SIM_DEVICES")      # -> int, parsed; ValueError naming the variable

The code reads the environment only through `value` (or `text`, for a module that checks the
text itself), which looks the variable up when it is used (so a program or a test may change
it) and parses each distinct text once; an empty variable counts as unset, and a value that does
not parse raises ValueError naming the variable and what it expects. `describe()` is the
table docs/environment.md lists (`python -m torchggml.config` prints it); tests/test_config.py checks the
two agree and that no other module reads a TORCHGGML_ variable from os.environ.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected 0/1 (or true/false)")


def _int(text: str) -> int:
    return int(text.strip() or 0)


def _text(text: str) -> str:
    return text.strip()


def _paths(text: str) -> list[str]:
    return [p for p in text.split(os.pathsep) if p]


@dataclass(frozen=True)
class Variable:
    name: str
    type: str        # what the text is parsed as (docs/environment.md's column)
    default: object  # the value when the variable is unset
    doc: str
    parse: Callable[[str], object]


VARIABLES = {v.name: v for v in (
    Variable("TORCHGGML_SIM_DEVICES", "int", 0, "number of simulated GPUs SIM0.. to register (tests use 2)", _int),
    Variable("TORCHGGML_SIM_MEMORY", "size", "", "memory of each SIM device in bytes, K/M/G suffixes allowed "
             "(unset: unlimited)", _text),
    Variable("TORCHGGML_CPU_PATH", "text", "", "the CPU's quantized product path (fused, int4...; unset: this "
             "CPU's default)", _text),
    Variable("TORCHGGML_CPU_GEMM", "text", "", "the CPU's prompt GEMM: int8 (Q8_0/Q4_0/Q4_K/Q5_K/Q6_K blocks, "
             "AVX512-VNNI, AVX-VNNI or AVX2, and the fused layout's types from 16 rows; int8 also puts Q4_1 on it), "
             "or f32 or bf16 for "
             "dequantized weights (unset: chosen by the CPU's features)", _text),
    Variable("TORCHGGML_CPU_THREADS", "text", "adaptive", "the CPU backend's thread count per plan: adaptive (the "
             "fastest of its n_threads and fewer, re-tried as the machine's load changes; docs/cpu.md) or fixed "
             "(always n_threads)", _text),
    Variable("TORCHGGML_OMP_WAIT", "text", "auto", "OpenMP's wait policy when OMP_WAIT_POLICY and GOMP_SPINCOUNT "
             "are unset: auto (PASSIVE where the process starts on a busy machine, else the runtime's default; "
             "docs/cpu.md), passive, or default", _text),
    Variable("TORCHGGML_CPU_FAST_OPS", "bool", True, "0 turns off the CPU's fast element-wise kernels", _bool),
    Variable("TORCHGGML_CPU_NATIVE_RUNS", "bool", True, "0 runs a CPU graph plan's numba kernels one Python "
             "call each, not consecutive ones in one native call", _bool),
    Variable("TORCHGGML_OP_OFFLOAD_MIN_BATCH", "int", 32, "the scheduler offloads a CPU weight's op to an "
             "accelerator from this batch size on (llama.cpp's GGML_OP_OFFLOAD_MIN_BATCH)", _int),
    Variable("TORCHGGML_SCHED_DEBUG", "int", 0, "1 prints the scheduler's splits, 2 its assignment table "
             "(GGML_SCHED_DEBUG is read when this is unset)", _int),
    Variable("TORCHGGML_PROFILE", "bool", False, "1 records one profiler range per graph node", _bool),
    Variable("TORCHGGML_BACKEND_PATH", "paths", [], "directories (os.pathsep-separated) searched for backend "
             "plugins", _paths),
    Variable("TORCHGGML_CACHE", "path", "~/.cache/torchggml", "where the demo and benchmark models are written",
             _text),
    Variable("TORCHGGML_PROGRESS", "bool", True, "0 hides the progress bars (shown only on a terminal, for "
             "uploads of 64 MiB and more)", _bool),
    Variable("TORCHGGML_API_KEY", "text", "", "torchggml serve: the key clients must send as a Bearer token "
             "(--api-key overrides; unset: no key)", _text),
    Variable("TORCHGGML_TEST_OPS_FULL", "bool", False, "torchggml test-ops: 1 runs every breadth case (as --full), "
             "not a representative sample", _bool),
    Variable("TORCHGGML_GOLDEN", "path", "../shared/golden", "tests and scripts: the golden reference data", _text),
    Variable("TORCHGGML_TEST_DEVICE", "text", "SIM0", "tests: the accelerator the device tests target (CUDA0 on "
             "a GPU: scripts/gpu_check.py sets it)", _text),
    Variable("TORCHGGML_VOCAB_CACHE", "path", "~/.cache/torchggml/vocab", "tests and scripts: llama.cpp's "
             "vocabulary files (scripts/fetch_llama_vocab.py)", _text),
)}

_parsed: dict[tuple[str, str], object] = {}


def value(name: str):
    """The variable's value: parsed from the environment, or its default when unset."""
    var = VARIABLES[name]  # KeyError: an undeclared variable is a bug here
    text = os.environ.get(name)
    if name == "TORCHGGML_SCHED_DEBUG" and not text:
        text = os.environ.get("GGML_SCHED_DEBUG")
    if not text:  # unset or empty
        return var.default
    key = (name, text)
    if key not in _parsed:
        try:
            _parsed[key] = var.parse(text)
        except ValueError as e:
            raise ValueError(f"{name}={text!r}: {e} (expected {var.type}: {var.doc})") from None
    return _parsed[key]


def text(name: str) -> str:
    """The variable's raw text ("" when unset), for a module that parses it with its own checks."""
    VARIABLES[name]  # KeyError: an undeclared variable is a bug here
    return os.environ.get(name, "")


def describe() -> str:
    """The table of variables, as docs/environment.md lists them."""
    return "\n".join(f"| `{v.name}` | {v.type} | `{v.default!r}` | {v.doc} |" for v in VARIABLES.values())


if __name__ == "__main__":
    print(describe())
