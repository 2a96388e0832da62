"""The shape of the code: enum ids equal upstream's, imports run down the layers named in
docs/architecture.md with no circles, and no repeated code (`duplicates`)."""
from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from torchggml.enums import GGML_COMMIT, GluOp, Op, UnaryOp
from torchggml.types import Type

DATA = Path(__file__).parent / "data"
UPSTREAM = json.loads((DATA / "ggml_enums.json").read_text())


# ---------------------------------------------------------------- enum ids

def test_upstream_table_is_the_commit_named_in_the_code():
    assert UPSTREAM["commit"] == GGML_COMMIT


@pytest.mark.parametrize("enum", [Type, Op, UnaryOp, GluOp], ids=lambda e: e.__name__)
def test_enum_ids_equal_upstream(enum):
    upstream = UPSTREAM[enum.__name__]
    ours = {m.name: int(m) for m in enum}
    assert {name: upstream.get(name) for name in ours} == ours


# ---------------------------------------------------------------- imports run down the layers

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("torchggml",)


def _layers() -> list[tuple[str, list[str]]]:
    """docs/architecture.md's ```layers block: (name, path prefixes), bottom layer first."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("```layers\n", 1)[1].split("```", 1)[0]
    rows = [line.split(":", 1) for line in block.strip().splitlines()]
    return [(name.strip(), paths.split()) for name, paths in reversed(rows)]


def _module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the packages."""
    files = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join(parts)] = path
    return files


def _imports(name: str, path: Path, modules) -> set[str]:
    """The package modules `name` imports (anywhere in the file, functions included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            stem = ".".join(base + ([node.module] if node.module else []))
            targets = [f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in modules else stem
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # a name inside a module: the module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _import_graph():
    modules = _module_files()
    return modules, {name: _imports(name, path, modules) for name, path in modules.items()}


def _layer_of(path: Path, layers) -> int:
    rel = path.relative_to(ROOT).as_posix()
    matches = [(len(prefix), i) for i, (_, prefixes) in enumerate(layers) for prefix in prefixes
               if rel == prefix or (prefix.endswith("/") and rel.startswith(prefix))]
    assert matches, f"{rel} belongs to no layer of docs/architecture.md"
    return max(matches)[1]


def test_imports_run_down_the_layers():
    layers = _layers()
    modules, graph = _import_graph()
    upward = []
    for name, targets in graph.items():
        src = _layer_of(modules[name], layers)
        for target in targets:
            dst = _layer_of(modules[target], layers)
            if dst > src:
                upward.append(f"{name} ({layers[src][0]}) imports {target} ({layers[dst][0]})")
    assert not upward, "imports that run up the layers:\n" + "\n".join(sorted(upward))


def _circles(graph) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_no_import_circles():
    _, graph = _import_graph()
    assert _circles(graph) == [], "import circles"


def test_the_checks_see_a_circle_and_an_upward_import():
    """The checks themselves: a made-up circle is found, and a base module importing the face
    is upward."""
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    layers = _layers()
    modules = _module_files()
    assert _layer_of(modules["torchggml.types"], layers) < _layer_of(modules["torchggml"], layers)


def test_every_device_file_sits_in_the_devices_layer():
    layers = _layers()
    modules = _module_files()
    devices = [i for i, (name, _) in enumerate(layers) if name == "devices"][0]
    for name in ("cpu", "cuda", "mps", "sim"):
        assert _layer_of(modules[f"torchggml.devices.{name}"], layers) == devices


# ---------------------------------------------------------------- no repeated code

WINDOW = 6  # lines: the `duplicates` command's default


def _code_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text with white space folded) of the lines that carry code."""
    lines = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        text = " ".join(line.split())
        if not text or text.startswith(("#", "import ", "from ")) or set(text) <= set("()[]{}:,"):
            continue
        lines.append((number, text))
    return lines


def test_no_code_is_repeated_to_the_letter():
    """No run of WINDOW code lines stands twice in the package (the identical rows of
    `duplicates torchggml`; it runs below when installed)."""
    places = {}
    for path in sorted((ROOT / "torchggml").rglob("*.py")):
        lines = _code_lines(path)
        for k in range(len(lines) - WINDOW + 1):
            run = tuple(text for _, text in lines[k:k + WINDOW])
            places.setdefault(run, []).append(f"{path.relative_to(ROOT)}:{lines[k][0]}")
    repeated = {run: where for run, where in places.items() if len(where) > 1}
    assert not repeated, "repeated code: " + "; ".join(" ~ ".join(w) for w in repeated.values())


@pytest.mark.skipif(shutil.which("duplicates") is None, reason="the duplicates command is not installed")
def test_duplicates_finds_no_identical_code():
    """`duplicates torchggml`: every pair it lists is alike only in shape (same structure with
    other names, e.g. the mirrored C functions), none is the same code to the letter."""
    out = subprocess.run(["duplicates", "--repo", str(ROOT / "torchggml"), "--most", "200", "--seconds", "60"],
                         capture_output=True, text=True, timeout=120).stdout
    rows = [line for line in out.splitlines() if re.match(r"D\d+ ", line)]
    assert "incomplete" not in out, out
    assert [row for row in rows if " shape" not in row] == []
