"""`Module`: a frozen dataclass that is a JAX pytree, its metaclass `ModuleMeta`; `field`."""

from __future__ import annotations

import abc
import copy
import dataclasses
import importlib
import inspect
import warnings
from collections.abc import Callable
from typing import Any, dataclass_transform

import jax.tree_util as jtu

from treemod._format.pretty import tree_pformat
from treemod._module.abstract import abstract_kind
from treemod._module.construction import (
    SUSPECT_TYPES,
    annotate_converted_arguments,
    check_suspect_value,
    find_unfinished_module,
    inherits_custom_init,
    make_tree_functions,
    provided_by_class,
    warn_field_values,
)
from treemod._shapecheck.checker import check_fields
from treemod._shapecheck.class_hooks import install_class_checks
from treemod._tree.module_info import INFO_ATTRIBUTE, ModuleInfo, module_info
from treemod._tree.tree_equal import tree_equal

__all__ = ["Module", "ModuleMeta", "field", "FrozenModuleError"]

# ids of the modules whose `__init__` is running; only they may set attributes.
_INITIALISING: set[int] = set()
# What `__init__` may set besides fields (as in Equinox): a wrapper's `functools.wraps` names.
_WRAPPER_NAMES = frozenset(("__module__", "__name__", "__qualname__", "__doc__", "__annotations__"))
_setattr = object.__setattr__


class FrozenModuleError(dataclasses.FrozenInstanceError):
    """Raised when code sets or deletes an attribute of a module after its construction.

    A subclass of `dataclasses.FrozenInstanceError` (and so of `AttributeError`), the error
    Equinox raises, so code that catches either keeps working.

    Example:
        >>> import treemod as tm
        >>> class Box(tm.Module):
        ...     value: int
        >>> box = Box(1)
        >>> try:
        ...     box.value = 2
        ... except tm.FrozenModuleError as e:
        ...     print(e)
        Cannot set Box.value: modules are immutable ... `treemod.tree_at(lambda m: m.value, ...)`.
        >>> tm.tree_at(lambda b: b.value, box, 2)
        Box(value=2)
    """


def field(
    *,
    static: bool = False,
    converter: Callable[[Any], Any] | None = None,
    **kwargs: Any,
) -> Any:
    """Declare a module field, like `dataclasses.field`, with two extra options.

    Arguments:
        static: keep the value in the tree structure (the treedef's auxiliary data) instead of
            making it a leaf. Static values are compared by `==`, so two modules with equal static
            values have equal tree structures. Use it for hyperparameters (sizes, flags,
            activation functions), never for arrays.
        converter: a function applied to the field's value after `__init__` has run (with the
            generated `__init__` or a custom one).
        **kwargs: passed on to `dataclasses.field` (`default`, `default_factory`, `init`, ...).

    Returns:
        A `dataclasses.Field` for use as a class-body default.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> class Scale(tm.Module):
        ...     factor: jnp.ndarray = tm.field(converter=jnp.asarray)
        ...     name: str = tm.field(static=True, default="scale")
        >>> Scale(2.0).factor
        Array(2., dtype=float32, weak_type=True)
    """
    metadata = dict(kwargs.pop("metadata", None) or {})
    for option in ("static", "converter"):
        if option in metadata:
            raise ValueError(
                f"field(metadata=...) has the key {option!r}, which `field` sets itself; pass "
                f"`{option}=` as an argument instead."
            )
    if static:
        metadata["static"] = True
    if converter is not None:
        metadata["converter"] = converter
    return dataclasses.field(metadata=metadata, **kwargs)


# The class options a `class` statement may give (`class Stack(Module, check_descendants=False)`)
# besides `shapecheck=`, with the values `Module` has; a subclass that does not give one inherits
# it from the first class in its MRO that did.
_CLASS_OPTIONS: dict[str, bool] = {
    "check_descendants": True,
    "strict_abstract_class_vars": True,
    "holds_state": False,
}


