"""Shape checks without typeguard (an optional extra): in a fresh interpreter whose packages are
the installed ones minus typeguard (and minus beartype), plain jaxtyping array annotations are
still checked, and an annotation that needs a runtime type checker is an `ImportError` that says
what to install, never a silent pass."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import sysconfig

import pytest

pytestmark = pytest.mark.heavy  # fresh interpreters

ROOT = pathlib.Path(__file__).resolve().parents[2]

_PROGRAM = """
import importlib.util, sys
import jax.numpy as jnp
from jaxtyping import Array, Float
import treemod as tm

print("typeguard importable:", importlib.util.find_spec("typeguard") is not None)
print("beartype importable:", importlib.util.find_spec("beartype") is not None)

class Vec(tm.Module):
    x: Float[Array, "2"]

class Pair(tm.Module):
    w: Float[Array, " n"]
    def dot(self, xs: tuple[Float[Array, " n"], Float[Array, " n"]]) -> Float[Array, ""]:
        return jnp.dot(xs[0], xs[1])

tm.shape_checks(True)  # the default checker ('auto'): no error without one
try:
    Vec(jnp.ones(3))
except tm.ShapeCheckError as e:
    print("array check:", str(e).splitlines()[0])
try:
    Pair(jnp.ones(3)).dot((jnp.ones(3), jnp.ones(2)))
except ImportError as e:
    print("tuple check:", type(e).__name__, str(e).split(":")[0])
except tm.ShapeCheckError as e:
    print("tuple check:", str(e).splitlines()[0])
try:
    tm.shape_checks(True, checker="typeguard")
except ImportError as e:
    print("typeguard chosen:", str(e).split(":")[0])
print("typeguard imported:", "typeguard" in sys.modules)
"""


def _run_without(tmp_path: pathlib.Path, *missing: str) -> list[str]:
    """Run `_PROGRAM` with the installed packages, except the distributions `missing`."""
    site = pathlib.Path(sysconfig.get_paths()["purelib"])
    farm = tmp_path / "site-packages"
    farm.mkdir()
    for entry in site.iterdir():
        if not entry.name.lower().startswith(missing):
            (farm / entry.name).symlink_to(entry)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{farm}", "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-S", "-c", _PROGRAM],  # -S: no site-packages but the farm
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_without_any_runtime_checker(tmp_path: pathlib.Path) -> None:
    assert _run_without(tmp_path, "typeguard", "beartype") == [
        "typeguard importable: False",
        "beartype importable: False",
        "array check: Vec.x: expected Float[Array, '2'], got f32[3]",
        "tuple check: ImportError Pair.dot argument xs",
        "typeguard chosen: Shape checks use typeguard, which is not installed",
        "typeguard imported: False",
    ]


def test_without_typeguard_beartype_checks(tmp_path: pathlib.Path) -> None:
    lines = _run_without(tmp_path, "typeguard")
    assert lines[:3] == [
        "typeguard importable: False",
        "beartype importable: True",
        "array check: Vec.x: expected Float[Array, '2'], got f32[3]",
    ]
    assert lines[3].startswith("tuple check: Pair.dot argument xs: expected tuple[")
    assert lines[4:] == [
        "typeguard chosen: Shape checks use typeguard, which is not installed",
        "typeguard imported: False",
    ]
