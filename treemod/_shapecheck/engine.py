"""The shape checks themselves: `ShapeCheckError`, the analysis of annotated fields and calls,
and the checks, on jaxtyping's machinery.

This is the only file here that imports jaxtyping at module level, and nothing imports it at
`import treemod`: `checker.py` loads it at the first class or call that has a jaxtyping
annotation (jaxtyping is then already imported, by whoever wrote the annotation), at the first
`shapecheck`-decorated call, or at the first `ShapeCheckError` looked up. See README.md.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

import jax
import jaxtyping

from treemod._format.describe import describe_value
from treemod._private_apis import get_shape_memo, pop_shape_memo, push_shape_memo
from treemod._shapecheck.annotations import display_name, is_array_annotation
from treemod._shapecheck.array_checker import cacheable_fields, call_key, remember, return_key
from treemod._shapecheck.backends import BACKENDS, INSTALL, ensure_checker
from treemod._shapecheck.config import OVERRIDE, current, enabled_for
from treemod._shapecheck.fields import field_spec
from treemod._shapecheck.spec import CallSpec, Entry, analyse_call
from treemod._tree.module_info import is_module_class

__all__ = ["ShapeCheckError"]

_UNION_TYPES = (typing.Union, type(int | None))


class ShapeCheckError(jaxtyping.TypeCheckError):
    """A value does not match its jaxtyping annotation (dtype, rank or dimension sizes).

    The message names the module class and field (or the function and argument), the expected
    annotation with the dimension sizes bound so far and what bound them, and the value found.
    It subclasses `jaxtyping.TypeCheckError` (a `TypeError`). A note (shown in tracebacks, not
    part of `str(error)`) says how to switch the checks off.

    Example:
        >>> import jax.numpy as jnp, treemod as tm
        >>> from jaxtyping import Array, Float
        >>> class Affine(tm.Module):
        ...     weight: Float[Array, "out in"]
        ...     bias: Float[Array, " out"]
        >>> try:
        ...     Affine(jnp.zeros((64, 32)), jnp.zeros(32))
        ... except tm.ShapeCheckError as e:
        ...     print(e)
        Affine.bias: expected Float[Array, 'out'] with out=64 (bound by Affine.weight), got f32[32]
          reason: the size of dimension out is 32 which does not equal the existing value of 64
          other dimensions bound so far: in=32 (bound by Affine.weight)
        >>> try:
        ...     Affine(jnp.zeros((64, 32)), jnp.zeros(32))
        ... except tm.ShapeCheckError as e:
        ...     print(e.__notes__[0])
        Shape checks can be switched off: treemod.shape_checks(False) ...
    """

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.add_note(
            "Shape checks can be switched off: treemod.shape_checks(False) (or "
            "TREEMOD_SHAPE_CHECKS=0), `with treemod.shape_checks(False):` around a block, or "
            "per class with `class Model(treemod.Module, shapecheck=False)`. Classes defined "
            "against treemod.compat.equinox.Module (Equinox code) have them off unless they "
            "pass shapecheck=True."
        )


# ------------------------------------------------------------------------------ checking


class _NoChecker(Exception):
    """An annotation needs a runtime type checker and none is installed (see `_check`)."""


def _check_value(annotation: Any, value: Any, name: str, checker: str | None) -> str:
    """`""` if `value` matches (binding dimensions in the current memo), else a reason.

    `checker`: the backend for annotations that are not plain jaxtyping arrays (`None`: none
    is installed, and `_NoChecker` is raised if one is needed)."""
    if is_array_annotation(annotation):
        reason: str = type(annotation).__instancecheck_str__(annotation, value)
        return reason
    if typing.get_origin(annotation) in _UNION_TYPES:
        reasons = []
        for member in typing.get_args(annotation):
            reason = _check_value(member, value, name, checker)
            if not reason:
                return ""
            if reason not in reasons:
                reasons.append(reason)
        return "; ".join(reasons)
    if annotation is None or annotation is type(None):
        return "" if value is None else "the value is not None"
    if checker is None:
        raise _NoChecker
    return BACKENDS[checker](name, value, annotation)


def _bound_dims() -> dict[str, str]:
    single, variadic, _, _ = get_shape_memo()
    out = {k: str(v) for k, v in single.items() if not k.startswith("~~")}
    out.update({"*" + k: str(v[1]) for k, v in variadic.items() if not k.startswith("~~")})
    return out


def _format_dims(names: list[str], bound: dict[str, str], binders: dict[str, str]) -> str:
    groups: list[tuple[str, list[str]]] = []
    for name in names:
        who = binders.get(name, "?")
        if groups and groups[-1][0] == who:
            groups[-1][1].append(f"{name}={bound[name]}")
        else:
            groups.append((who, [f"{name}={bound[name]}"]))
    return ", ".join(f"{', '.join(items)} (bound by {who})" for who, items in groups)


def _check(
    entry: Entry, value: Any, where: str, who: str, binders: dict[Any, Any], checker: str | None
) -> None:
    if entry.fast is not None and entry.fast(value):
        reason = ""
    else:
        try:
            reason = _check_value(entry.annotation, value, entry.name, checker)
        except _NoChecker:
            raise ImportError(
                f"{where}: checking {entry.text} needs a runtime type checker (it is not a plain "
                f"jaxtyping array annotation), and none is installed: {INSTALL}. Or turn shape "
                "checks off for it: treemod.shape_checks(False), or the class option "
                "shapecheck=False."
            ) from None
    if not reason:
        # Dimensions bound for the first time were bound by this value.
        single, variadic, _, _ = get_shape_memo()
        for name in single:
            if name not in binders:
                binders[name] = who
        for name in variadic:
            if "*" + name not in binders:
                binders["*" + name] = who
        return
    after = _bound_dims()
    relevant = [n for n in entry.dims if n in after]
    others = [n for n in after if n not in relevant]
    message = f"{where}: expected {entry.text}"
    if relevant:
        message += f" with {_format_dims(relevant, after, binders)}"
    message += f", got {describe_value(value)}"
    message += f"\n  reason: {reason}"
    if others:
        message += f"\n  other dimensions bound so far: {_format_dims(others, after, binders)}"
    raise ShapeCheckError(message)


def _is_placeholder(value: Any) -> bool:
    """A non-array stand-in (None, a bool of a filter spec, a ShapeDtypeStruct, a sentinel)."""
    leaves = jax.tree_util.tree_leaves(value)
    return not leaves or not all(isinstance(leaf, jax.Array) for leaf in leaves)


def _check_fields_into(
    module: Any,
    spec: tuple[Entry, ...],
    binders: dict[Any, Any],
    checker: str | None,
    strict: bool,
    suffix: str,
) -> None:
    owner = display_name(type(module))
    values = module.__dict__
    for entry in spec:
        value = values.get(entry.name)
        if not strict and _is_placeholder(value):
            continue
        label = f"{owner}.{entry.name}"
        _check(entry, value, label + suffix, label, binders, checker)


def check_spec(module: Any, spec: tuple[Entry, ...], constructing: bool) -> None:
    """Check `module`'s annotated fields `spec` against each other (`checker.check_fields`)."""
    checker = ensure_checker(current()[1])
    push_shape_memo(dict(module.__dict__))
    try:
        _check_fields_into(module, spec, {}, checker, constructing, "")
    finally:
        pop_shape_memo()