def _inherited_option(cls: type, name: str, default: Any) -> Any:
    """The option from the first class after `cls` in its MRO that gave it (attribute lookup's)."""
    for klass in cls.__mro__[1:]:
        info: ModuleInfo | None = klass.__dict__.get(INFO_ATTRIBUTE)
        if info is not None and name in info.options_given:
            return getattr(info, name)
    return default


@dataclass_transform(field_specifiers=(dataclasses.field, field))
class ModuleMeta(abc.ABCMeta):
    """Turns every subclass into a dataclass and a pytree; runs the construction protocol.

    It records what it derives from each class in a `ModuleInfo` (`treemod/_tree/module_info.py`),
    which every layer reads with `module_info(cls)`.
    """

    def __new__(
        mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any
    ) -> Any:
        options: dict[str, Any] = {}
        for option in _CLASS_OPTIONS:
            if option in kwargs:
                value = kwargs.pop(option)
                if not isinstance(value, bool):
                    raise TypeError(
                        f"class {namespace.get('__qualname__', name)}: the class option "
                        f"`{option}=` takes True or False, not {value!r}."
                    )
                options[option] = value
        shape_options, field_annotations = install_class_checks(namespace, kwargs)
        options.update(shape_options)
        annotations = dict(namespace.get("__annotations__", {}))
        kinds = {k: abstract_kind(v, f"{name}.{k}") for k, v in annotations.items()}
        own_abstract = {k for k, kind in kinds.items() if kind is not None}
        for k in own_abstract:
            if k in namespace:
                raise TypeError(
                    f"{name}.{k} is declared abstract ({annotations[k]}), so it cannot have value "
                    "in this class: provide the value in a concrete subclass, or drop the "
                    "abstract annotation."
                )
        own_class_vars = {k for k, kind in kinds.items() if kind == "classvar"}
        for k in own_abstract:
            del annotations[k]
        namespace["__annotations__"] = annotations
        cls: Any = super().__new__(mcs, name, bases, namespace, **kwargs)
        resolved = {
            option: options[option]
            if option in options
            else _inherited_option(cls, option, default)
            for option, default in {**_CLASS_OPTIONS, "shapecheck": None}.items()
        }

        # A hand-written `__init__` is inherited, also by subclasses that add fields (as in
        # Equinox; their new fields take their defaults).
        custom_init = "__init__" in namespace or inherits_custom_init(cls)
        init_doc = cls.__init__.__doc__  # a generated `__init__` keeps the inherited docstring
        cls = dataclasses.dataclass(eq=False, repr=False, init=not custom_init)(cls)
        if custom_init:
            if hasattr(cls, "__post_init__"):
                warnings.warn(
                    f"{cls.__module__}.{cls.__qualname__} has a custom `__init__` method and a "
                    "`__post_init__` method, so `__post_init__` is never run (only a generated "
                    "`__init__` calls it). Do its work at the end of `__init__`, or put checks "
                    "in `__check_init__`, which always runs.",
                    stacklevel=2,
                )
        else:
            cls.__init__.__doc__ = init_doc
            annotate_converted_arguments(cls)

        # Abstract variables stay abstract until a field, class attribute or property provides
        # them, here or in any base (so diamonds resolve as attribute lookup does).
        base_infos = [b.__dict__[INFO_ATTRIBUTE] for b in bases if INFO_ATTRIBUTE in b.__dict__]
        inherited = set().union(*(i.abstract_vars for i in base_infos))
        class_vars = own_class_vars.union(*(i.abstract_class_vars for i in base_infos))
        field_names = {f.name for f in dataclasses.fields(cls)}  # ClassVars excluded
        provided_by_annotation: set[str] = set()
        if not resolved["strict_abstract_class_vars"]:
            # Equinox's rule (the compat namespace): a field, or an annotation without a value
            # (`x: ClassVar[bool]`), provides a base's AbstractClassVar.
            class_vars -= field_names
            provided_by_annotation = class_vars & annotations.keys()
        for n in class_vars & field_names:
            raise TypeError(
                f"{cls.__qualname__}.{n} is declared as an AbstractClassVar by a base class, "
                f"so provide it as a class variable (`{n}: ClassVar[...] = value`), not a field."
            )
        abstract_vars = frozenset(
            n
            for n in inherited | own_abstract
            if n not in field_names and n not in provided_by_annotation and not hasattr(cls, n)
        )

        # A field that a subclass overrides with a property or a class attribute (or a slot) is
        # provided by the class, unless a generated __init__ stores it: it is not stored on
        # instances and is no part of the tree.
        fields = tuple(
            f
            for f in dataclasses.fields(cls)
            if not ((custom_init or not f.init) and provided_by_class(cls, f))
        )
        info = ModuleInfo(
            fields=fields,
            field_names=frozenset(f.name for f in fields),
            static_fields=tuple(f.name for f in fields if f.metadata.get("static", False)),
            init_false_fields=tuple(f.name for f in fields if not f.init),
            converters=tuple(
                (f.name, f.metadata["converter"]) for f in fields if "converter" in f.metadata
            ),
            class_provided=tuple(f.name for f in dataclasses.fields(cls) if f not in fields),
            check_inits=tuple(
                k.__dict__["__check_init__"] for k in cls.__mro__ if "__check_init__" in k.__dict__
            ),
            custom_init=custom_init,
            abstract_vars=abstract_vars,
            abstract_class_vars=frozenset(class_vars),
            field_annotations=field_annotations,
            options_given=frozenset(options),
            **resolved,
        )
        type.__setattr__(cls, INFO_ATTRIBUTE, info)
        flatten, flatten_with_keys, unflatten = make_tree_functions(cls, fields)
        jtu.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten_func=flatten)
        return cls

    def __call__(cls: Any, *args: Any, **kwargs: Any) -> Any:
        # `module_info(cls)` without the call (measurable here); the accessor everywhere else.
        info: ModuleInfo = cls.__treemod_info__
        if info.abstract_vars or cls.__abstractmethods__:
            _raise_abstract(cls)
        self = cls.__new__(cls)
        key = id(self)
        _INITIALISING.add(key)
        try:
            self.__init__(*args, **kwargs)
            _finish_init(info, cls, self)
        finally:
            _INITIALISING.discard(key)
        for check in info.check_inits:
            check(self)
        check_fields(self, constructing=True)
        return self


