"""The module paths trace/ kept when its code moved into subpackages: each re-exports its new home's public names,
the same objects, and no code of the project imports through them."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "src" / "nanscope" / "trace"
KEPT = {  # old path -> new home (README, docs/ and the plugin's docs cite the old paths)
    "bundle": "bundles.bundle",
    "classify": "sentinels.classify",
    "locator": "tracer.locator",
    "replay": "tracer.replay",
    "sentinel": "sentinels.sentinel",
    "step": "tracer.step",
    "torch_file": "loading.torch_file",
}


def _public(path: Path) -> list[str]:
    """The names a module defines at its top (functions, classes, assignments), but _private ones."""
    names = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return sorted(n for n in names if not n.startswith("_"))


@pytest.mark.parametrize("old", sorted(KEPT))
def test_a_kept_path_re_exports_every_public_name_of_its_new_home(old):
    kept = importlib.import_module(f"nanscope.trace.{old}")
    home = importlib.import_module(f"nanscope.trace.{KEPT[old]}")
    names = _public(TRACE / (KEPT[old].replace(".", "/") + ".py"))
    assert sorted(kept.__all__) == names
    assert all(getattr(kept, name) is getattr(home, name) for name in names)
    assert _public(TRACE / f"{old}.py") == []  # no code of its own: the import and __all__ only


def _compat_imports(path: Path, root: Path = ROOT) -> list[str]:
    """`file:line module` of each import of a kept path (`nanscope.trace.replay`, `from nanscope.trace import
    replay`, ...) in a file."""
    kept = {f"nanscope.trace.{old}" for old in KEPT}
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found += [f"{path.relative_to(root)}:{node.lineno} {m}" for m in modules if m in kept]
    return found


def test_the_project_imports_the_new_homes_not_the_kept_paths():
    files = [p for top in ("src", "tests", "benchmarks") for p in sorted((ROOT / top).rglob("*.py"))]
    found = [hit for path in files if path != Path(__file__).resolve() for hit in _compat_imports(path)]
    assert found == []


def test_the_check_can_fail(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from nanscope.trace import replay\nimport nanscope.trace.bundle\nfrom nanscope.trace.step import x\n"
    )
    assert _compat_imports(bad, tmp_path) == [
        "bad.py:1 nanscope.trace.replay",
        "bad.py:2 nanscope.trace.bundle",
        "bad.py:3 nanscope.trace.step",
    ]
