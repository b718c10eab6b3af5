"""The supported range is the tested one: pyproject.toml's lower bounds are exactly what the oldest
end of `make test` pins (.ci/oldest-constraints.txt), both ends are in `make test`, and the README
and the install page say the range."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _lower_bounds() -> dict[str, str]:
    bounds = {}
    for line in PROJECT["dependencies"]:
        req = Requirement(line)
        (lower,) = [s.version for s in req.specifier if s.operator == ">="]
        bounds[req.name] = lower
    return bounds


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / ".ci" / "oldest-constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.strip()] = version.strip()
    return pins


def test_the_oldest_end_pins_every_runtime_lower_bound_and_nothing_newer() -> None:
    pins, bounds = _pins(), _lower_bounds()
    assert {k: v for k, v in pins.items() if k != "jaxlib"} == bounds
    assert pins["jaxlib"] == pins["jax"]  # jax's own requirement admits a range: pin the pair


def test_python_and_jax_ranges_meet_at_the_oldest_end() -> None:
    # JAX 0.11 needs Python 3.12: the oldest Python's newest JAX is the oldest end's JAX.
    python = SpecifierSet(PROJECT["requires-python"])
    assert "3.11" in python and "3.10" not in python
    assert _lower_bounds()["jax"] == "0.10.2"
    classifiers = [c.rsplit(" ", 1)[-1] for c in PROJECT["classifiers"] if "Python :: 3." in c]
    assert classifiers == ["3.11", "3.12", "3.13"]


def test_make_test_runs_the_newest_end_and_the_oldest_one() -> None:
    plan = subprocess.run(
        ["make", "-n", "-B", "test"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert re.search(r"python3\.13 -m venv \.venv$", plan, re.M), plan
    assert re.search(r"python3\.11 -m venv \.venv-oldest$", plan, re.M), plan
    assert "-c .ci/oldest-constraints.txt" in plan
    # pytest runs through tests/resume.py (it resumes a run after a worker crash).
    runs = [line for line in plan.splitlines() if " tests/resume.py " in line]
    assert [r.split("/bin/python")[0] for r in runs] == [".venv", ".venv-oldest"]
    assert "-m " not in runs[0].split(" tests/resume.py ")[1]  # the whole suite, newest end


def test_the_readme_and_the_install_page_say_the_range() -> None:
    for page in ("README.md", "docs/getting-started.md"):
        text = (ROOT / page).read_text()
        assert "Python 3.11" in text and "3.13" in text, page
        assert "jax 0.10.2" in text and "jax 0.12" in text, page
