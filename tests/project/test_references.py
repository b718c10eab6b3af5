"""A reference library missing in CI stops the run (tests/conftest.py runs helpers.py's check),
and `make test` installs every reference library (pyproject.toml's `dev` and `torch` extras)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

import helpers

ROOT = Path(__file__).resolve().parents[2]


def test_ci_refuses_to_run_without_a_reference_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(helpers.REFERENCES, "no_such_reference_lib", "no-such-reference-lib")
    monkeypatch.setitem(helpers.REFERENCES, "no_such_parent.child", "no-such-parent")
    with pytest.raises(pytest.UsageError, match="no-such-reference-lib, no-such-parent") as e:
        helpers.require_references({"CI": "true"})
    assert "pip install -e '.[dev,torch]'" in str(e.value)
    helpers.require_references({})  # outside CI: the tests that need one skip


def test_the_installed_environment_has_every_reference_library() -> None:
    assert helpers.missing_references() == []


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
    assert set(helpers.REFERENCES.values()) - names - runtime == set()
