"""Every public module of treemod exposes only its API: its public names (in `vars` and `dir`)
are the names of its `__all__` and its public submodules, not the names it imports (`Any`,
`jax`, `functools`, ...). Modules are found by walking the package, so a new one is covered."""

from __future__ import annotations

import importlib
import pkgutil
import types

import pytest

import treemod


def _public_modules() -> list[str]:
    names = ["treemod"]
    for info in pkgutil.walk_packages(treemod.__path__, "treemod."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


MODULES = _public_modules()


def test_the_walk_finds_the_public_modules() -> None:
    expected = {"treemod", "treemod.nn", "treemod.nn.init", "treemod.debug"}
    expected |= {"treemod.compat", "treemod.compat.equinox", "treemod.compat.equinox.nn"}
    assert expected <= set(MODULES), MODULES


def _is_public(name: str) -> bool:
    return not name.startswith(("_", "@"))  # "@": names pytest's assertion rewriting adds


@pytest.mark.parametrize("name", MODULES)
def test_public_names_are_the_api(name: str) -> None:
    mod = importlib.import_module(name)
    api = set(getattr(mod, "__all__", ()))

    def submodule(attr: str) -> bool:  # `treemod.nn` is an attribute of treemod, not an import
        value = getattr(mod, attr)
        return isinstance(value, types.ModuleType) and value.__name__ == f"{name}.{attr}"

    for listing, names in (("vars", vars(mod)), ("dir", dir(mod))):
        public = {n for n in names if _is_public(n)}
        extra = {n for n in public - api if not submodule(n)}
        assert extra == set(), f"{name}: {listing}() has names outside __all__"
        assert api - public == set(), f"{name}: __all__ names missing from {listing}()"


def test_init_exports_only_initialisers() -> None:
    init = treemod.nn.init
    for leaked in ("Any", "Callable", "Sequence", "functools", "jax", "jnp", "math", "annotations"):
        assert not hasattr(init, leaked), leaked
    for name in init.__all__:  # what remains: initialisers, factories and their type
        assert callable(getattr(init, name)) or name == "Initializer", name