def _items(entry: Entry, value: Any) -> list[tuple[str, Any]]:
    if entry.kind is inspect.Parameter.VAR_POSITIONAL:
        return [(f"{entry.name}[{i}]", v) for i, v in enumerate(value)]
    if entry.kind is inspect.Parameter.VAR_KEYWORD:
        return [(f"{entry.name}[{k!r}]", v) for k, v in value.items()]
    return [(entry.name, value)]


def run_checked_call(
    fn: Callable[..., Any], state: list[Any], args: tuple[Any, ...], kwargs: dict[Any, Any]
) -> Any:
    """Call `fn`, checking its annotated arguments and return value (`wrap_checked`'s calls)."""
    spec = state[0]
    force = state[1]
    if spec is None:
        spec = state[0] = analyse_call(fn, state[2])
    owner = type(args[0]) if args else None
    if not is_module_class(owner) or spec is False or not spec.is_method:
        owner = None
    if not (force or enabled_for(owner)):
        return fn(*args, **kwargs)
    setting = current()[1]
    checker = ensure_checker(setting)
    token = OVERRIDE.set((True, setting)) if force else None
    try:
        if spec is False:
            return fn(*args, **kwargs)
        key = _signature_of(spec, owner, args, kwargs)
        if key is not None and key in spec.passed:
            return _call_seen(fn, spec, owner, key, args, kwargs, checker)
        try:
            bound = spec.signature.bind(*args, **kwargs)
        except TypeError:
            return fn(*args, **kwargs)  # let Python report the bad call
        where = f"{display_name(owner)}.{fn.__name__}" if owner is not None else display_name(fn)
        binders: dict[str, str] = {}
        push_shape_memo(bound.arguments)
        try:
            if owner is not None and spec.bind_fields:
                fields = field_spec(owner)
                if fields:
                    suffix = f" (checked when calling {where})"
                    _check_fields_into(args[0], fields, binders, checker, True, suffix)
            for entry in spec.params:
                if entry.name in bound.arguments:
                    for label, value in _items(entry, bound.arguments[entry.name]):
                        who = f"argument {label}"
                        _check(entry, value, f"{where} {who}", who, binders, checker)
            if key is not None:
                single, variadic, _, _ = get_shape_memo()
                remember(spec.passed, key, (dict(single), dict(variadic), dict(binders)))
            out = fn(*args, **kwargs)
            if spec.ret is not None:
                _check(spec.ret, out, f"{where} return value", "return value", binders, checker)
                out_key = None if key is None else return_key(key, out)
                if out_key is not None:
                    remember(spec.passed, out_key, None)
            return out
        finally:
            pop_shape_memo()
    finally:
        if token is not None:
            OVERRIDE.reset(token)