class _InitSignature:
    """`cls.__signature__`: the signature of `cls.__init__` without `self`.

    Without it `inspect.signature(SomeModule)` (and so `help`, IDEs and the API docs) would show
    the metaclass's `__call__(*args, **kwargs)`. Instances do not see it, so a callable module
    still reports its `__call__` signature.
    """

    def __get__(self, instance: Any, owner: type) -> inspect.Signature:
        if instance is not None:
            raise AttributeError("__signature__")
        init: Any = owner
        sig = inspect.signature(init.__init__)
        return sig.replace(parameters=list(sig.parameters.values())[1:])


def _raise_abstract(cls: Any) -> None:
    parts = []
    info = module_info(cls)
    missing = info.abstract_vars - info.abstract_class_vars
    missing_class_vars = info.abstract_vars & info.abstract_class_vars
    if missing:
        parts.append(f"abstract attributes (AbstractVar) {', '.join(sorted(missing))}")
    if missing_class_vars:
        names = ", ".join(sorted(missing_class_vars))
        parts.append(f"abstract class attributes (AbstractClassVar) {names}")
    if cls.__abstractmethods__:
        parts.append(f"abstract methods {', '.join(sorted(cls.__abstractmethods__))}")
    raise TypeError(
        f"Can't instantiate abstract module {cls.__qualname__}: it does not provide "
        + " and ".join(parts)
        + ". Define them in a subclass."
    )


