"""`Enumeration`: named messages that pass through `jit` as integer arrays (Equinox's).

An item is a module holding one `int32` index (a leaf, so it can be traced, batched and chosen
with `where`) and its enumeration class (static). Comparisons give JAX booleans, so a solver
can return `RESULTS.failed` from compiled code and the caller can test it or raise its message
with `item.error_if(token, pred)`.
"""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from treemod._module.module import Module, field
from treemod._transforms.error_if import branched_error_if

__all__ = ["Enumeration", "EnumerationItem"]

_RESERVED = ("promote", "where")


def _is_magic(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


class EnumerationItem(Module):
    """One value of an `Enumeration`: an integer index (a leaf) and its class (static)."""

    _value: Any
    _enumeration: Any = field(static=True)

    def _check_same(self, other: Any) -> None:
        if not (isinstance(other, EnumerationItem) and other._enumeration is self._enumeration):
            raise ValueError(
                f"{self._enumeration.__qualname__} items can only be compared with items of the "
                f"same enumeration; got {type(other).__name__} "
                f"{getattr(getattr(other, '_enumeration', None), '__qualname__', '')}. Use "
                "`Sub.promote(item)` to compare with an item of a parent enumeration."
            )

    def __eq__(self, other: object) -> Any:
        self._check_same(other)
        with jax.ensure_compile_time_eval():
            return jnp.asarray(self._value == other._value)  # type: ignore[attr-defined]

    def __ne__(self, other: object) -> Any:
        self._check_same(other)
        with jax.ensure_compile_time_eval():
            return jnp.asarray(self._value != other._value)  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        cls = self._enumeration
        return f"{cls.__module__}.{cls.__qualname__}<{cls[self]}>"

    def __pdoc__(self, **kwargs: Any) -> Any:
        import wadler_lindig as wl  # not at import treemod: only printing needs it

        return wl.TextDoc(repr(self))

    def is_traced(self) -> bool:
        """Whether the index is a tracer (the item was chosen inside a transform)."""
        return isinstance(self._value, jax.core.Tracer)

    def error_if(self, token: Any, pred: Any) -> Any:
        """`branched_error_if(token, pred, ...)` raising this item's message.

        Arguments:
            token: a pytree holding at least one array, returned unchanged.
            pred: raise when true.

        Returns:
            `token`.
        """
        return branched_error_if(token, pred, self._value, self._enumeration._messages)


class _EnumerationMeta(type):
    def __new__(mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any]) -> Any:
        root = not any(isinstance(b, _EnumerationMeta) for b in bases)
        entries = {k: v for k, v in namespace.items() if not _is_magic(k)}
        if not root:
            for reserved in _RESERVED:
                if reserved in entries:
                    raise ValueError(
                        f"Enumeration {name} cannot have an item named {reserved!r}: it is the "
                        "name of a class method. Choose another name."
                    )
            namespace = {k: v for k, v in namespace.items() if _is_magic(k)}
        cls: Any = super().__new__(mcs, name, bases, namespace)
        if root:
            return cls
        cls._items = {}
        cls._messages = []
        cls._offsets = {}
        for base in reversed(cls.__mro__[1:]):
            if base is object or base is Enumeration:
                continue
            if not isinstance(base, _EnumerationMeta):
                raise TypeError(
                    f"Enumeration {name} cannot inherit from {base.__qualname__}, which is "
                    "not an Enumeration."
                )
            offsets = np.zeros(len(base._messages), np.int32)
            for item_name, item in base._items.items():
                index = int(item._value)
                offsets[index] = cls._add(item_name, base._messages[index])
            cls._offsets[base] = offsets
        for item_name, message in entries.items():
            if not isinstance(message, str):
                raise TypeError(
                    f"Enumeration {name}.{item_name} must be a message string; got "
                    f"{type(message).__name__}."
                )
            cls._add(item_name, message)
        if cls.__doc__ is None:
            lines = [f"- `{k}`: {cls._messages[int(v._value)]}" for k, v in cls._items.items()]
            cls.__doc__ = "An enumeration with the items:\n\n" + "\n".join(lines)
        return cls

    def _add(cls, item_name: str, message: str) -> int:
        old = cls._items.get(item_name)
        if old is not None:
            index = int(old._value)
            if cls._messages[index] != message:
                warnings.warn(
                    f"Enumeration {cls.__qualname__}.{item_name}: the message "
                    f"{cls._messages[index]!r} is replaced by {message!r}.",
                    stacklevel=4,
                )
                cls._messages[index] = message
            return index
        index = len(cls._messages)
        cls._messages.append(message)
        cls._items[item_name] = EnumerationItem(np.array(index, np.int32), cls)
        return index

    def __getattr__(cls, item_name: str) -> Any:
        items = cls.__dict__.get("_items")
        if items is not None and item_name in items:
            return items[item_name]
        raise AttributeError(f"Enumeration {cls.__qualname__} has no item {item_name!r}.")

    def __getitem__(cls, item: Any) -> str:
        if not isinstance(item, EnumerationItem) or item._enumeration is not cls:
            raise ValueError(
                f"{cls.__qualname__}[...] takes an item of {cls.__qualname__}; got {item!r}."
            )
        value = item._value
        if isinstance(value, jax.core.Tracer):
            return "traced"
        value = np.asarray(value)
        if value.ndim == 0:
            return str(cls._messages[int(value)])
        return str(np.vectorize(cls._messages.__getitem__)(value))

    def __len__(cls) -> int:
        return len(cls.__dict__.get("_items", {}))

    def __instancecheck__(cls, value: Any) -> bool:
        return isinstance(value, EnumerationItem) and value._enumeration is cls


