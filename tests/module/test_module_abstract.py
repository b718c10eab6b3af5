"""Abstract modules: `abc` methods, `AbstractVar` and `AbstractClassVar`, and their errors."""

import abc
import dataclasses
from typing import ClassVar

import jax.tree_util as jtu
import pytest

import treemod as tm

# --- 5. abstract modules ------------------------------------------------------------------------


class Shape(tm.Module):
    sides: tm.AbstractVar[int]
    name: "tm.AbstractVar[str]"  # a string, as with `from __future__ import annotations`

    @abc.abstractmethod
    def area(self) -> float: ...


def test_abstract_module_cannot_be_built_and_error_names_what_is_missing() -> None:
    with pytest.raises(TypeError, match=r"abstract module Shape.*name, sides.*area"):
        Shape()

    class NoName(Shape):
        sides: int = 3

        def area(self) -> float:
            return 1.0

    with pytest.raises(
        TypeError, match=r"NoName: it does not provide abstract attributes \(AbstractVar\) name\."
    ):
        NoName()


def test_abstract_vars_provided_as_field_class_attribute_or_property() -> None:
    class AsField(Shape):
        sides: int
        name: str = "field"

        def area(self) -> float:
            return 1.0

    class AsClassAttribute(Shape):
        sides = 4
        name = "attr"

        def area(self) -> float:
            return 2.0

    class AsProperty(Shape):
        n: int

        @property
        def sides(self) -> int:  # type: ignore[override]
            return self.n

        @property
        def name(self) -> str:  # type: ignore[override]
            return "prop"

        def area(self) -> float:
            return 3.0

    assert AsField(3).sides == 3 and AsField(3).name == "field"
    assert jtu.tree_leaves(AsField(3)) == [3, "field"]  # a field provided later is a leaf
    assert AsClassAttribute().sides == 4 and jtu.tree_leaves(AsClassAttribute()) == []
    assert AsProperty(5).sides == 5 and AsProperty(5).name == "prop"


def test_abstract_var_is_not_a_field_of_the_abstract_class() -> None:
    assert dataclasses.fields(Shape) == ()


def test_abstract_var_diamond_resolves_like_attribute_lookup() -> None:
    class Provider(tm.Module):
        sides: int = 6

    class Both(Provider, Shape):
        name: str = "both"

        def area(self) -> float:
            return 0.0

    assert Both().sides == 6


def test_abstract_var_under_future_annotations() -> None:
    namespace: dict = {}
    exec(
        "from __future__ import annotations\n"
        "import treemod as tm\n"
        "from treemod import AbstractVar\n"
        "class A(tm.Module):\n"
        "    x: AbstractVar[int]\n"
        "    y: tm.AbstractVar[list[int]]\n"
        "class B(A):\n"
        "    x: int\n"
        "    y: list = ()\n",
        namespace,
    )
    with pytest.raises(TypeError, match=r"A: it does not provide abstract attributes .* x, y"):
        namespace["A"]()
    assert namespace["B"](1).x == 1


class Codec(tm.Module):
    extension: tm.AbstractClassVar[str]


def test_abstract_class_var() -> None:
    class Json(Codec):
        extension: ClassVar[str] = ".json"

    class Plain(Codec):
        extension = ".txt"

    assert Json().extension == ".json" and Plain().extension == ".txt"
    assert jtu.tree_leaves(Json()) == [] and dataclasses.fields(Json) == ()
    with pytest.raises(TypeError, match=r"Codec: .*\(AbstractClassVar\) extension\."):
        Codec()

    class StillAbstract(Codec):
        pass

    with pytest.raises(TypeError, match=r"StillAbstract: .*\(AbstractClassVar\) extension"):
        StillAbstract()
    with pytest.raises(TypeError, match=r"AsField\.extension is declared as an AbstractClassVar"):

        class AsField(Codec):
            extension: str = ".bin"

    namespace: dict = {"__name__": __name__}  # dataclasses resolves "ClassVar" in this module
    exec(
        "from __future__ import annotations\n"
        "from typing import ClassVar\n"
        "import treemod as tm\n"
        "class A(tm.Module):\n"
        "    x: tm.AbstractClassVar[int]\n"
        "class B(A):\n"
        "    x: ClassVar[int] = 2\n",
        namespace,
    )
    assert namespace["B"]().x == 2
    with pytest.raises(TypeError, match=r"\(AbstractClassVar\) x"):
        namespace["A"]()