def _signature_of(
    spec: CallSpec, owner: type | None, args: tuple[Any, ...], kwargs: dict[Any, Any]
) -> Any:
    """The call's key in the per-signature check cache, or `None` (see `array_checker`)."""
    if spec.plan is None:
        return None
    fields: tuple[str, ...] = ()
    if owner is not None and spec.bind_fields:
        names = cacheable_fields(owner, field_spec(owner))
        if names is None:
            return None
        fields = names
    return call_key(spec.plan, owner, fields, args, kwargs)


def _call_seen(
    fn: Callable[..., Any],
    spec: CallSpec,
    owner: type | None,
    key: Any,
    args: tuple[Any, ...],
    kwargs: dict[Any, Any],
    checker: str | None,
) -> Any:
    """Call `fn` whose arguments have this signature and passed their checks before; check
    the return value only if its own signature has not passed with them."""
    out = fn(*args, **kwargs)
    if spec.ret is None:
        return out
    out_key = return_key(key, out)
    if out_key is not None and out_key in spec.passed:
        return out
    single, variadic, binders = spec.passed[key]
    where = f"{display_name(owner)}.{fn.__name__}" if owner is not None else display_name(fn)
    push_shape_memo(spec.signature.bind(*args, **kwargs).arguments)
    try:
        memo = get_shape_memo()
        memo[0].update(single)
        memo[1].update(variadic)
        _check(spec.ret, out, f"{where} return value", "return value", dict(binders), checker)
    finally:
        pop_shape_memo()
    if out_key is not None:
        remember(spec.passed, out_key, None)
    return out
