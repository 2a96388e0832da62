"""The TORCHGGML_* environment variables (declared once, listed in docs/environment.md, bad values
named) and the progress bars they control."""
from pathlib import Path
import re
import sys
import pytest

ROOT = Path(__file__).resolve().parents[1]


PROGRESS = [  # (wanted, bytes, on a terminal, TORCHGGML_PROGRESS, shown)
    (True, 2**30, True, None, True),
    (True, 2**30, False, None, False),   # a log file: no carriage returns
    (True, 2**20, True, None, False),    # small: done before a bar means anything
    (False, 2**30, True, None, False),
    (True, 2**30, True, "0", False),
]


@pytest.mark.parametrize("wanted,size,tty,env,shown", PROGRESS)
def test_progress_bars_only_on_a_terminal_and_for_large_uploads(monkeypatch, wanted, size, tty, env, shown):
    from torchggml.gguf.loader import show_progress

    class Stream:
        def isatty(self):
            return tty

        def write(self, text):
            pass
    monkeypatch.setattr(sys, "stderr", Stream())
    if env is None:
        monkeypatch.delenv("TORCHGGML_PROGRESS", raising=False)
    else:
        monkeypatch.setenv("TORCHGGML_PROGRESS", env)
    assert show_progress(wanted, size) == shown


def test_every_environment_variable_is_declared_and_listed():
    from torchggml import config
    used = set()
    for path in (ROOT / "torchggml").rglob("*.py"):
        text = path.read_text()
        used |= set(re.findall(r"TORCHGGML_[A-Z0-9_]+", text))
        if path.name != "config.py":  # only config.py reads them from the environment
            reads = re.findall(r"(?:environ(?:\.get)?\(|environ\[|getenv\()\s*[\"']TORCHGGML_", text)
            assert not reads, f"{path} reads a TORCHGGML_ variable itself: use torchggml.config"
    table = (ROOT / "docs" / "environment.md").read_text()
    assert used <= set(config.VARIABLES), used - set(config.VARIABLES)
    for name in config.VARIABLES:
        assert f"`{name}`" in table, f"{name} is not in docs/environment.md"


def test_a_bad_environment_value_names_the_variable(monkeypatch):
    from torchggml import config
    monkeypatch.setenv("TORCHGGML_OP_OFFLOAD_MIN_BATCH", "lots")
    with pytest.raises(ValueError, match=r"TORCHGGML_OP_OFFLOAD_MIN_BATCH='lots': .*expected int"):
        config.value("TORCHGGML_OP_OFFLOAD_MIN_BATCH")
