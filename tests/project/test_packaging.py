"""Packaging: the license is an SPDX expression, metadata builds without deprecation warnings,
and `make demo` installs only the light `examples` extra."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import tomllib

import pytest

pytestmark = pytest.mark.heavy  # fresh processes or tools

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

_BUILD_METADATA = """
import sys, tempfile, warnings
from setuptools import build_meta
out = tempfile.mkdtemp()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    name = build_meta.prepare_metadata_for_build_editable(out)
for w in caught:
    print("WARNING", w.category.__name__, str(w.message).splitlines()[0])
print(open(f"{out}/{name}/METADATA").read())
"""


def test_license_is_an_spdx_expression_that_setuptools_takes_without_warning() -> None:
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    # PEP 639 license strings need setuptools 77 or later, in the isolated build too.
    (requirement,) = PYPROJECT["build-system"]["requires"]
    minimum = re.fullmatch(r"setuptools>=(\d+)(\.\d+)*", requirement)
    assert minimum is not None and int(minimum.group(1)) >= 77, requirement
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} here predates PEP 639 (77)")
    result = subprocess.run(
        [sys.executable, "-c", _BUILD_METADATA],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "WARNING" not in result.stdout and "Deprecat" not in result.stderr, result.stdout
    assert "License-Expression: Apache-2.0" in result.stdout


def test_make_demo_installs_only_the_examples_extra() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    heavy = {"torch", "equinox", "flax", "dm-haiku", "tensorflow"}
    names = {re.split(r"[<>=\[; ]", r, maxsplit=1)[0].lower() for r in extras["examples"]}
    assert not names & heavy, names
    makefile = (ROOT / "Makefile").read_text()
    demo = re.search(r"^demo: (.+)$", makefile, re.M)
    assert demo is not None and demo.group(1).split() == ["$(VENV)/.examples"]
    install = re.search(r"^\$\(VENV\)/\.examples:.*\n\t(.+)$", makefile, re.M)
    assert install is not None and install.group(1) == "$(PIP) -e '.[examples]'"
