"""Comparing a checkpoint with `like`: which leaves are data, and every mismatch, by key path.

PRNG key arrays (`jax.random.key`) are stored as their raw key data (`jax.random.key_data`,
uint32 with a trailing axis), with their dtype and implementation recorded in the metadata
entry `treemod.keys`, and compared with `like` by their key dtype (`key<fry>`) and shape.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import numpy as np

from treemod._format.describe import describe_array
from treemod._saving.errors import CheckpointError
from treemod._saving.safetensors_write import TensorInfo
from treemod._tree.filters import is_array

__all__ = ["SIMPLE", "as_like", "check", "kind", "is_key", "key_record", "simple_kind", "wrap_key"]

SIMPLE = {bool: "bool", int: "int", float: "float", complex: "complex", str: "str"}
_PLAIN = {name: t for t, name in SIMPLE.items()}


def simple_kind(leaf: Any) -> str | None:
    """The kind of a simple value ("int", "str", ...), subclasses (IntEnum, StrEnum) included."""
    found = SIMPLE.get(type(leaf))
    if found is None and isinstance(leaf, (int, float, complex, str)):
        found = next(SIMPLE[t] for t in type(leaf).__mro__ if t in SIMPLE)
    return found


def kind(leaf: Any) -> str:
    """ "array", "value" (a simple Python value) or "other" (not stored; taken from `like`)."""
    if isinstance(leaf, jax.ShapeDtypeStruct) or is_array(leaf):
        return "array"
    return "other" if simple_kind(leaf) is None else "value"


def as_like(label: str, name: str, value: Any, leaf: Any) -> Any:
    """The file's simple value as `like`'s leaf's type (an IntEnum member, say)."""
    if type(leaf) is type(value):
        return value
    try:
        return type(leaf)(value)
    except Exception as e:
        raise CheckpointError(
            f"{label}: the value {value!r} at {name} cannot be made a {type(leaf).__name__} "
            f"(the type of like's leaf): {type(e).__name__}: {e}"
        ) from None


def is_key(leaf: Any) -> bool:
    """Whether an array or ShapeDtypeStruct holds typed PRNG keys."""
    return jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def key_record(key: jax.Array) -> dict[str, str]:
    """What `treemod.keys` records of a key array."""
    return {"dtype": str(key.dtype), "impl": str(jax.random.key_impl(key))}


def wrap_key(label: str, name: str, data: Any, record: dict[str, str]) -> jax.Array:
    """Rebuild a key array from its stored data."""
    try:
        key: jax.Array = jax.random.wrap_key_data(data, impl=record["impl"])
    except (ValueError, TypeError, KeyError) as e:
        raise CheckpointError(
            f"{label}: the PRNG keys at {name} (implementation {record.get('impl')!r}) cannot "
            f"be rebuilt: {e}"
        ) from None
    # The record's dtype is what was checked against `like`; the keys rebuilt from the data and
    # the recorded implementation must be that dtype, or the file was edited inconsistently
    # (its header checksum proves nothing: anyone can recompute it).
    if str(key.dtype) != record.get("dtype"):
        raise CheckpointError(
            f"{label}: the PRNG keys at {name} are recorded as {record.get('dtype')} but their "
            f"data and implementation ({record.get('impl')!r}) make {key.dtype} keys; the file "
            "is inconsistent (edited?). Nothing was loaded."
        )
    return key


def _spec(x: Any) -> tuple[str, tuple[int, ...]]:
    """A `like` array leaf's dtype label and shape."""
    label = str(x.dtype) if is_key(x) else np.dtype(x.dtype).name  # byte order aside
    return label, tuple(x.shape)


def _file_spec(info: TensorInfo, keys: dict[str, Any]) -> tuple[str, tuple[int, ...]]:
    record = keys.get(info.name)
    if isinstance(record, dict) and isinstance(record.get("dtype"), str):
        return record["dtype"], tuple(info.shape[:-1])
    return info.dtype.name, tuple(info.shape)


def _show(spec: tuple[str, tuple[int, ...]]) -> str:
    return describe_array(spec[1], spec[0])


def _a(x: Any) -> str:
    name = type(x).__name__
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


def _under(name: str, prefix: str) -> bool:
    return not prefix or name == prefix or (name.startswith(prefix) and name[len(prefix)] in ".[")


_TOP = re.compile(r"^(\.[^.\[]+|\[[^\]]*\])")


def weak_scalar_accepts(leaf: Any, value: Any) -> bool:
    """Whether `like`'s leaf is a placeholder `jax.eval_shape` made of a Python number `value`."""
    if not (isinstance(leaf, jax.ShapeDtypeStruct) and leaf.weak_type and leaf.shape == ()):
        return False
    kinds = {bool: np.bool_, int: np.integer, float: np.floating, complex: np.complexfloating}
    return type(value) in kinds and np.issubdtype(leaf.dtype, kinds[type(value)])


def check(
    tensors: dict[str, TensorInfo],
    values: dict[str, Any],
    keys: dict[str, Any],
    targets: list[tuple[str, Any]],
    prefix: str,
) -> list[str]:
    """Every mismatch between the file's entries (under `prefix`) and the `like` leaves."""
    problems = []
    wanted = set()
    for name, leaf in targets:
        wanted.add(name)
        leaf_kind = kind(leaf)
        info = tensors.get(name)
        if leaf_kind == "array":
            if info is not None:
                ours, theirs = _file_spec(info, keys), _spec(leaf)
                bad = [w for w, i in (("shape", 1), ("dtype", 0)) if ours[i] != theirs[i]]
                if bad:
                    problems.append(
                        f"wrong {' and '.join(bad)}: {name} is {_show(ours)} in the file but "
                        f"{_show(theirs)} in like"
                    )
            elif name in values:
                if not weak_scalar_accepts(leaf, values[name]):
                    problems.append(
                        f"wrong type: {name} is {_a(values[name])} value in the file but an "
                        f"array {_show(_spec(leaf))} in like"
                    )
            else:
                problems.append(f"missing: {name} ({_show(_spec(leaf))} in like)")
        elif leaf_kind == "value":
            if info is not None:
                problems.append(
                    f"wrong type: {name} is an array {_show(_file_spec(info, keys))} in the file "
                    f"but {_a(leaf)} value in like"
                )
            elif name not in values:
                problems.append(f"missing: {name} ({_a(leaf)} value in like)")
            # A "value" leaf has a simple kind (`simple_kind` is not None).
            elif type(values[name]) is not _PLAIN[simple_kind(leaf)]:  # type: ignore[index]
                problems.append(
                    f"wrong type: {name} is {_a(values[name])} value in the file but "
                    f"{_a(leaf)} value in like"
                )
        elif info is not None or name in values:
            problems.append(f"wrong type: {name} is data in the file but {_a(leaf)} in like")
    for name in sorted(set(tensors) | set(values)):
        if _under(name, prefix) and name not in wanted:
            info = tensors.get(name)
            what = _show(_file_spec(info, keys)) if info else f"{_a(values[name])} value"
            problems.append(f"unexpected: {name} ({what} in the file, not in like)")
    if targets and not any(_under(n, prefix) for n in set(tensors) | set(values)):
        tops = sorted({m.group(1) for n in tensors if (m := _TOP.match(n))})
        problems.append(
            f"the file has nothing under prefix {prefix!r}; its top-level key paths are "
            f"{', '.join(tops) or '(none)'}"
        )
    return problems
