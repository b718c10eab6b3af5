"""Shape checks with string annotations (`from __future__ import annotations`)."""

from __future__ import annotations

import jax.numpy as jnp
import pytest
from jaxtyping import Array, Float

import treemod as tm

Vector = Float[Array, " n"]


class Linear(tm.Module):
    weight: Float[Array, "out in"]
    bias: Float[Array, " out"]
    child: Later | None = None  # a forward reference, not a shape annotation

    def __call__(self, x: Float[Array, " in"]) -> Float[Array, " out"]:
        return self.weight @ x + self.bias

    def later(self, other: Later) -> Later:  # forward reference: resolved at the first call
        return other


class Later(tm.Module):
    v: Vector


class Typo(tm.Module):
    x: Floatt[Array, " n"]  # type: ignore[name-defined]  # noqa: F821


pytestmark = pytest.mark.usefixtures("shape_checks_on")  # tests/conftest.py


def test_module_level_string_annotations_are_checked():
    layer = Linear(jnp.ones((2, 3)), jnp.zeros(2))
    assert layer(jnp.ones(3)).shape == (2,)
    with pytest.raises(tm.ShapeCheckError, match=r"^Linear\.bias: expected Float\[Array, 'out'\]"):
        Linear(jnp.ones((2, 3)), jnp.zeros(3))
    with pytest.raises(tm.ShapeCheckError, match=r"^Linear\.__call__ argument x: .* in=3"):
        layer(jnp.ones(4))
    later = Later(jnp.ones(4))
    assert layer.later(later) is later
    with pytest.raises(tm.ShapeCheckError, match=r"^Later\.v: expected Float\[Array, 'n'\]"):
        Later(jnp.ones((2, 2)))


def test_local_names_in_string_annotations_are_resolved():
    Local = Float[Array, " k"]

    class UsesLocal(tm.Module):
        a: Local
        b: Local

        def __call__(self, x: Local) -> Local:
            return self.a * x + self.b

    m = UsesLocal(jnp.ones(2), jnp.ones(2))
    assert m(jnp.ones(2)).shape == (2,)
    with pytest.raises(
        tm.ShapeCheckError, match=r"^UsesLocal\.b: .* with k=2 \(bound by UsesLocal\.a\)"
    ):
        UsesLocal(jnp.ones(2), jnp.ones(3))
    with pytest.raises(tm.ShapeCheckError, match=r"^UsesLocal\.__call__ argument x: .*k=2"):
        m(jnp.ones(5))


def test_unresolvable_shape_annotation_is_reported():
    with pytest.raises(NameError, match=r"annotation .*Floatt.* of field Typo\.x .*Floatt"):
        Typo(jnp.ones(2))
