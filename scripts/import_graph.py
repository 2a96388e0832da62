"""The package's import graph as a new engineer reads it: its rooms (the entries of the layer table
in docs/architecture.md: a folder or a module each), how many levels of imports stack them, the
import circles among them, and how many modules sit at the package root.

    python scripts/import_graph.py [PATH/TO/CHECKOUT]     # default: this checkout

A room imports another when any module in it imports any module in the other (functions'
imports included). Levels: the longest chain of rooms importing rooms, circles folded.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path


def modules(root: Path, package: str) -> dict[str, Path]:
    out = {}
    for path in (root / package).rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            stem = ".".join(base + ([node.module] if node.module else []))
            targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in known else stem for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def table_rooms(root: Path) -> list[str]:
    """The path prefixes of docs/architecture.md's ```layers block."""
    text = (root / "docs" / "architecture.md").read_text()
    block = text.split("```layers\n", 1)[1].split("```", 1)[0]
    return [p for line in block.strip().splitlines() for p in line.split(":", 1)[1].split()]


def room_of(path: Path, root: Path, rooms: list[str]) -> str:
    rel = path.relative_to(root).as_posix()
    hits = [r for r in rooms if rel == r or (r.endswith("/") and rel.startswith(r))]
    return max(hits, key=len) if hits else rel


def sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            out.append(group)

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def levels(graph: dict[str, set[str]]) -> int:
    groups = sccs(graph)
    where = {v: i for i, g in enumerate(groups) for v in g}
    dag = {i: {where[w] for v in g for w in graph.get(v, ()) if where[w] != i} for i, g in enumerate(groups)}
    depth: dict[int, int] = {}

    def d(i):
        if i not in depth:
            depth[i] = 1 + max((d(j) for j in dag[i]), default=0)
        return depth[i]

    return max((d(i) for i in dag), default=0)


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
    package = "torchggml"
    known = modules(root, package)
    extra = {"triton_kernels": modules(root, "triton_kernels")} if (root / "triton_kernels").is_dir() else {}
    for mods in extra.values():
        known.update(mods)
    table = table_rooms(root)
    graph = {}
    for name, path in known.items():
        r = room_of(path, root, table)
        graph.setdefault(r, set())
        for t in imports(name, path, known):
            tr = room_of(known[t], root, table)
            if tr != r:
                graph[r].add(tr)
    rooms = sorted(graph)
    flat = [p for p in (root / package).glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    circles = [sorted(g) for g in sccs(graph) if len(g) > 1]
    print(f"{root}: {len(known)} modules in {len(rooms)} rooms; {len(flat)} modules at the package root; "
          f"{levels(graph)} levels of imports; {len(circles)} circles")
    for c in circles:
        print("  circle:", " -> ".join(c))


if __name__ == "__main__":
    main()
