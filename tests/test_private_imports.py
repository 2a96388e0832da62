"""No module imports private names of the kernel modules (devices/, quants/) from another package (`from ..kernels.x import _name`): kernel helpers that
other packages use are public in the module that defines them."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNEL_PACKAGES = ("torchggml/devices", "torchggml/quants")


def _private_imports_across_packages() -> list[str]:
    found = []
    for path in sorted((ROOT / "torchggml").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.ImportFrom) and node.level):
                continue
            base = path.parent
            for _ in range(node.level - 1):
                base = base.parent
            target = base.joinpath(*node.module.split(".")) if node.module else base
            target_pkg = target if target.is_dir() else target.parent
            if target_pkg == path.parent:
                continue  # the same package may share its private helpers
            if not str(target_pkg.relative_to(ROOT)).startswith(KERNEL_PACKAGES):
                continue
            found += [f"{path.relative_to(ROOT)}:{node.lineno}: {a.name} from {'.' * node.level}{node.module or ''}"
                      for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_private_names_imported_across_packages():
    assert _private_imports_across_packages() == []


def test_the_check_sees_a_private_import(tmp_path):
    pkg = tmp_path / "torchggml" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "torchggml" / "quants").mkdir()
    (tmp_path / "torchggml" / "quants" / "helpers.py").write_text("def _secret(): pass\n")
    (pkg / "user.py").write_text("from ..quants.helpers import _secret\n")
    globals()["ROOT"] = tmp_path
    try:
        assert _private_imports_across_packages() == ["torchggml/sub/user.py:1: _secret from ..quants.helpers"]
    finally:
        globals()["ROOT"] = Path(__file__).resolve().parents[1]
