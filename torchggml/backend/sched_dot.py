"""A picture of the scheduler's work: the graph as Graphviz dot, nodes coloured by backend,
each split boxed, copied inputs drawn as dashed edges. SVG/PNG when the `dot` program exists."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from ..enums import VIEW_OPS
from ..tensor import Tensor, nbytes

_COLORS = ["#8dd3c7", "#fdb462", "#bebada", "#fb8072", "#80b1d3", "#b3de69", "#fccde5", "#d9d9d9"]


def _label(t: Tensor, extra: str = "") -> str:
    name = (t.name or "?").replace('"', "'")
    return f"{name}\\n{t.op.name} {t.type.name} {list(t.ne)}{extra}"


def backend_sched_graph_dump_dot(sched, graph, path) -> Path:
    """Write the split graph of `graph` (after split_graph/alloc_graph) to `path` (.dot). If the
    path ends in .svg or .png and Graphviz's `dot` is installed, render it; otherwise the .dot
    text is written next to it. Returns the path written."""
    path = Path(path)
    color = {i: _COLORS[i % len(_COLORS)] for i in range(len(sched.backends))}
    lines = ["digraph G {", "  rankdir=TB;", '  node [shape=box, style="rounded,filled", fontsize=10];']
    ids: dict[int, str] = {}

    def nid(t: Tensor) -> str:
        return ids.setdefault(id(t), f"t{len(ids)}")

    with sched.copies_applied():  # draw the copies the splits read
        for k, split in enumerate(sched.splits):
            b = split.backend_id
            lines.append(f"  subgraph cluster_{k} {{")
            lines.append(f'    label="split {k}: {sched.backends[b].name} ({len(split.inputs)} inputs)"; '
                         f'style=rounded; color="{color[b]}"; penwidth=2;')
            for node in graph.nodes[split.i_start:split.i_end]:
                if node.op in VIEW_OPS:
                    continue
                nb = sched.backend_ids.get(node, b)
                lines.append(f'    {nid(node)} [label="{_label(node)}", fillcolor="{color.get(nb, "#ffffff")}"];')
            lines.append("  }")
        for node in graph.nodes:
            if node.op in VIEW_OPS:
                continue
            for src in node.src:
                if src is None:
                    continue
                while src.op in VIEW_OPS and src.src[0] is not None and src.view_src is not None:
                    src = src.src[0]
                if id(src) not in ids:
                    b = sched.backend_ids.get(src, -1)
                    fill = color.get(b, "#ffffff")
                    shape = "ellipse" if "#" not in src.name else "note"
                    lines.append(f'  {nid(src)} [label="{_label(src, f" {nbytes(src)}B")}", shape={shape}, fillcolor="{fill}"];')
                style = "dashed" if "#" in src.name else "solid"
                lines.append(f"  {nid(src)} -> {nid(node)} [style={style}];")
    lines.append("  legend [shape=plaintext, label=<<table border='0'>"
                 + "".join(f"<tr><td bgcolor='{color[i]}'>{b.name}</td></tr>" for i, b in enumerate(sched.backends))
                 + "</table>>];")
    lines.append("}")
    text = "\n".join(lines) + "\n"
    fmt = path.suffix.lstrip(".").lower()
    if fmt in ("svg", "png"):
        dot = shutil.which("dot")
        if dot:
            subprocess.run([dot, f"-T{fmt}", "-o", str(path)], input=text.encode(), check=True)
            return path
        path = path.with_suffix(".dot")
    path.write_text(text)
    return path
