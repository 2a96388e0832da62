"""The README and docs/*.md run as written: every ```python block is executed, in order, in one
namespace per file, and every line of a ```sh block runs through torchggml's CLI, in a directory
where `model.gguf` and `MODEL.gguf` are the demo model and `text.txt` is a paragraph of text. A
block preceded by `<!-- no-test: REASON -->` (a GPU, a network, a server that runs until stopped)
is skipped with that reason. docs/kernel_tutorial.md has its own test (test_kernel_tutorial.py).

Also: every public name the README and docs import or use (`from torchggml... import X`,
`ggml.X`, `torchggml.x.y`) exists, and the README's support table is what
scripts/support_table.py generates."""
from __future__ import annotations

import importlib
import importlib.util
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "kernel_tutorial.md")
FENCE = re.compile(r"^```(\w*)\s*$")
NO_TEST = re.compile(r"^<!--\s*no-test:\s*(.+?)\s*-->$")
SHELLS = ("sh", "bash", "shell")
TEXT = """Once upon a time there was a small model. It read a file of numbers and wrote words that
made no sense. The words were short, and the sentences were shorter still. Every day it tried
again, one token after another, until the file ran out of numbers."""


@dataclass
class Block:
    path: Path
    line: int        # the fence's line, 1-based
    lang: str
    code: str
    skip: str | None  # the no-test reason

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a markdown file, each with the no-test reason written before it."""
    found, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        assert end is not None, f"{path}:{i + 1}: a code block that never closes"
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        reason = NO_TEST.match(before)
        found.append(Block(path, i + 1, m.group(1), "\n".join(lines[i + 1:end]) + "\n",
                           reason.group(1) if reason else None))
        i = end + 1
    return found


RUNNABLE = [b for p in DOCS for b in blocks(p) if b.lang == "python" or b.lang in SHELLS]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A directory with the demo model as model.gguf and MODEL.gguf, and text.txt."""
    from torchggml.gguf.writer.demo import demo_model_path
    d = tmp_path_factory.mktemp("docs")
    for name in ("model.gguf", "MODEL.gguf"):
        (d / name).symlink_to(demo_model_path())
    (d / "text.txt").write_text(TEXT)
    return d


class FileRun:
    """One namespace per doc file; running block k first runs the file's blocks before it."""
    def __init__(self):
        self.namespace = {"__name__": "__doc__"}
        self.done = 0


_runs: dict[Path, FileRun] = {}


def _run_python(block: Block) -> None:
    run = _runs.setdefault(block.path, FileRun())
    earlier = [b for b in blocks(block.path) if b.lang == "python" and b.skip is None and b.line < block.line]
    for b in earlier[run.done:]:
        exec(compile(b.code, b.id, "exec"), run.namespace)
    exec(compile(block.code, block.id, "exec"), run.namespace)
    run.done = len(earlier) + 1


def _run_shell(block: Block) -> None:
    from torchggml.cli import main
    for n, line in enumerate(block.code.splitlines()):
        argv = shlex.split(line, comments=True)
        if not argv:
            continue
        assert argv[0] == "torchggml", (f"{block.id}+{n + 1}: only torchggml commands run here; mark the "
                                        f"block <!-- no-test: REASON --> ({line.strip()})")
        try:
            rc = main(argv[1:])
        except SystemExit as e:  # --version and argparse exit
            rc = e.code
        assert rc in (0, None), f"{block.id}+{n + 1}: {line.strip()} exited {rc}"


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.id for b in RUNNABLE])
def test_example_runs(block, workdir, monkeypatch):
    if block.skip:
        pytest.skip(block.skip)
    monkeypatch.chdir(workdir)
    if block.lang == "python":
        _run_python(block)
    else:
        _run_shell(block)


def test_every_doc_has_examples_or_none_marked_wrongly():
    """A no-test mark stands before a code block; a file's runnable examples are found."""
    for path in DOCS:
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if NO_TEST.match(line.strip()):
                nxt = next((x for x in lines[i + 1:] if x.strip()), "")
                assert FENCE.match(nxt), f"{path.name}:{i + 1}: a no-test mark not followed by a code block"
    assert len([b for b in RUNNABLE if b.skip is None]) >= 15


# ------------------------------------------------------------------ public names

def _text() -> str:
    return "\n".join(p.read_text() for p in DOCS + [ROOT / "docs" / "kernel_tutorial.md"])


def imported_names() -> list[tuple[str, str]]:
    """(module, name) of every `from torchggml... import a, b` in the docs."""
    found = []
    pattern = r"from (torchggml[\w.]*)\s+import\s+(?:\(([^)]*)\)|(\w+(?:[ \t]*,[ \t]*\w+)*))"
    for module, parenthesised, names in re.findall(pattern, _text()):
        for item in (parenthesised or names).split(","):
            if item.split():
                found.append((module, item.split()[0]))  # `X as Y`: X
    return sorted(set(found))


