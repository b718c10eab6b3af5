"""Shape-check backends: typeguard 2.13 and beartype really check; a broken or missing checker is
an `ImportError` saying what to install (never a check that silently passes)."""

import importlib.metadata

import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float

import treemod as tm
from treemod._shapecheck import backends, config


class Pair(tm.Module):
    weight: Float[Array, " n"]

    def dot(self, xs: tuple[Float[Array, " n"], Float[Array, " n"]]) -> Float[Array, ""]:
        return jnp.dot(xs[0], xs[1]) + jnp.sum(self.weight)


class Vec(tm.Module):
    x: Float[Array, "2"]


@pytest.fixture(autouse=True)
def _restore(shape_checks_restored: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # The global setting comes back through tests/conftest.py; the verified checkers here.
    monkeypatch.setattr(backends, "_RESOLVED", dict(backends._RESOLVED))


@pytest.mark.parametrize("checker", ["typeguard", "beartype"])
def test_installed_checker_catches_a_known_bad_call(checker):
    # If the installed checker silently passed jaxtyping annotations, this test would fail.
    tm.shape_checks(True, checker=checker)
    pair = Pair(jnp.ones(3))
    assert pair.dot((jnp.ones(3), jnp.ones(3))).shape == ()
    with pytest.raises(tm.ShapeCheckError, match=r"Pair\.dot argument xs: .* with n=3"):
        pair.dot((jnp.ones(3), jnp.ones(2)))
    with pytest.raises(tm.ShapeCheckError, match=r"Vec\.x"):
        Vec(jnp.ones(3))
    assert backends.probe(backends.BACKENDS[checker])


def test_pinned_typeguard_is_installed():
    assert importlib.metadata.version("typeguard").startswith("2.13")


def test_jaxtyping_itself_checks():
    annotation = Float[np.ndarray, "n n"]
    assert isinstance(np.zeros((2, 2), np.float32), annotation)
    assert not isinstance(np.zeros((2, 3), np.float32), annotation)


def test_typeguard_3_or_4_is_refused(monkeypatch):
    backends._RESOLVED.clear()
    monkeypatch.setitem(backends._VERSIONS, "typeguard", lambda: "4.4.2")
    with pytest.raises(ImportError) as info:
        tm.shape_checks(True, checker="typeguard")
    message = str(info.value)
    assert "typeguard 4.4.2 is installed" in message
    assert "pip install 'typeguard>=2.13.3,<3'" in message
    assert "checker='beartype'" in message


def test_a_checker_that_checks_nothing_is_refused(monkeypatch):
    backends._RESOLVED.clear()
    monkeypatch.setitem(backends.BACKENDS, "beartype", lambda name, value, annotation: "")
    with pytest.raises(ImportError, match=r"beartype .* does not catch a known-bad"):
        tm.shape_checks(True, checker="beartype")
    with pytest.raises(ImportError):
        with tm.shape_checks(True, checker="beartype"):
            pass


def test_a_missing_checker_is_refused(monkeypatch):
    backends._RESOLVED.clear()

    def missing() -> str:
        raise importlib.metadata.PackageNotFoundError("beartype")

    monkeypatch.setitem(backends._VERSIONS, "beartype", missing)
    with pytest.raises(ImportError, match=r"beartype, which is not installed: pip"):
        tm.shape_checks(True, checker="beartype")


def test_a_broken_checker_chosen_by_environment_fails_at_the_first_check(monkeypatch):
    # As if TREEMOD_SHAPE_CHECKER=beartype had been set with a no-op beartype installed.
    backends._RESOLVED.clear()
    monkeypatch.setitem(backends.BACKENDS, "beartype", lambda name, value, annotation: "")
    monkeypatch.setattr(config, "_GLOBAL", [True, "beartype"])
    with pytest.raises(ImportError, match="does not catch a known-bad"):
        Vec(jnp.ones(2))


def test_turning_checks_off_needs_no_checker(monkeypatch):
    backends._RESOLVED.clear()
    monkeypatch.setitem(backends._VERSIONS, "typeguard", lambda: "4.4.2")
    tm.shape_checks(False, checker="typeguard")
    Vec(jnp.ones(3))  # not checked, no error


def _missing(name: str):
    def version() -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    return version


def test_auto_skips_a_typeguard_that_checks_nothing_and_takes_beartype(monkeypatch):
    backends._RESOLVED.clear()
    monkeypatch.setitem(backends._VERSIONS, "typeguard", lambda: "4.4.2")
    tm.shape_checks(True, checker="auto")
    assert backends.ensure_checker("auto") == "beartype"
    with pytest.raises(tm.ShapeCheckError, match=r"Pair\.dot argument xs: .* with n=3"):
        Pair(jnp.ones(3)).dot((jnp.ones(3), jnp.ones(2)))


def test_auto_without_any_checker_checks_arrays_and_refuses_the_rest(monkeypatch):
    backends._RESOLVED.clear()
    monkeypatch.setitem(backends._VERSIONS, "typeguard", _missing("typeguard"))
    monkeypatch.setitem(backends._VERSIONS, "beartype", _missing("beartype"))
    tm.shape_checks(True, checker="auto")  # no error: plain array annotations need no checker
    assert backends.ensure_checker("auto") is None
    with pytest.raises(tm.ShapeCheckError, match=r"Vec\.x: expected Float\[Array, '2'\]"):
        Vec(jnp.ones(3))
    pair = Pair(jnp.ones(3))
    with pytest.raises(ImportError) as info:
        pair.dot((jnp.ones(3), jnp.ones(3)))  # a tuple: typeguard or beartype would check it
    message = str(info.value)
    assert message.startswith("Pair.dot argument xs: checking tuple[Float[Array, 'n'], ")
    assert "pip install 'treemod[typeguard]'" in message and "beartype" in message
