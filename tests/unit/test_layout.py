"""The packages' layout: no import cycle (function-level imports included), the plugin's import
free of torch, lazy imports only where they keep a heavy library out of it, the device model
free of the lowering, and ARCHITECTURE.md naming every subpackage that exists."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("asic_backend", "pytest_nobreak")
#: Libraries the plugin must not import until a test needs them: slow (torch takes seconds)
#: or optional (transformers, diffusers, pytest-html).
HEAVY = ("torch", "torchao", "transformers", "diffusers", "pytest_html", "numpy")


@dataclasses.dataclass(frozen=True)
class Import:
    importer: str
    target: str  # a module of ours, or the top-level name of another library
    full: str  # the module as written
    line: int
    lazy: bool  # inside a function
    commented: bool


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }


@cache
def lazy_names() -> dict[str, dict[str, str]]:
    """The names each package's ``__getattr__`` imports on first use (its ``_LAZY`` table)."""
    out = {}
    for name, path in modules().items():
        if path.name != "__init__.py":
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "_LAZY":
                out[name] = ast.literal_eval(node.value)
    return out


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _walk(node: ast.AST, lazy: bool) -> Iterator[tuple[ast.AST, bool]]:
    for child in ast.iter_child_nodes(node):
        if _type_checking(child):
            continue  # never runs
        inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
        yield child, inner
        yield from _walk(child, inner)


def _resolve(name: str) -> str:
    """Our module ``name`` is, or the top-level library it belongs to."""
    if name.split(".")[0] not in PACKAGES:
        return name.split(".")[0]
    while name not in modules():
        name = name.rpartition(".")[0]
    return name


@cache
def imports() -> tuple[Import, ...]:
    out = []
    for name, path in modules().items():
        lines = path.read_text(encoding="utf-8").splitlines()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node, lazy in _walk(ast.parse("\n".join(lines)), False):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                    base = f"{base}.{node.module}" if node.module else base
                # ``from package import module`` imports the module, and a name the package
                # loads lazily (``asic_backend._LAZY``) the module it is loaded from.
                targets = [
                    f"{base}.{alias.name}"
                    if f"{base}.{alias.name}" in modules()
                    else lazy_names().get(base, {}).get(alias.name, base)
                    for alias in node.names
                ]
            for full in dict.fromkeys(targets):
                target = _resolve(full)
                if target == "__future__":
                    continue
                # The reason, on the line itself or the comment line above it.
                above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
                comment = "#" in lines[node.lineno - 1] or above.startswith("#")
                out.append(Import(name, target, full, node.lineno, lazy, comment))
    return tuple(out)


def eager_closure(module: str) -> set[str]:
    """Everything importing ``module`` imports (module-level imports, transitively, and the
    packages above each module of ours)."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        if current in modules():
            parent = current.rpartition(".")[0]
            if parent:
                todo.append(parent)
            todo.extend(i.target for i in imports() if i.importer == current and not i.lazy)
    return seen


def heavy(module: str) -> bool:
    return any(library in eager_closure(module) for library in HEAVY)


def cycles(found: tuple[Import, ...], lazy: bool) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    edges: dict[str, set[str]] = {m: set() for m in modules()}
    for i in found:
        if i.target in modules() and (lazy or not i.lazy) and i.target != i.importer:
            edges[i.importer].add(i.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_even_through_function_level_imports() -> None:
    assert cycles(imports(), lazy=True) == []


def test_a_cycle_is_found_when_there_is_one() -> None:
    """The check itself: a lazy import of the monitor from the events module would close one."""
    monitor = "pytest_nobreak.watch.monitor"
    fake = Import("pytest_nobreak.watch.events", monitor, monitor, 1, True, False)
    assert cycles((*imports(), fake), lazy=True) != []
    assert cycles((*imports(), fake), lazy=False) == []


def deferred(i: Import) -> bool:
    """Whether a lazy import defers something heavy: a heavy library the importer does not
    import, or a heavy library's subsystem it does not (Inductor, whose import takes seconds)."""
    before = eager_closure(i.importer)
    if any(library in eager_closure(i.target) - before for library in HEAVY):
        return True
    return (
        i.target in HEAVY
        and i.full != i.target
        and not any(j.importer == i.importer and not j.lazy and j.full == i.full for j in imports())
    )


def test_a_lazy_import_defers_a_heavy_library_and_says_why() -> None:
    """A function-level import is there only to keep torch (transformers, pytest-html, or a
    slow part of torch) out of a module that does not need it yet, with a comment saying so;
    anything else is imported at module level, where a cycle would show."""
    wrong = [
        f"{i.importer}:{i.line} imports {i.full} lazily"
        + ("" if deferred(i) else " and defers nothing heavy")
        + ("" if i.commented else " without a comment")
        for i in imports()
        if i.lazy and not (deferred(i) and i.commented)
    ]
    assert wrong == []


def test_importing_the_plugin_imports_no_torch() -> None:
    code = (
        "import sys, pytest_nobreak, pytest_nobreak.plugin\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert not heavy("pytest_nobreak.plugin")


def test_the_device_model_imports_nothing_of_the_lowering_and_the_ops_nothing_of_it() -> None:
    rules = {
        "asic_backend.sim": ("asic_backend.ops", "asic_backend.lower", "asic_backend.backend"),
        "asic_backend.ops": ("asic_backend.lower", "asic_backend.backend"),
    }
    wrong = [
        f"{i.importer}:{i.line} imports {i.target}"
        for i in imports()
        for package, banned in rules.items()
        if i.importer.startswith(package + ".") and i.target.startswith(banned)
    ]
    fx = [
        f"{path}: imports torch.fx"
        for name, path in modules().items()
        if name.startswith("asic_backend.sim")
        and re.search(
            r"^\s*(from torch(\.fx)? import fx|import torch\.fx|from torch\.fx)",
            path.read_text(),
            re.M,
        )
    ]
    assert wrong + fx == []


def subpackages() -> set[str]:
    return {
        str(path.parent.relative_to(ROOT))
        for package in PACKAGES
        for path in (ROOT / package).rglob("__init__.py")
        if path.parent != ROOT / package
    }


def test_architecture_md_names_every_subpackage_and_only_those() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:asic_backend|pytest_nobreak)(?:/\w+)+)/`", text))
    assert named == subpackages()
    files = set(re.findall(r"`((?:asic_backend|pytest_nobreak)/[\w/]+\.py)`", text))
    assert files, "the walk-through names the file of each step"
    assert [f for f in sorted(files) if not (ROOT / f).is_file()] == []


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_imports(package: str) -> None:
    """The packages' public interface (``__all__``, which the README and docs use) survived
    the layout: each name resolves, lazily loaded ones included."""
    module = importlib.import_module(package)
    assert module.__all__
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert missing == []
