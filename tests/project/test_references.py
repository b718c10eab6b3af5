"""A reference library missing in CI stops the run (tests/conftest.py), and `make test`
installs every reference library (pyproject.toml's `dev` and `torch` extras)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

import conftest as suite  # tests/conftest.py: on pytest's pythonpath

ROOT = Path(__file__).resolve().parents[2]


def test_ci_refuses_to_run_without_a_reference_library(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(suite.REFERENCES, "no_such_reference_lib", "no-such-reference-lib")
    monkeypatch.setitem(suite.REFERENCES, "no_such_parent.child", "no-such-parent")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.UsageError, match="no-such-reference-lib, no-such-parent") as e:
        suite.pytest_configure(request.config)
    assert "pip install -e '.[dev,torch]'" in str(e.value)
    monkeypatch.delenv("CI")
    suite.pytest_configure(request.config)  # outside CI: the tests that need one skip


def test_the_installed_environment_has_every_reference_library() -> None:
    assert suite.missing_references() == []


def test_make_test_installs_every_reference_library() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = extras["optional-dependencies"]
    names = {
        re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower()  # type: ignore[union-attr]
        for extra in ("dev", "torch")
        for req in extras[extra]
    }
    # safetensors is a run-time dependency.
    runtime = {"safetensors"}
    assert set(suite.REFERENCES.values()) - names - runtime == set()
