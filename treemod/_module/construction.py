"""What `Module`'s metaclass uses to set up a class and to check a module after `__init__`.

At class creation: the generated tree functions, whether `__init__` is hand-written (inherited
from the nearest base that defines one), the annotations of converted arguments, and the fields
a subclass provides at class level. After `__init__`: the checks of values stored in fields.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.tree_util as jtu

from treemod._tree.filters import is_inexact_traceable_array_like, is_traceable_array
from treemod._tree.module_info import INFO_ATTRIBUTE, ModuleInfo

__all__ = [
    "CONTAINERS",
    "SUSPECT_TYPES",
    "annotate_converted_arguments",
    "check_suspect_value",
    "find_unfinished_module",
    "inherits_custom_init",
    "make_tree_functions",
    "provided_by_class",
    "warn_field_values",
]


def make_tree_functions(
    cls: type, fields: tuple[dataclasses.Field[Any], ...]
) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """Generate flatten, flatten-with-keys and unflatten functions specialised to `cls`'s fields.

    The generated code has no loops and no introspection. Unflattening fills the new object's
    `__dict__` with one `update` call, in field order: this skips `__init__` and keeps attribute
    reads as fast as on a plain dataclass (item-by-item `__dict__` assignment slows them ~2x).
    """
    dynamic = [f.name for f in fields if not f.metadata.get("static", False)]
    static = [f.name for f in fields if f.metadata.get("static", False)]
    local = {n: f"_c{i}" for i, n in enumerate(dynamic)}
    local.update({n: f"_s{i}" for i, n in enumerate(static)})
    dyn_tuple = "".join(f"o.{n}, " for n in dynamic)
    aux = "(" + "".join(f"o.{n}, " for n in static) + ")" if static else "None"
    keyed = "".join(f"(_k{i}, o.{n}), " for i, n in enumerate(dynamic))
    lines = [
        "def flatten(o):",
        f"    return ({dyn_tuple}), {aux}",
        "def flatten_with_keys(o):",
        f"    return ({keyed}), {aux}",
        "def unflatten(aux, children):",
        "    o = _new(_cls)",
    ]
    if dynamic:
        lines.append(f"    {''.join(local[n] + ', ' for n in dynamic)}= children")
    if static:
        lines.append(f"    {''.join(local[n] + ', ' for n in static)}= aux")
    if fields:
        lines.append(
            f"    o.__dict__.update({', '.join(f'{f.name}={local[f.name]}' for f in fields)})"
        )
    lines.append("    return o")
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    namespace.update({f"_k{i}": jtu.GetAttrKey(n) for i, n in enumerate(dynamic)})
    exec("\n".join(lines), namespace)
    return namespace["flatten"], namespace["flatten_with_keys"], namespace["unflatten"]


def inherits_custom_init(cls: type) -> bool:
    """Whether the nearest base defining `__init__` (a module's own or generated one, or any
    other class's) has a hand-written one."""
    for base in cls.__mro__[1:-1]:
        info: ModuleInfo | None = base.__dict__.get(INFO_ATTRIBUTE)
        if info is not None:
            return info.custom_init
        if "__init__" in base.__dict__:  # a non-module base (mixin) with its own `__init__`
            return True
    return False


def annotate_converted_arguments(cls: Any) -> None:
    """In a generated `__init__`, annotate a converted field's argument with what the converter
    accepts (its first parameter's annotation, `Any` when it has none)."""
    init_annotations = cls.__init__.__annotations__
    for f in dataclasses.fields(cls):
        if "converter" not in f.metadata or f.name not in init_annotations:
            continue
        try:
            parameters = list(inspect.signature(f.metadata["converter"]).parameters.values())
        except (TypeError, ValueError):  # builtins without a signature
            parameters = []
        accepted = parameters[0].annotation if parameters else Any
        init_annotations[f.name] = Any if accepted is inspect.Parameter.empty else accepted


def provided_by_class(cls: type, f: dataclasses.Field[Any]) -> bool:
    """Whether a subclass overrides field `f` with a class-level value other than its default
    (a property, a plain class attribute, a slot)."""
    value = inspect.getattr_static(cls, f.name, dataclasses.MISSING)
    return value is not dataclasses.MISSING and value is not f.default


# Values that need a closer look when they are stored in a field (one set lookup per field).
TRANSFORM_TYPES = frozenset(
    type(transform(lambda x: x))
    for transform in (
        jax.jit,
        jax.grad,
        jax.vmap,
        jax.value_and_grad,
        jax.jacfwd,
        jax.jacrev,
        jax.hessian,
        jax.custom_jvp,
        jax.custom_vjp,
        jax.checkpoint,
    )
)
SUSPECT_TYPES = TRANSFORM_TYPES | {types.MethodType}
CONTAINERS = (tuple, list, dict)
_CONTAINER_TYPES = frozenset(CONTAINERS)


def check_suspect_value(cls: Any, self: Any, name: str, value: Any) -> None:
    """Refuse a method of the module being built; warn on a JAX transform of a pytree."""
    if type(value) in TRANSFORM_TYPES:
        wrapped = value
        while (wrapped := getattr(wrapped, "__wrapped__", None)) is not None:
            if any(is_traceable_array(leaf) for leaf in jtu.tree_leaves(wrapped)):
                warnings.warn(
                    f"Possibly assigning a JAX-transformed callable as an attribute: "
                    f"{cls.__qualname__}.{name} holds a {type(value).__name__} of a pytree with "
                    "arrays, which JAX sees as one opaque leaf, so those arrays get no gradients "
                    "or updates. Store the module itself and apply the transform in `__call__`, "
                    "or use treemod's filtered transform (`filter_jit`, `filter_vmap`, ...), "
                    "which is a pytree.",
                    stacklevel=4,
                )
                return
    elif value.__self__ is self:
        raise ValueError(
            f"Cannot assign methods in __init__: {cls.__qualname__}.{name} is set to the bound "
            f"method {getattr(value, '__name__', '?')} of the module being built, which would "
            "make the module contain itself (a cycle, not a tree). Make it a property instead "
            f"(`@property def {name}(self): return self.{getattr(value, '__name__', 'method')}`)."
        )


def find_unfinished_module(d: dict[str, Any], building: set[int]) -> str | None:
    """The path, among the fields `d` of a module being built, of a module whose `__init__`
    has not finished (ids in `building`: the module itself, or one that is building it), or
    `None`.

    Storing such a module makes a cycle (`self.child = self`, `Child(parent=self)`). Containers
    (`tuple`, `list`, `dict`) are looked into; modules are not, as each checked its own fields
    when it was built, so for a layer of arrays the check is two passes in C."""
    values = d.values()
    if building.isdisjoint(map(id, values)) and _CONTAINER_TYPES.isdisjoint(map(type, values)):
        return None
    for name, value in d.items():
        if id(value) in building:
            return f".{name}"
        if type(value) in CONTAINERS and (inner := _find_in(value, building)) is not None:
            return f".{name}{inner}"
    return None


def _find_in(container: Any, building: set[int]) -> str | None:
    items = container.items() if type(container) is dict else enumerate(container)
    for key, value in items:
        if id(value) in building:
            return f"[{key!r}]"
        if type(value) in CONTAINERS and (inner := _find_in(value, building)) is not None:
            return f"[{key!r}]{inner}"
    return None


def warn_field_values(info: ModuleInfo, cls: Any, d: dict[str, Any]) -> None:
    """Equinox's construction warnings: an array in a static field, and floating-point values
    in a `field(init=False)` (which JAX transforms treat as a leaf of its own)."""
    for name in info.static_fields:
        value = d[name]
        if is_traceable_array(value) or (
            isinstance(value, CONTAINERS) and any(map(is_traceable_array, jtu.tree_leaves(value)))
        ):
            warnings.warn(
                f"{cls.__qualname__}.{name} is a static field holding an array (Equinox's "
                "warning: A JAX array is being set as static!). Static fields are compared by "
                "value when JAX checks tree structures, which is slow and fragile for arrays; "
                "make it a normal field.",
                stacklevel=4,
            )
    for name in info.init_false_fields:
        if any(map(is_inexact_traceable_array_like, jtu.tree_leaves(d[name]))):
            warnings.warn(
                f"{cls.__qualname__}.{name} is a `field(init=False)` holding floating-point "
                "values (Equinox's warning: Using `field(init=False)` on `equinox.Module` can "
                "lead to surprising behaviour). It is a leaf of its own, so `grad` "
                "differentiates with respect to it and not the fields it was computed from. "
                "Compute it where it is used (a method or property) instead.",
                stacklevel=4,
            )
