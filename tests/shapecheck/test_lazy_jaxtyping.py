"""`import treemod` leaves jaxtyping (and typeguard, wadler_lindig, beartype) unimported until
shape checks or printing need them, and the checks behave as before once they do.

Each test runs in a fresh interpreter (tests/fresh_interpreter.py): the test process has
imported jaxtyping long ago. The expected messages are written out by hand from the
annotations and shapes in the snippet.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.fresh_interpreter import run_printing

_DEFERRED = ("jaxtyping", "typeguard", "wadler_lindig", "beartype", "treemod._shapecheck.engine")
_LOADED = f"[m for m in {_DEFERRED!r} if m in sys.modules]"


def _run(code: str) -> list[str]:
    return run_printing(textwrap.dedent(code)).splitlines()


@pytest.mark.heavy
def test_import_treemod_imports_no_jaxtyping_typeguard_or_wadler_lindig() -> None:
    out = _run(f"""
        import sys
        import treemod as tm
        print({_LOADED})
        """)
    assert out == ["[]"]


@pytest.mark.heavy
def test_modules_without_jaxtyping_annotations_never_load_it() -> None:
    # Plain annotations, a method with annotations, a forward reference in a string
    # annotation (wrapped at class creation, resolved at the first call), tree_at, filter_jit.
    out = _run(f"""
        from __future__ import annotations
        import sys
        import jax, jax.numpy as jnp
        import treemod as tm

        class Affine(tm.Module):
            weight: jax.Array
            bias: jax.Array

            def __call__(self, x: jax.Array) -> jax.Array:
                return self.weight @ x + self.bias

            def pair(self, other: Later) -> Later:
                return other

        class Later(tm.Module):
            v: int

        layer = Affine(jnp.ones((2, 3)), jnp.zeros(2))
        print(layer(jnp.ones(3)).tolist(), layer.pair(Later(1)).v)
        layer = tm.tree_at(lambda m: m.bias, layer, jnp.ones(2))
        print(tm.filter_jit(lambda m, x: m(x))(layer, jnp.ones(3)).tolist())
        print({_LOADED})
        try:
            raise ValueError("not a shape error")
        except tm.ShapeCheckError:
            print("wrong handler")
        except ValueError as e:
            print(e)
        print({_LOADED})
        """)
    assert out == [
        "[3.0, 3.0] 1",
        "[4.0, 4.0]",
        "[]",
        "not a shape error",
        # `except tm.ShapeCheckError` looked the class up: that loads it, and jaxtyping.
        "['jaxtyping', 'typeguard', 'treemod._shapecheck.engine']",
    ]


@pytest.mark.heavy
def test_jaxtyping_annotations_are_checked_after_a_plain_import_treemod() -> None:
    out = _run("""
        import io, pickle, sys
        import jax.numpy as jnp
        import treemod as tm
        from jaxtyping import Array, Float, TypeCheckError

        class Affine(tm.Module):
            weight: Float[Array, "out in"]
            bias: Float[Array, " out"]

            def __call__(self, x: Float[Array, " in"]) -> Float[Array, " out"]:
                return self.weight @ x + self.bias

        layer = Affine(jnp.ones((2, 3)), jnp.zeros(2))
        print(layer(jnp.ones(3)).shape)
        for build in (lambda: Affine(jnp.ones((2, 3)), jnp.zeros(3)), lambda: layer(jnp.ones(4))):
            try:
                build()
            except tm.ShapeCheckError as e:
                print(str(e).splitlines()[0])
                error = e
        from treemod._shapecheck import checker, engine
        print(isinstance(error, TypeCheckError), isinstance(error, TypeError))
        print(tm.ShapeCheckError is checker.ShapeCheckError is engine.ShapeCheckError)
        again = pickle.loads(pickle.dumps(error))
        print(type(again) is tm.ShapeCheckError, str(again) == str(error))
        # Pickles written when the class lived in checker.py still find it.
        old = pickle.Unpickler(io.BytesIO(b""))
        found = old.find_class("treemod._shapecheck.checker", "ShapeCheckError")
        print(found is tm.ShapeCheckError)
        print("ShapeCheckError" in dir(tm), "ShapeCheckError" in tm.__all__)
        """)
    assert out == [
        "(2,)",
        "Affine.bias: expected Float[Array, 'out'] with out=2 (bound by Affine.weight), got f32[3]",
        "Affine.__call__ argument x: expected Float[Array, 'in'] with in=3 (bound by "
        "Affine.weight), got f32[4]",
        "True True",
        "True",
        "True True",
        "True",
        "True True",
    ]


@pytest.mark.heavy
def test_string_annotations_naming_jaxtyping_are_checked_or_reported() -> None:
    # jaxtyping imported by the defining module: checked. Imported only for type checkers
    # (so absent at runtime): reported as before, naming the class and field, at the first
    # construction.
    out = _run("""
        from __future__ import annotations
        import sys
        from typing import TYPE_CHECKING
        import jax.numpy as jnp
        import treemod as tm

        if TYPE_CHECKING:
            from jaxtyping import Array, Float

        class Hidden(tm.Module):
            x: Float[Array, " n"]

        try:
            Hidden(jnp.ones(2))
        except NameError as e:
            print(str(e).split(" for shape")[0])
        print("jaxtyping" in sys.modules)

        from jaxtyping import Array, Float

        class Pair(tm.Module):
            a: Float[Array, " n"]
            b: Float[Array, " n"]

        Pair(jnp.ones(2), jnp.ones(2))
        try:
            Pair(jnp.ones(2), jnp.ones(5))
        except tm.ShapeCheckError as e:
            print(str(e).splitlines()[0])
        """)
    assert out == [
        "treemod could not resolve the annotation \"Float[Array, ' n']\" of field Hidden.x",
        "False",
        "Pair.b: expected Float[Array, 'n'] with n=2 (bound by Pair.a), got f32[5]",
    ]
