"""docs/kernel_tutorial.md runs: its Python blocks, in order, under Triton's interpreter on SIM0
(writing, registering, testing and timing a fused Q4_0 matvec)."""
import re
from pathlib import Path

import torchggml as ggml

DOC = Path(__file__).resolve().parents[1] / "docs" / "kernel_tutorial.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_tutorial_runs_end_to_end(capsys):
    blocks = python_blocks(DOC.read_text())
    assert len(blocks) == 6
    namespace = {"__name__": "kernel_tutorial"}
    try:
        exec(compile("\n".join(blocks), str(DOC), "exec"), namespace)
    finally:
        for reg in ggml.registered_kernels():
            reg.remove()
    out = capsys.readouterr().out
    assert "KernelRegistration q4_0_matvec for MUL_MAT on SIM" in out
    assert out.count(": OK (nmse") == len(namespace["cases"]) >= 2
    assert "registered:" in out and "built-in:" in out and "GB/s" in out
    assert namespace["CALLS"]
