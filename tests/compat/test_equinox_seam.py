"""Equinox's knowledge lives in `treemod.compat.equinox` only (issue 34, item 1).

The core (everything under treemod/ outside compat/) names no Equinox identifier, imports no
Equinox and reads no Equinox environment variable; its errors have one built-in base each,
while the compat namespace raises Equinox's types (checked against real Equinox); Equinox's
`EQX_ON_ERROR` is honoured once the compat namespace is imported, and only then.
"""

from __future__ import annotations

import ast
import os
import pathlib
import re
import subprocess
import sys
import tokenize
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import pytest

import treemod as tm
import treemod.compat.equinox as ceqx

PACKAGE = pathlib.Path(tm.__file__).parent
CORE = sorted(p for p in PACKAGE.rglob("*.py") if "compat" not in p.relative_to(PACKAGE).parts)
_EQUINOX_NAME = re.compile(r"equinox|eqx", re.IGNORECASE)


def _code_mentions(path: pathlib.Path) -> list[str]:
    """Identifiers naming Equinox, and strings holding an `EQX_` variable or an equinox import,
    in the code of `path` (comments and docstrings explain; they are not code)."""
    found = []
    with open(path, "rb") as f:
        for token in tokenize.tokenize(f.readline):
            if token.type == tokenize.NAME and _EQUINOX_NAME.search(token.string):
                found.append(f"{path.name}:{token.start[0]}: name {token.string}")
            elif token.type == tokenize.STRING and re.search(
                r"EQX_|import equinox|from equinox", token.string
            ):
                found.append(f"{path.name}:{token.start[0]}: string {token.string[:40]}")
    return found


def test_the_scan_sees_the_core_and_finds_equinox_code() -> None:
    names = {p.relative_to(PACKAGE).as_posix() for p in CORE}
    assert {"__init__.py", "_saving/checkpoint.py", "nn/_conv.py", "_compat_api.py"} <= names
    assert not any(n.startswith("compat/") for n in names)
    sample = PACKAGE / "compat" / "equinox" / "_errors.py"  # the scan does find such code
    assert any("EQX_ON_ERROR" in m for m in _code_mentions(sample))


@pytest.mark.parametrize("path", CORE, ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_the_core_code_does_not_know_equinox(path: pathlib.Path) -> None:
    assert _code_mentions(path) == []


def _treemod_imports(path: pathlib.Path) -> set[str]:
    """The treemod modules `path` imports, anywhere in it (relative imports resolved)."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.add(module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m == "treemod" or m.startswith("treemod.")}


def test_compat_uses_public_names_and_the_one_internal_interface() -> None:
    compat = sorted((PACKAGE / "compat").rglob("*.py"))
    assert len(compat) > 20
    private = {
        f"{path.relative_to(PACKAGE).as_posix()}: {module}"
        for path in compat
        for module in _treemod_imports(path)
        if module != "treemod._compat_api"
        and not module.startswith("treemod.compat")
        and any(part.startswith("_") for part in module.split("."))
    }
    assert private == set()
    users = [p for p in CORE if "treemod._compat_api" in _treemod_imports(p)]
    assert users == []  # the core never reaches up to it


def test_the_core_exports_one_checkpoint_system() -> None:
    for name in (
        "tree_serialise_leaves",
        "tree_deserialise_leaves",
        "default_serialise_filter_spec",
        "default_deserialise_filter_spec",
    ):
        assert not hasattr(tm, name) and name not in tm.__all__, name
        assert name in ceqx.__all__ and callable(getattr(ceqx, name)), name
    for layer in (tm.nn.Conv, tm.nn.ConvTranspose, tm.nn.PReLU, tm.nn.Pool, tm.nn.BatchNorm):
        assert not any(n.startswith("__equinox") for n in dir(layer)), layer


def _error(fn: Any) -> type:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 (the type is the result)
        return type(e)
    raise AssertionError("no error")


_MISTAKES = {
    "filter_spec": (lambda lib: lib.filter([1, 2], "a"), TypeError),
    "where computes": (lambda lib: lib.tree_at(lambda t: t[0].real, [1.0], 2.0), TypeError),
    "not a node": (lambda lib: lib.tree_at(lambda t: 7, {"a": 1}, 5), ValueError),
}


@pytest.mark.parametrize("mistake", list(_MISTAKES))
def test_native_errors_have_one_builtin_base_and_compat_raises_equinoxs(mistake: str) -> None:
    call, native = _MISTAKES[mistake]
    ours = _error(lambda: call(tm))
    builtin = [b for b in ours.__mro__ if b.__module__ == "builtins" and b is not ours]
    assert issubclass(ours, native) and builtin[0] is native
    assert not any(
        issubclass(ours, other)
        for other in (ValueError, TypeError, AttributeError)
        if other is not native and not issubclass(native, other)
    )
    theirs = _error(lambda: call(eqx))
    compat = _error(lambda: call(ceqx))
    assert issubclass(compat, theirs) and issubclass(compat, native), (compat, theirs)


def _run(code: str, **env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if not k.endswith("_ON_ERROR")}
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**environment, **env},
    )
    return result.stdout.strip() + "\n" + result.stderr.strip()


_MODES = """
import jax.numpy as jnp
def mode(error_if):
    try:
        out = error_if(jnp.ones(2), jnp.array(True), "bad")
    except RuntimeError:
        return "raise"
    return "nan" if bool(jnp.isnan(out).all()) else "off"
import treemod as tm
before = mode(tm.error_if)
import treemod.compat.equinox as ceqx
import equinox as eqx
print(before, mode(tm.error_if), mode(ceqx.error_if), mode(eqx.error_if))
"""


@pytest.mark.heavy
@pytest.mark.parametrize("value", ["nan", "off"])
def test_eqx_on_error_is_honoured_once_compat_is_imported(value: str) -> None:
    # treemod alone ignores Equinox's variable; with the compat namespace imported, both it
    # and treemod's error_if follow it, as Equinox's error_if does.
    out = _run(_MODES, EQX_ON_ERROR=value)
    assert out.startswith(f"raise {value} {value} {value}"), out


@pytest.mark.heavy
def test_treemods_variable_wins_and_a_bad_value_names_the_variable() -> None:
    out = _run(_MODES, EQX_ON_ERROR="nan", TREEMOD_ON_ERROR="off")
    assert out.startswith("off off off nan"), out
    out = _run("import treemod; import treemod.compat.equinox", EQX_ON_ERROR="explode")
    assert "ValueError: EQX_ON_ERROR must be one of" in out and "'explode'" in out, out
    assert "TREEMOD_ON_ERROR" in _run("import treemod", TREEMOD_ON_ERROR="explode")


def test_the_default_mode_is_raise() -> None:
    with pytest.raises(tm.RuntimeCheckError, match="bad"):
        tm.error_if(jnp.ones(2), True, "bad")
