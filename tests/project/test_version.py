"""`treemod.__version__` is the installed distribution's version, written once (pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

import treemod as tm

ROOT = Path(__file__).resolve().parents[2]


def test_the_version_is_the_one_in_pyproject_and_in_the_package_metadata() -> None:
    written = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert tm.__version__ == version("treemod") == written
    assert "__version__" in dir(tm)


@pytest.mark.heavy  # a fresh interpreter
def test_import_treemod_does_not_look_the_version_up() -> None:
    code = (
        "import treemod, importlib.metadata as m\n"
        "calls = []\n"
        "m.version = lambda name: calls.append(name) or '9.9'\n"
        "assert '__version__' not in vars(treemod)\n"
        "assert treemod.__version__ == '9.9' and calls == ['treemod']\n"
        "assert treemod.__version__ == '9.9' and calls == ['treemod']  # looked up once\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
