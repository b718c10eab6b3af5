"""Shape-check backends: typeguard 2.13 and beartype really check; a broken checker is an error."""

import importlib.metadata

import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float

import treemod as tm
from treemod._shapecheck import config


class Pair(tm.Module):
    weight: Float[Array, " n"]

    def dot(self, xs: tuple[Float[Array, " n"], Float[Array, " n"]]) -> Float[Array, ""]:
        return jnp.dot(xs[0], xs[1]) + jnp.sum(self.weight)


class Vec(tm.Module):
    x: Float[Array, "2"]


@pytest.fixture(autouse=True)
def _restore(shape_checks_restored: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # The global setting comes back through tests/conftest.py; the verified checkers here.
    monkeypatch.setattr(config, "_VERIFIED", set(config._VERIFIED))


@pytest.mark.parametrize("checker", ["typeguard", "beartype"])
def test_installed_checker_catches_a_known_bad_call(checker):
    # If the installed checker silently passed jaxtyping annotations, this test would fail.
    tm.set_shape_checks(True, checker=checker)
    pair = Pair(jnp.ones(3))
    assert pair.dot((jnp.ones(3), jnp.ones(3))).shape == ()
    with pytest.raises(tm.ShapeCheckError, match=r"Pair\.dot argument xs: .* with n=3"):
        pair.dot((jnp.ones(3), jnp.ones(2)))
    with pytest.raises(tm.ShapeCheckError, match=r"Vec\.x"):
        Vec(jnp.ones(3))
    assert config._probe(config.BACKENDS[checker])


def test_pinned_typeguard_is_installed():
    assert importlib.metadata.version("typeguard").startswith("2.13")


def test_jaxtyping_itself_checks():
    annotation = Float[np.ndarray, "n n"]
    assert isinstance(np.zeros((2, 2), np.float32), annotation)
    assert not isinstance(np.zeros((2, 3), np.float32), annotation)


def test_typeguard_3_or_4_is_refused(monkeypatch):
    config._VERIFIED.clear()
    monkeypatch.setitem(config._VERSIONS, "typeguard", lambda: "4.4.2")
    with pytest.raises(tm.ShapeCheckerError) as info:
        tm.set_shape_checks(True, checker="typeguard")
    message = str(info.value)
    assert "typeguard 4.4.2 is installed" in message
    assert "pip install 'typeguard>=2.13.3,<3'" in message
    assert "checker='beartype'" in message


def test_a_checker_that_checks_nothing_is_refused(monkeypatch):
    config._VERIFIED.clear()
    monkeypatch.setitem(config.BACKENDS, "beartype", lambda name, value, annotation: "")
    with pytest.raises(tm.ShapeCheckerError, match=r"beartype .* does not catch a known-bad"):
        tm.set_shape_checks(True, checker="beartype")
    with pytest.raises(tm.ShapeCheckerError):
        with tm.shape_checks(True, checker="beartype"):
            pass


def test_a_missing_checker_is_refused(monkeypatch):
    config._VERIFIED.clear()

    def missing() -> str:
        raise importlib.metadata.PackageNotFoundError("beartype")

    monkeypatch.setitem(config._VERSIONS, "beartype", missing)
    with pytest.raises(tm.ShapeCheckerError, match=r"beartype, which is not installed: pip"):
        tm.set_shape_checks(True, checker="beartype")


def test_a_broken_checker_chosen_by_environment_fails_at_the_first_check(monkeypatch):
    # As if TREEMOD_SHAPE_CHECKER=beartype had been set with a no-op beartype installed.
    config._VERIFIED.clear()
    monkeypatch.setitem(config.BACKENDS, "beartype", lambda name, value, annotation: "")
    monkeypatch.setattr(config, "_GLOBAL", [True, "beartype"])
    with pytest.raises(tm.ShapeCheckerError, match="does not catch a known-bad"):
        Vec(jnp.ones(2))


def test_turning_checks_off_needs_no_checker(monkeypatch):
    config._VERIFIED.clear()
    monkeypatch.setitem(config._VERSIONS, "typeguard", lambda: "4.4.2")
    tm.set_shape_checks(False, checker="typeguard")
    Vec(jnp.ones(3))  # not checked, no error
