"""The house rules of the package, checked on its source (the import contract itself is `lint-imports`).

    python tests/test_layers.py        # every violation, one a line

- no module over 500 lines, except the data tables and the unpickler's opcode interpreter named below
- no function over 80 lines, no call with more than 5 positional arguments
- an import inside a function only for a heavy or optional package (directly, or a nanscope module that
  imports one at its top), with a comment on its line (or on the first line of its block) saying why
- nothing mutable at module level: no `global` statement, no module-level name bound to an empty
  list / dict / set, apart from the plugin's one registry
- `lint-imports` keeps both contracts (layers, acyclic siblings)
"""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "nanscope"
HEAVY = (
    "torch",
    "megatron",
    "rich",
    "tree_sitter",
    "tree_sitter_bash",
    "wandb",
    "ray",
    "tensorboard",
    "numpy",
    "slime",
    "verl",
    "tensordict",
)  # slime: a user's checkout, importable only in the processes of a run of it (nanscope.slime_train); verl: a
# user's install, imported only inside its workers (nanscope.verl_plugin)
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
MAX_POSITIONAL = 5
# Modules allowed past MAX_MODULE_LINES, each with its reason.
LONG_MODULES = {
    "dumps/unpickler.py": "the restricted unpickler's opcode interpreter: one dispatch over pickle's opcodes",
}


@cache
def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    is_package = _modules()[module].name == "__init__.py"
    base = base if is_package else base[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _top_level_imports(module: str) -> list[str]:
    """Modules imported at the module's top (not inside functions or under TYPE_CHECKING)."""
    out = []
    for node in _tree(_modules()[module]).body:
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, node)
            out += [f"{base}.{a.name}" if f"{base}.{a.name}" in _modules() else base for a in node.names]
    return out


@cache
def _heavy(name: str) -> bool:
    """Importing `name` imports a heavy package at some module's top level."""
    if name.split(".")[0] in HEAVY:
        return True
    mods = _modules()
    if name not in mods:
        return False
    seen, todo = set(), [name]
    while todo:
        m = todo.pop()
        if m in seen or m not in mods:
            continue
        seen.add(m)
        for imported in _top_level_imports(m):
            if imported.split(".")[0] in HEAVY:
                return True
            if imported.startswith("nanscope"):
                todo.append(imported)
                parent = imported.rsplit(".", 1)[0]
                if parent in mods:
                    todo.append(parent)
    return False


def size_violations() -> list[str]:
    out = []
    for path in _modules().values():
        rel = str(path.relative_to(SRC))
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES and rel not in LONG_MODULES:
            out.append(f"{rel}: {lines} lines > {MAX_MODULE_LINES}")
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    out.append(f"{rel}:{node.lineno}: function {node.name} is {n} lines > {MAX_FUNCTION_LINES}")
            elif isinstance(node, ast.Call):
                n = sum(not isinstance(a, ast.Starred) for a in node.args)
                if n > MAX_POSITIONAL:
                    out.append(f"{rel}:{node.lineno}: {ast.unparse(node.func)}(...) has {n} positional arguments")
    return out


def _function_imports(tree: ast.Module):
    """(import node, first line of its block of consecutive imports) for every import inside a function."""
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for body in _bodies(fn):
            block_start = None
            for stmt in body:
                if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                    block_start = block_start or stmt.lineno
                    yield stmt, block_start
                else:
                    block_start = None


def _bodies(fn):
    """The statement lists directly inside `fn` (not inside nested functions)."""
    todo = [fn.body]
    while todo:
        body = todo.pop()
        yield body
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(stmt, field, None)
                if isinstance(inner, list) and inner and isinstance(inner[0], (ast.stmt, ast.ExceptHandler)):
                    todo.append([s for h in inner for s in (h.body if isinstance(h, ast.ExceptHandler) else [h])])


def function_import_violations() -> list[str]:
    out = []
    for name, path in _modules().items():
        rel, lines = str(path.relative_to(SRC)), path.read_text().splitlines()
        for node, block_start in _function_imports(_tree(path)):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = _resolve(name, node)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in _modules() else base for a in node.names]
            light = sorted({t for t in targets if not _heavy(t)})
            if light:
                out.append(
                    f"{rel}:{node.lineno}: import of {', '.join(light)} inside a function (light: import it at the top)"
                )
            elif "#" not in lines[node.lineno - 1] and "#" not in lines[block_start - 1]:
                out.append(f"{rel}:{node.lineno}: import inside a function without a comment saying why")
    return out


REGISTRY = {"slime_plugin/state.py": "_REGISTRY"}  # the one module-level registry (slime calls plain functions)


def state_violations() -> list[str]:
    out = []
    for path in _modules().values():
        rel, tree = str(path.relative_to(SRC)), _tree(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                out.append(f"{rel}:{node.lineno}: `global {', '.join(node.names)}`")
        for node in tree.body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            empty = isinstance(value, (ast.List, ast.Dict, ast.Set)) and not getattr(
                value, "elts", getattr(value, "keys", None)
            )
            empty = empty or (
                isinstance(value, ast.Call) and ast.unparse(value.func) in ("list", "dict", "set") and not value.args
            )
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if empty and not (rel in REGISTRY and REGISTRY[rel] in names):
                out.append(f"{rel}:{node.lineno}: module-level mutable {', '.join(names)}")
    return out


def test_module_and_function_sizes_and_positional_arguments():
    assert size_violations() == []


def test_imports_inside_functions_are_heavy_or_optional_and_say_why():
    assert function_import_violations() == []


def test_no_mutable_state_at_module_level():
    assert state_violations() == []


def test_the_import_contracts_hold():
    linter = Path(sys.executable).with_name("lint-imports")
    if not linter.exists():
        pytest.skip("lint-imports is not installed (the test extra has it)")
    proc = subprocess.run([str(linter), "--no-cache"], capture_output=True, text=True, cwd=SRC.parents[1], timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "Contracts: 2 kept, 0 broken." in proc.stdout


if __name__ == "__main__":
    found = size_violations() + function_import_violations() + state_violations()
    print("\n".join(found) or "no violations")
    sys.exit(1 if found else 0)