def dotted_names() -> list[str]:
    """Every `ggml.X.Y` and `torchggml.x.y` the docs use (C files ggml.h / ggml.c, GGUF keys such as
    `tokenizer.ggml.pre`, patterns such as `ggml.new_tensor_*` and the `torchggml.backends`
    entry-point group aside)."""
    text = _text()
    names = {"torchggml." + m for m in re.findall(r"(?<![\w/.])ggml\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?![\w*])", text)}
    names |= set(re.findall(r"(?<![\w/.])(torchggml(?:\.[A-Za-z_]\w*)+)", text))
    return sorted(n for n in names if n.split(".")[1] not in ("h", "c", "backends", "cpp"))


def _resolve(dotted: str):
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 1):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        obj = importlib.import_module(".".join(parts[:i + 1]))  # a submodule not imported yet
    return obj


@pytest.mark.parametrize("module,name", imported_names())
def test_imported_name_exists(module, name):
    assert hasattr(importlib.import_module(module), name), f"the docs import {name} from {module}"


@pytest.mark.parametrize("dotted", dotted_names())
def test_dotted_name_exists(dotted):
    try:
        _resolve(dotted)
    except (ImportError, AttributeError) as e:
        pytest.fail(f"the docs use {dotted}: {e}")


def test_names_found():
    assert ("torchggml.models", "SamplingParams") in imported_names()
    assert "torchggml.load_model" in dotted_names() and "torchggml.Type.Q4_0" in dotted_names()


# ------------------------------------------------------------------ generated support table

def _support_table():
    spec = importlib.util.spec_from_file_location("support_table", ROOT / "scripts" / "support_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_support_table_is_generated():
    table = _support_table()
    assert table.readme_block((ROOT / "README.md").read_text()) == table.generate(), \
        "README.md's support table differs from the code: run python scripts/support_table.py --write"


def test_support_table_lists_the_code():
    from torchggml.models.archs import ARCHS
    from torchggml.quants import dequantize_types
    block = _support_table().generate()
    assert all(f"`{name}`" in block for name in ARCHS)
    weight_table = block[block.index("| weight types"):].split("\n\n")[0].splitlines()[2:]
    listed = [name for row in weight_table for name in row.split("|")[1].strip().split(", ")]
    assert sorted(listed) == sorted(t.name for t in dequantize_types())
    for device in ("cpu", "cuda", "mps", "sim", "rpc", "meta"):
        assert f"| {device} |" in block


def test_environment_doc_holds_the_config_table():
    """docs/environment.md's table is `python -m torchggml.config`'s, row for row."""
    from torchggml import config
    table = [row for row in (ROOT / "docs" / "environment.md").read_text().splitlines() if row.startswith("| `")]
    assert table == config.describe().strip().splitlines(), \
        "docs/environment.md's table differs: paste python -m torchggml.config's output"


# where a doc's relative paths start (`cpu/jit/gemm_ir.py` is torchggml/devices/cpu/jit/gemm_ir.py)
PATH_BASES = ["", "torchggml", "torchggml/devices", "torchggml/devices/cpu", "torchggml/models", "torchggml/test_ops"]
PLACEHOLDERS = {"FILE.py", "my_kernels.py", "q4_0_matvec.py"}  # files the reader writes


def test_named_files_exist():
    """Every file a doc names (`models/builder.py`, `gemm_ir.py`) exists: a moved file leaves no
    stale path behind."""
    every = {p.name for p in ROOT.rglob("*.py")}
    missing = []
    for doc in DOCS + [ROOT / "docs" / "kernel_tutorial.md"]:
        for name in set(re.findall(r"([\w./-]*\w\.py)\b", doc.read_text())) - PLACEHOLDERS:
            rel = name.lstrip("./")
            found = any((ROOT / base / rel).exists() for base in PATH_BASES) if "/" in rel else rel in every
            if not found:
                missing.append(f"{doc.name}: {name}")
    assert not missing, missing


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_resolve():
    """Every relative link of the README and docs/ names a file that exists, and its #anchor a
    heading of that file."""
    broken = []
    for doc in DOCS + [ROOT / "docs" / "kernel_tutorial.md"]:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"\w+://", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists():
                broken.append(f"{doc.name}: {target}")
            elif anchor and dest.suffix == ".md":
                headings = {_anchor(h) for h in re.findall(r"^#+ (.+)$", dest.read_text(), flags=re.M)}
                if anchor not in headings:
                    broken.append(f"{doc.name}: {target} (no such heading)")
    assert not broken, broken


def test_every_script_is_documented():
    """Each script of scripts/ is named in the README or docs/ (benchmarks.md lists the bench ones)."""
    text = "\n".join(p.read_text() for p in DOCS)
    missing = [p.name for p in sorted((ROOT / "scripts").glob("*.py")) if p.name not in text]
    assert not missing, f"scripts no doc names: {missing}"
