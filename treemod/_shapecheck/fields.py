"""`field_spec`: which fields of a Module class carry jaxtyping annotations, cached in its record.

Computed at a class's first field check (not at class creation: a string annotation may name
something defined later in the file) and stored in the class's `ModuleInfo`. A class without
any jaxtyping annotation (every class, while jaxtyping is not imported) gets `()` without
importing jaxtyping; one with them loads `spec.py` (jaxtyping is then imported already).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import TYPE_CHECKING, Any

from treemod._shapecheck.annotations import (
    UnresolvedAnnotation,
    contains_jaxtyping,
    display_name,
    resolve_annotation,
    unresolved_error,
)
from treemod._tree.module_info import ModuleInfo, is_module_class, module_info, update_module_info

if TYPE_CHECKING:
    from treemod._shapecheck.spec import Entry

__all__ = ["field_spec"]


def _early_annotations(owner: type) -> Any:
    """The string annotations of `owner`'s own fields resolved where its class statement ran."""
    return module_info(owner).field_annotations if is_module_class(owner) else {}


def field_spec(cls: type) -> tuple[Entry, ...]:
    """The fields of the Module class `cls` that carry jaxtyping annotations, analysed (once).

    Arguments:
        cls: a Module class.

    Returns:
        One `spec.Entry` per annotated field, in field order; `()` when there are none.
    """
    info: ModuleInfo = module_info(cls)
    if info.field_spec is not None:
        return info.field_spec
    found: list[tuple[str, Any]] = []
    for f in dataclasses.fields(cls):
        annotation = f.type
        if isinstance(annotation, str):
            owner = next(
                (k for k in cls.__mro__ if f.name in k.__dict__.get("__annotations__", {})), cls
            )
            early = _early_annotations(owner)
            if f.name in early:
                annotation = early[f.name]
            else:
                module = sys.modules.get(owner.__module__)
                globalns = vars(module) if module is not None else {}
                try:
                    annotation = resolve_annotation(annotation, globalns, dict(vars(owner)))
                except UnresolvedAnnotation as e:
                    what = f"field {display_name(cls)}.{f.name}"
                    raise unresolved_error(what, f.type, e) from None
        if contains_jaxtyping(annotation):
            found.append((f.name, annotation))
    spec: tuple[Entry, ...] = ()
    if found:  # a jaxtyping annotation: jaxtyping is imported already
        from treemod._shapecheck.spec import make_entry

        spec = tuple(make_entry(n, a) for n, a in found)
    update_module_info(cls, field_spec=spec)
    return spec
