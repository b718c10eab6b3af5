"""`is_module`: how code below `treemod._module` recognises a `Module` without importing it.

The Module metaclass (`treemod/_module/module.py`) sets `__tm_static_fields__` (the names of
the static fields) on every Module class: that attribute is the marker, read only here. It
also reads the class-level hook `__tm_check_descendants__` that `tree_at` consults.
"""

from __future__ import annotations

from typing import Any

__all__ = ["check_descendants", "is_module", "is_module_class", "static_field_names"]


def is_module(x: Any) -> bool:
    """Whether `x` is an instance of a `treemod.Module` subclass."""
    return hasattr(type(x), "__tm_static_fields__")


def is_module_class(cls: Any) -> bool:
    """Whether `cls` is `treemod.Module` or a subclass of it."""
    return isinstance(cls, type) and hasattr(cls, "__tm_static_fields__")


def static_field_names(cls: type) -> tuple[str, ...]:
    """The names of `cls`'s static fields (`field(static=True)`); `()` for other classes."""
    names: tuple[str, ...] = getattr(cls, "__tm_static_fields__", ())
    return names


def check_descendants(node: Any) -> bool:
    """Whether modules rebuilt below `node` have their fields shape-checked (`tree_at`).

    A Module class sets the class-level hook `__tm_check_descendants__ = False` when the
    arrays below it do not match their own annotations (`nn.Stack`: an extra leading axis).
    """
    return bool(getattr(type(node), "__tm_check_descendants__", True))