def _finish_init(info: ModuleInfo, cls: Any, self: Any) -> None:
    """Fill defaults, check every field is set, run converters, warn on arrays in static fields."""
    d = self.__dict__
    if not d.keys() >= info.field_names:  # some field unset: its default, or an error
        for f in info.fields:
            if f.name in d:
                continue
            if f.default is not dataclasses.MISSING:
                d[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                d[f.name] = f.default_factory()
            else:
                init = getattr(cls.__init__, "__qualname__", "__init__")
                raise TypeError(
                    f"Field '{f.name}' was not initialized: {init} did not set it on "
                    f"{cls.__qualname__}. Set `self.{f.name}` in __init__, or give the field a "
                    "default."
                )
    if not SUSPECT_TYPES.isdisjoint(map(type, d.values())):  # one pass in C
        for name, value in list(d.items()):
            if type(value) in SUSPECT_TYPES:
                check_suspect_value(cls, self, name, value)
    if (where := find_unfinished_module(d, _INITIALISING)) is not None:
        raise ValueError(
            f"{cls.__qualname__}.{where[1:]} holds a module whose __init__ has not finished "
            "(the module being built, or one building it): a module must be a tree, not a "
            "cycle (saving, printing and every transform would recurse forever). Store the "
            "parts it needs instead, or make the reference a property."
        )
    if info.class_provided:
        for name in info.class_provided:
            if name in d:
                raise TypeError(
                    f"{cls.__qualname__}.__init__ set '{name}', a field of a base class that "
                    f"{cls.__qualname__} overrides with a class-level value, so it is no longer "
                    "stored on instances. Remove the override, or do not set it in __init__."
                )
    for name, converter in info.converters:
        d[name] = converter(d[name])
    if info.static_fields or info.init_false_fields:
        warn_field_values(info, cls, d)
    # A fresh (combined) dict: CPython 3.11 reads attributes from the split dict that reading
    # `__dict__` materialised about 2x slower than from a plain dataclass.
    _setattr(self, "__dict__", dict(d))


class Module(metaclass=ModuleMeta):
    """Base class for models: subclasses are frozen dataclasses and JAX pytrees.

    Declare fields with annotations. Array and submodule fields are the tree's leaves and
    subtrees; `field(static=True)` fields live in the tree structure. No decorator or
    registration is needed. After construction a module is immutable: use `tree_at` to get a
    changed copy.

    A subclass may define its own `__init__` (which sets every field with `self.name = value`;
    subclasses that add no fields inherit it); otherwise the dataclass `__init__` is generated.
    After `__init__`: defaults fill unset fields (an unset field without one is an error),
    converters run, then `__check_init__(self)` of every class in the MRO that defines one
    (subclass first). Unflattening (in every transform) never calls `__init__`.

    `==` is `tree_equal`; `hash` works when every leaf is hashable; `pickle`, `copy.copy` and
    `copy.deepcopy` round-trip.

    Class options, keywords of the `class` statement (a subclass that gives none inherits the
    value of the nearest class in its MRO that did): `shapecheck=` (`True` always checks this
    class's jaxtyping annotations, `False` never, `None` follows `treemod.shape_checks`);
    `check_descendants=False` for a module whose arrays carry axes that the annotations of the
    modules below it do not describe (as `nn.Stack`'s leading layer axis): `tree_at` then does
    not shape-check the modules it rebuilds below it. `holds_state=True` marks `State`, and
    `strict_abstract_class_vars=False` gives the compat namespace Equinox's rule for
    `AbstractClassVar`. The metaclass records them, with the fields, in the class's
    `ModuleInfo`.

    Example:
        >>> import jax, jax.numpy as jnp, treemod as tm
        >>> class Affine(tm.Module):
        ...     weight: jax.Array
        ...     bias: jax.Array
        ...     def __call__(self, x):
        ...         return self.weight * x + self.bias
        >>> f = Affine(jnp.array(2.0), jnp.array(1.0))
        >>> f(3.0)
        Array(7., dtype=float32, weak_type=True)
        >>> len(jax.tree_util.tree_leaves(f))
        2
    """

    __signature__ = _InitSignature()

    def __setattr__(self, name: str, value: Any) -> None:
        if id(self) in _INITIALISING:
            if name not in self.__dataclass_fields__ and name not in _WRAPPER_NAMES:
                raise FrozenModuleError(
                    f"{type(self).__qualname__} has no field '{name}'. Declare it in the class "
                    f"body (for example `{name}: jax.Array`) before setting it in __init__."
                )
            _setattr(self, name, value)
            return
        if name == "__orig_class__":  # set by `typing` on `SomeModule[int]()`
            _setattr(self, name, value)
            return
        cls_name = type(self).__qualname__
        if name not in self.__dataclass_fields__:
            raise FrozenModuleError(
                f"Cannot set {cls_name}.{name}: {cls_name} has no field '{name}' and modules are "
                "immutable after construction. Declare the field in the class body and set it "
                "in __init__, or build a changed copy with `treemod.tree_at`."
            )
        raise FrozenModuleError(
            f"Cannot set {cls_name}.{name}: modules are immutable after construction. Make a "
            f"changed copy with `treemod.tree_at(lambda m: m.{name}, module, new_value)`."
        )

    def __delattr__(self, name: str) -> None:
        raise FrozenModuleError(
            f"Cannot delete {type(self).__qualname__}.{name}: modules are immutable. "
            "Use `treemod.tree_at` to make a changed copy."
        )

    def __eq__(self, other: object) -> Any:
        return tree_equal(self, other)

    def __hash__(self) -> int:
        leaves_with_paths, treedef = jtu.tree_flatten_with_path(self)
        for path, leaf in leaves_with_paths:
            try:
                hash(leaf)
            except TypeError:
                raise TypeError(
                    f"{type(self).__qualname__} is not hashable: the leaf at "
                    f"{type(self).__qualname__}{jtu.keystr(path)} is an unhashable "
                    f"{type(leaf).__module__}.{type(leaf).__qualname__}. Only modules whose "
                    "leaves are all hashable can be dictionary keys or set members; to key by "
                    "identity use `id(module)`."
                ) from None
        return hash((treedef, tuple(leaf for _, leaf in leaves_with_paths)))

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        # Static values are configuration shared by copies; only the leaves are copied.
        return jtu.tree_map(lambda leaf: copy.deepcopy(leaf, memo), self)

    def __copy__(self) -> Any:
        return _rebuild(type(self), self.__dict__)

    def __reduce__(self) -> tuple[Any, ...]:
        # Field values that JAX wraps (`jax.nn.relu`, `jnp.tanh`) do not pickle by themselves;
        # they are pickled by name instead, also inside a field's tuples, lists and dicts
        # (`Sequential([..., jax.nn.relu])`). Unpickling never calls `__init__`.
        return _rebuild, (type(self), {k: _by_name_within(v) for k, v in self.__dict__.items()})

    def __repr__(self) -> str:
        return tree_pformat(self)


def _rebuild(cls: type, fields: dict[str, Any]) -> Any:
    """Make an instance of `cls` with these field values, without calling `__init__`."""
    module: Any = object.__new__(cls)
    _setattr(module, "__dict__", dict(fields))
    return module


class _ByName:
    """Pickles as a reference to the module-level object `module.qualname`."""

    __slots__ = ("module", "qualname")

    def __init__(self, module: str, qualname: str) -> None:
        self.module, self.qualname = module, qualname

    def __reduce__(self) -> tuple[Any, ...]:
        return _load_by_name, (self.module, self.qualname)


def _load_by_name(module: str, qualname: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _by_name_within(value: Any) -> Any:
    """`_by_name` of `value` and of the items of the plain tuples, lists and dicts in it."""
    kind = type(value)
    if kind is tuple or kind is list:
        return kind(map(_by_name_within, value))
    if kind is dict:
        return {k: _by_name_within(v) for k, v in value.items()}
    return _by_name(value)


def _by_name(value: Any) -> Any:
    """`value`, or a `_ByName` for it when it is a callable found at its module and qualname."""
    if isinstance(value, type | Module) or not callable(value):
        return value
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        return value
    try:
        found = _load_by_name(module, qualname)
    except Exception:
        return value
    return _ByName(module, qualname) if found is value else value
