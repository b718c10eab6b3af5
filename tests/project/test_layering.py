"""The package's layering (DEVELOPERS.md, Layout): low layers never import high ones, no import
cycles, and the dependencies that used to be hidden are explicit imports.

Every import counts, wherever it is in a file: at module level, inside a function (a lazy
import), under `if TYPE_CHECKING:`. Each is parsed with `ast`, so none is missed."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "treemod"

# Layer of each file, by the first matching prefix of its path inside treemod/ (longest first).
LAYERS = {
    "_private_apis.py": 1,
    "_tree/filters.py": 1,
    "_tree/module_info.py": 1,
    "_format/": 2,
    "_shapecheck/": 3,
    "_tree/": 4,
    "_module/": 5,
    "_transforms/": 6,
    "_saving/": 6,
    "_sharding/": 6,
    "_enumeration.py": 7,
    "nn/": 7,
    "debug.py": 8,
    "_compile_report/": 8,
    "_state_dict/": 8,
    "_compat_api.py": 8,
    "models/": 9,
    "_display/": 9,
    "lora/": 9,
    "quant/": 9,
    "precision/": 9,
    "__init__.py": 10,
    "compat/": 11,
}


def _layer(rel: str) -> int:
    for prefix in sorted(LAYERS, key=len, reverse=True):
        if rel.startswith(prefix):
            return LAYERS[prefix]
    raise AssertionError(f"treemod/{rel} has no layer in tests/project/test_layering.py")


def _module_file(module: str) -> str | None:
    """`treemod.a.b` -> `a/b.py` or `a/b/__init__.py` (relative to treemod/), if it exists."""
    parts = module.split(".")[1:]
    if not parts:
        return "__init__.py"
    as_file = PACKAGE.joinpath(*parts).with_suffix(".py")
    if as_file.exists():
        return as_file.relative_to(PACKAGE).as_posix()
    as_package = PACKAGE.joinpath(*parts, "__init__.py")
    if as_package.exists():
        return as_package.relative_to(PACKAGE).as_posix()
    return None


def _imports(path: Path, top_level_only: bool = False, source: str | None = None) -> set[str]:
    """The treemod files that `path` imports (anywhere in it, or at module level only).

    `source` stands for the file's text (the test of this function)."""
    rel_package = path.parent.relative_to(ROOT).as_posix().replace("/", ".")
    tree = ast.parse(path.read_text() if source is None else source)
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = rel_package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if not module.startswith("treemod"):
                continue
            # `from pkg import sub` imports the file `sub`; `from mod import name`, `mod`.
            subs = [_module_file(f"{module}.{a.name}") for a in node.names]
            if all(subs):
                found.update(s for s in subs if s)
            else:
                target = _module_file(module)
                if target is not None:
                    found.add(target)
        elif isinstance(node, ast.Import):
            for a in node.names:
                target = _module_file(a.name) if a.name.startswith("treemod") else None
                if target is not None:
                    found.add(target)
    found.discard(path.relative_to(PACKAGE).as_posix())
    return found


def _files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_low_layers_never_import_high_ones() -> None:
    upward = []
    for path in _files():
        rel = path.relative_to(PACKAGE).as_posix()
        for target in _imports(path):
            if target.endswith("__init__.py") and target != "__init__.py":
                continue  # a package's __init__ (the folders' are empty)
            if _layer(target) > _layer(rel):
                upward.append(
                    f"treemod/{rel} (layer {_layer(rel)}) imports treemod/{target} "
                    f"(layer {_layer(target)})"
                )
    assert upward == []


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (file -> the files it imports), or `None`."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done

    def visit(node: str, stack: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt, stack + [nxt])
                if found:
                    return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [node])
            if found:
                return found
    return None


def test_no_import_cycles_at_any_level() -> None:
    graph = {p.relative_to(PACKAGE).as_posix(): _imports(p) for p in _files()}
    cycle = _find_cycle(graph)
    assert cycle is None, "import cycle (imports anywhere in a file): " + " -> ".join(cycle or [])


def test_every_import_is_seen_wherever_it_is() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "import treemod._tree.filters\n"
        "if TYPE_CHECKING:\n"
        "    from treemod._shapecheck.spec import Entry\n"
        "def f():\n"
        "    from treemod._shapecheck import engine\n"
        "    class C:\n"
        "        def g(self):\n"
        "            from . import config\n"
    )
    found = _imports(PACKAGE / "_shapecheck" / "checker.py", source=source)
    assert found == {
        "_tree/filters.py",
        "_shapecheck/spec.py",
        "_shapecheck/engine.py",
        "_shapecheck/config.py",
    }
    assert _imports(PACKAGE / "_shapecheck" / "checker.py", True, source) == {"_tree/filters.py"}


def test_the_cycle_finder_finds_a_cycle_through_a_lazy_import() -> None:
    # checker -> engine only inside a function, engine -> checker at module level: the cycle
    # this test exists for (it was in the package until the field analysis moved to fields.py).
    graph = {"checker.py": {"config.py", "engine.py"}, "engine.py": {"checker.py"}}
    assert _find_cycle(graph) == ["checker.py", "engine.py", "checker.py"]
    assert _find_cycle({"a.py": {"b.py"}, "b.py": set()}) is None


def test_module_and_tree_at_import_the_shape_checker_they_use() -> None:
    """No registry filled as a side effect of importing another file: the construction paths
    import the checker, and the shape-check folder never imports `_module`."""
    for rel in ("_module/module.py", "_tree/tree_at.py"):
        assert "_shapecheck/checker.py" in _imports(PACKAGE / rel, top_level_only=True), rel
    for path in (PACKAGE / "_shapecheck").glob("*.py"):
        assert not any(t.startswith("_module/") for t in _imports(path))
        source = path.read_text()
        assert "install_field_checker" not in source and "install_call_checker" not in source


def test_no_file_imports_a_private_name_from_another() -> None:
    """Helpers shared between files have public names in their module (`from x import _y`
    anywhere in a file, lazy imports included, is refused)."""
    found = []
    for path in _files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("treemod"):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        rel = path.relative_to(PACKAGE).as_posix()
                        found.append(f"treemod/{rel}:{node.lineno} imports {alias.name}")
    assert found == []
