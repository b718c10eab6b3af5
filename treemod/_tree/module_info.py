"""`ModuleInfo`: what the Module metaclass records about each class, read by every layer.

The Module metaclass (`treemod/_module/module.py`) builds one `ModuleInfo` per class when the
class is created and stores it on the class; code at any layer reads it through
`module_info(cls)`, so nothing below `treemod._module` imports `Module`. Having a record is
what makes a class a Module class (`is_module`, `is_module_class`).

The record is immutable. Two facts are known only after the class statement has run: the
fields' shape-check analysis (computed at the first check, it may need names defined later in
the file) and the `treemod.shapecheck` class decorator's option; `update_module_info` replaces
the class's record with one that has them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "ModuleInfo",
    "check_descendants",
    "is_module",
    "is_module_class",
    "module_info",
    "static_field_names",
    "update_module_info",
]

# The one attribute the record is stored under, set only by `ModuleMeta` and
# `update_module_info`. Code outside this file and the metaclass reads `module_info(cls)`.
INFO_ATTRIBUTE = "__treemod_info__"


@dataclasses.dataclass(frozen=True, slots=True)
class ModuleInfo:
    """One Module class's fields, construction steps, abstract attributes and class options.

    Fields (what the metaclass derives from the class body and its bases):
        fields: the dataclass fields stored on instances, in order (fields that a subclass
            overrides with a class-level value are not among them).
        field_names: the names of `fields`.
        static_fields: the names of the `field(static=True)` fields (in the treedef).
        init_false_fields: the names of the `field(init=False)` fields.
        converters: `(name, converter)` of the fields with a `converter=`.
        class_provided: fields of a base that this class overrides with a class-level value.
        check_inits: every `__check_init__` in the MRO, subclass first.
        custom_init: whether `__init__` is hand-written (here or inherited), not generated.
        abstract_vars: the `AbstractVar` and `AbstractClassVar` names no class provides yet;
            a class with any cannot be instantiated.
        abstract_class_vars: which of the abstract names (provided or not) are
            `AbstractClassVar`s.
        field_annotations: the fields' string annotations that could be resolved where the
            class statement ran (local names included); the others are resolved at the first
            shape check.

    Class options (keywords of the `class` statement, inherited by subclasses that do not give
    them; see `treemod.Module`):
        shapecheck: `shapecheck=`: `True` always checks this class's shapes, `False` never,
            `None` follows `treemod.shape_checks`.
        check_descendants: `check_descendants=`: `False` when the arrays of the modules below
            an instance do not match their own annotations (`nn.Stack`, whose arrays carry a
            leading layer axis), so `tree_at` does not shape-check the modules it rebuilds there.
        strict_abstract_class_vars: `strict_abstract_class_vars=`: `True` (treemod) refuses a
            field that provides a base's `AbstractClassVar`; `False` (Equinox's rule, for the
            compat namespace) accepts it, and also a bare annotation (`x: ClassVar[int]`).
        holds_state: `holds_state=`: `True` for `treemod.State`: `tree_summary` counts the
            arrays below an instance as state, not parameters.
        options_given: the options this class's statement gave (the others are inherited).

    Set after creation (`update_module_info`):
        field_spec: the shape-check analysis of the annotated fields (`()`: none), `None`
            until the first check computes it.
    """

    fields: tuple[dataclasses.Field[Any], ...]
    field_names: frozenset[str]
    static_fields: tuple[str, ...]
    init_false_fields: tuple[str, ...]
    converters: tuple[tuple[str, Callable[[Any], Any]], ...]
    class_provided: tuple[str, ...]
    check_inits: tuple[Callable[[Any], None], ...]
    custom_init: bool
    abstract_vars: frozenset[str]
    abstract_class_vars: frozenset[str]
    field_annotations: Mapping[str, Any]
    shapecheck: bool | None
    check_descendants: bool
    strict_abstract_class_vars: bool
    holds_state: bool
    options_given: frozenset[str]
    field_spec: tuple[Any, ...] | None = None


def module_info(cls: type) -> ModuleInfo:
    """The record of the Module class `cls`.

    Arguments:
        cls: `treemod.Module` or a subclass.

    Returns:
        Its `ModuleInfo`.

    Raises:
        TypeError: `cls` is not a Module class.
    """
    info: ModuleInfo | None = getattr(cls, INFO_ATTRIBUTE, None)
    if info is None:
        raise TypeError(f"{cls!r} is not a treemod.Module class, so it has no ModuleInfo.")
    return info


def update_module_info(cls: type, **changes: Any) -> ModuleInfo:
    """Replace `cls`'s record with a copy that has `changes` (`field_spec`, `shapecheck`).

    Arguments:
        cls: a Module class.
        **changes: `ModuleInfo` fields and their new values.

    Returns:
        The new record.
    """
    info = dataclasses.replace(module_info(cls), **changes)
    type.__setattr__(cls, INFO_ATTRIBUTE, info)
    return info


def is_module(x: Any) -> bool:
    """Whether `x` is an instance of a `treemod.Module` subclass."""
    return hasattr(type(x), INFO_ATTRIBUTE)


def is_module_class(cls: Any) -> bool:
    """Whether `cls` is `treemod.Module` or a subclass of it."""
    return isinstance(cls, type) and hasattr(cls, INFO_ATTRIBUTE)


def static_field_names(cls: type) -> tuple[str, ...]:
    """The names of `cls`'s static fields (`field(static=True)`); `()` for other classes."""
    info: ModuleInfo | None = getattr(cls, INFO_ATTRIBUTE, None)
    return () if info is None else info.static_fields


def check_descendants(node: Any) -> bool:
    """Whether `tree_at` shape-checks the modules it rebuilds below `node` (the class option
    `check_descendants=`; `True` for anything that is not a module)."""
    info: ModuleInfo | None = getattr(type(node), INFO_ATTRIBUTE, None)
    return True if info is None else info.check_descendants
