"""`AbstractVar` and `AbstractClassVar`: attributes that concrete Module subclasses must provide.

The Module metaclass (`module.py`) classifies each annotation with `abstract_kind`, takes the
abstract ones out of the class's fields, and records which are still unprovided in the class's
`ModuleInfo`; a class with any cannot be instantiated.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

__all__ = ["AbstractClassVar", "AbstractVar", "abstract_kind"]

_T = TypeVar("_T")

if TYPE_CHECKING:
    AbstractVar = ClassVar  # type checkers see an attribute declaration
    AbstractClassVar = ClassVar
else:

    class AbstractVar(Generic[_T]):
        """Declare an attribute that concrete subclasses must provide.

        `x: AbstractVar[int]` in an abstract module means every instantiable subclass defines
        `x`, as a field or as a class attribute. A subclass that does not is abstract: building
        it raises `TypeError` naming the missing attribute.

        Example:
            >>> import treemod as tm
            >>> class Shape(tm.Module):
            ...     sides: tm.AbstractVar[int]
            >>> class Triangle(Shape):
            ...     sides: int = 3
            >>> Triangle().sides
            3
        """

    class AbstractClassVar(Generic[_T]):
        """Declare a class variable that concrete subclasses must provide.

        `x: AbstractClassVar[int]` means every instantiable subclass defines `x` as a class
        variable (`x: ClassVar[int] = 3`, or a plain class attribute); providing it as a
        dataclass field is an error at class creation. A subclass that does not provide it is
        abstract: building it raises `TypeError` naming the missing attribute.

        Example:
            >>> from typing import ClassVar
            >>> import treemod as tm
            >>> class Codec(tm.Module):
            ...     extension: tm.AbstractClassVar[str]
            >>> class Json(Codec):
            ...     extension: ClassVar[str] = ".json"
            >>> Json().extension
            '.json'
        """


_ABSTRACT_VAR = re.compile(r"(^|\.)AbstractVar\[")
_ABSTRACT_CLASS_VAR = re.compile(r"(^|\.)AbstractClassVar\[")


def abstract_kind(annotation: Any, owner: str = "") -> str | None:
    """Classify an annotation: "var" (`AbstractVar[...]`), "classvar" (`AbstractClassVar`), None."""
    if isinstance(annotation, str):
        if _ABSTRACT_VAR.search(annotation):
            return "var"
        return "classvar" if _ABSTRACT_CLASS_VAR.search(annotation) else None
    if annotation is AbstractVar or annotation is AbstractClassVar:
        kind = "AbstractVar" if annotation is AbstractVar else "AbstractClassVar"
        raise TypeError(
            f"{owner} is annotated with an unsubscripted {kind}; give the attribute's type, "
            f"as in `{kind}[int]`."
        )
    origin = getattr(annotation, "__origin__", None)
    if origin is AbstractVar:
        return "var"
    return "classvar" if origin is AbstractClassVar else None