class Enumeration(metaclass=_EnumerationMeta):
    """A set of named messages whose items pass through `jit`, `vmap` and `where`.

    Subclass it with one string per item; look items up on the class. Items compare (only
    with items of the same enumeration) to JAX booleans, `Cls[item]` gives the message, and a
    subclass inherits its parents' items (`Sub.promote(parent_item)` converts).

    Example:
        >>> import jax, jax.numpy as jnp, treemod as tm
        >>> class Result(tm.Enumeration):
        ...     ok = "success"
        ...     diverged = "the solver diverged"
        >>> @jax.jit
        ... def solve(x):
        ...     return Result.where(jnp.isfinite(x), Result.ok, Result.diverged)
        >>> out = solve(jnp.inf)
        >>> bool(out == Result.diverged), Result[out]
        (True, 'the solver diverged')
    """

    @classmethod
    def promote(cls, item: Any) -> Any:
        """`item`, an item of a parent enumeration, as the same-named item of this one."""
        parent = getattr(item, "_enumeration", None)
        if not isinstance(item, EnumerationItem) or parent is cls or parent not in cls._offsets:
            raise ValueError(
                f"{cls.__qualname__}.promote takes an item of an enumeration that "
                f"{cls.__qualname__} inherits from; got {item!r}."
            )
        with jax.ensure_compile_time_eval():
            value = jnp.asarray(cls._offsets[parent])[item._value]
        return EnumerationItem(value, cls)

    @classmethod
    def where(cls, pred: Any, a: Any, b: Any) -> Any:
        """`a` where `pred` holds, else `b`: `jnp.where` for items of this enumeration."""
        for item in (a, b):
            if not isinstance(item, cls):
                raise ValueError(f"{cls.__qualname__}.where takes items of it; got {item!r}.")
        if a is b or a._value is b._value:
            return a
        if not isinstance(pred, jax.core.Tracer):
            with jax.ensure_compile_time_eval():
                if np.ndim(pred) == 0:
                    return a if bool(pred) else b
        return EnumerationItem(jnp.where(pred, a._value, b._value), cls)
