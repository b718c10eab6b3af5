"""What a shape check checks: `Entry` (one annotated field, argument or return value) and
`CallSpec` (a call), made from the annotations.

Imported with the engine (it builds on jaxtyping, through `array_checker.py`), and by
`fields.py` at the first class whose fields carry a jaxtyping annotation.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from treemod._shapecheck.annotations import (
    UnresolvedAnnotation,
    contains_jaxtyping,
    dim_names,
    display_name,
    format_annotation,
    function_annotations,
    unresolved_error,
)
from treemod._shapecheck.array_checker import array_checker, call_plan

__all__ = ["CallSpec", "Entry", "analyse_call", "make_entry"]


@dataclasses.dataclass(frozen=True)
class Entry:
    """One checked field, argument or return value: its annotation, printed form, dimensions."""

    name: str
    annotation: Any
    text: str
    dims: tuple[str, ...]
    kind: Any = None  # inspect.Parameter kind, for arguments
    fast: Callable[[Any], bool] | None = None  # a fast check of common array annotations


@dataclasses.dataclass(frozen=True)
class CallSpec:
    """What a call of an annotated function checks (`analyse_call`)."""

    signature: inspect.Signature
    params: tuple[Entry, ...]
    ret: Entry | None
    is_method: bool  # the first parameter is `self`
    bind_fields: bool  # bind the dimensions of `self`'s fields first (not in `__init__`)
    # The per-signature check cache (array_checker.call_key): where the checked arguments
    # are (`None`: not cacheable), and the signatures that passed, with the dims they bound.
    plan: tuple[tuple[str, int | None], ...] | None = None
    passed: dict[Any, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)


def make_entry(name: str, annotation: Any, kind: Any = None) -> Entry:
    """A checked field, argument or return value: its annotation, printed form, dimensions."""
    text = format_annotation(annotation)
    return Entry(name, annotation, text, dim_names(annotation), kind, array_checker(annotation))


# ------------------------------------------------------------------------------ analysis


def analyse_call(fn: Callable[..., Any], annotations: dict[str, Any] | None) -> CallSpec | bool:
    """What a call of `fn` checks (`False`: nothing); `annotations` resolved already, or `None`."""
    if annotations is None:
        try:
            annotations = function_annotations(fn)
        except UnresolvedAnnotation as e:
            raise unresolved_error(display_name(fn), fn.__annotations__, e) from None
    signature = inspect.signature(fn)
    params = tuple(
        make_entry(name, annotations[name], p.kind)
        for name, p in signature.parameters.items()
        if contains_jaxtyping(annotations.get(name))
    )
    ret = (
        make_entry("return", annotations["return"])
        if contains_jaxtyping(annotations.get("return"))
        else None
    )
    if not params and ret is None:
        return False
    is_method = next(iter(signature.parameters), None) == "self"
    return CallSpec(
        signature,
        params,
        ret,
        is_method,
        is_method and getattr(fn, "__name__", "") != "__init__",
        call_plan(signature, params, ret),
    )
