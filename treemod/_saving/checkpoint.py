"""`save` and `load`: checkpoints of any pytree, checked against a `like` tree on the way in.

Each array leaf is stored under its key path (`jax.tree_util.keystr`, e.g. `.layers[0].weight`,
`['opt'][0].mu`); `int`/`float`/`bool`/`complex`/`str` leaves are stored in the metadata under
theirs. The file format is written by `safetensors_write.py` and read by `safetensors_read.py`.
"""

from __future__ import annotations

import json
import numbers
import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

import jax
import jax.tree_util as jtu
import numpy as np

from treemod._saving.errors import CheckpointError
from treemod._saving.leaves import (
    as_like,
    check,
    is_key,
    key_record,
    kind,
    simple_kind,
    wrap_key,
)
from treemod._saving.multihost import check_addressable
from treemod._saving.safetensors_dtypes import DTYPES
from treemod._saving.safetensors_read import open_checkpoint
from treemod._saving.safetensors_write import write_checkpoint
from treemod._tree.filters import is_array
from treemod._tree.tree_at import tree_at

__all__ = ["save", "load"]

PathOrFile = str | os.PathLike[str] | IO[bytes]

_MAX_LISTED = 40


def _encode(name: str, value: Any, kind: str) -> list[Any]:
    """A simple value as stored: `[kind, text]`, the plain value of a subclass (an IntEnum)."""
    if kind == "float":
        return [kind, float.__repr__(value)]  # round-trips exactly, nan and inf included
    if kind == "complex":
        return [kind, [float.__repr__(value.real), float.__repr__(value.imag)]]
    if kind == "int":
        try:
            return [kind, int.__repr__(value)]
        except ValueError:  # more digits than Python turns into text
            digits = int(value.bit_length() * 0.30103)
            raise ValueError(
                f"save: the int at {name or '(root)'} has about {digits} digits, more than "
                f"Python converts to text ({sys.get_int_max_str_digits()}). "
                "Store it as a str, or as an array of its parts."
            ) from None
    if kind == "str":
        value = str.__str__(value)
        _check_text(f"the str value at {ascii(name)}", value)
    return [kind, value]


def _check_text(subject: str, text: str) -> None:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(
                f"save: {subject} holds a lone surrogate ({ascii(text[e.start : e.end])}), "
                "which is not valid Unicode and cannot be stored. Fix the text (e.g. "
                "text.encode('utf-8', 'surrogatepass').decode('utf-8', 'replace'))."
            ) from None


def _decode(label: str, name: str, entry: Any) -> Any:
    try:
        kind, raw = entry
        if kind == "bool" and type(raw) is bool:
            return raw
        if kind == "str" and type(raw) is str:
            return raw
        if kind == "int" and type(raw) is str:
            return int(raw)
        if kind == "float" and type(raw) is str:
            return float(raw)
        if kind == "complex" and all(type(r) is str for r in raw):
            return complex(float(raw[0]), float(raw[1]))
    except (TypeError, ValueError, IndexError, KeyError):
        pass
    raise CheckpointError(f"{label} is corrupted: the saved value at {name!r} is malformed.")


def _check_not_traced(name: str, leaf: Any, what: str) -> None:
    if isinstance(leaf, jax.core.Tracer):
        raise TypeError(
            f"{what}: the leaf at {name or '(root)'} is a tracer: checkpoints are written and "
            "read outside jit/grad/vmap. Return the values from the transformed function first."
        )


def save(path_or_file: PathOrFile, tree: Any) -> None:
    """Save a pytree (a model, optimiser state, a dict of them, ...) to a checkpoint file.

    Arrays are stored under their key paths (`jax.tree_util.keystr`: `.layers[0].weight`,
    `['step']`), with dtype, shape and a SHA-256 checksum; `int`, `float`, `bool`, `complex` and
    `str` leaves are stored too, and PRNG key arrays as their key data. Static fields and other
    leaves (functions, objects) are not: they come from `like` when loading. Sharded arrays are
    gathered one at a time and `treemod.State` values are saved like any array.

    Writing to a path is atomic: the file is written to a temporary file in the same directory,
    flushed and fsynced, then renamed over `path`, so a crash leaves either the old file or the
    new one, never a mixture. The file is a safetensors file (readable by `safetensors.numpy`
    and `safetensors.torch`); see the concepts page "Saving and loading".

    Arguments:
        path_or_file: a path, or a binary file or stream opened for writing (not atomic;
            append mode and compressing writers such as `gzip.open` work).
        tree: any pytree of arrays, modules and simple Python values.

    Example:
        >>> import tempfile, os, jax.numpy as jnp, treemod as tm
        >>> path = os.path.join(tempfile.mkdtemp(), "ckpt.safetensors")
        >>> tm.save(path, {"w": jnp.ones(3), "step": 10})
        >>> tm.load(path, like={"w": jnp.zeros(3), "step": 0})
        {'step': 10, 'w': Array([1., 1., 1.], dtype=float32)}
    """
    tensors: list[tuple[str, Any]] = []
    values: dict[str, Any] = {}
    keys: dict[str, dict[str, str]] = {}
    seen: set[str] = set()
    for path, leaf in jtu.tree_flatten_with_path(tree)[0]:
        name = jtu.keystr(path)
        if name in seen:
            raise ValueError(
                f"save: two leaves have the same key path {name!r} (dictionary keys that print "
                "alike, such as 1 and '1'?). Give them distinct keys."
            )
        seen.add(name)
        if not name.isascii():
            _check_text(f"the key path {ascii(name)}", name)
        _check_not_traced(name, leaf, "save")
        if isinstance(leaf, jax.ShapeDtypeStruct):
            raise TypeError(
                f"save: the leaf at {name or '(root)'} is a ShapeDtypeStruct, which has no "
                "values. Save the concrete tree (abstract trees are for `like` when loading)."
            )
        if is_array(leaf):
            check_addressable(name, leaf)
            if is_key(leaf):
                keys[name] = key_record(leaf)
                leaf = jax.random.key_data(leaf)
            try:
                DTYPES[np.dtype(leaf.dtype).name]
            except KeyError:
                raise TypeError(
                    f"save: the array at {name} has dtype {leaf.dtype}, which checkpoints "
                    "cannot hold (bool, integer, floating, complex and ml_dtypes arrays can)."
                ) from None
            tensors.append((name, leaf))
        elif (leaf_kind := simple_kind(leaf)) is not None:
            values[name] = _encode(name, leaf, leaf_kind)
        elif isinstance(leaf, numbers.Number | bytes | bytearray):
            raise TypeError(
                f"save: the leaf at {name or '(root)'} is a {type(leaf).__name__}, data that "
                "checkpoints cannot hold (and `load` would silently give like's value back). "
                "Store it as an int, float, str or array, or mark the field static "
                "(tm.field(static=True)) if it is configuration."
            )
    metadata = {"treemod.values": json.dumps(values, ensure_ascii=False)}
    metadata["treemod.keys"] = json.dumps(keys)
    write_checkpoint(path_or_file, tensors, metadata)


def _to_like(host: Any, leaf: Any) -> Any:
    """Turn a loaded host array into the kind of array `leaf` is, on its devices."""
    if isinstance(leaf, np.ndarray):
        return host
    if isinstance(leaf, np.generic):
        return host[()]
    sharding = getattr(leaf, "sharding", None)
    if isinstance(sharding, jax.sharding.Sharding):
        out = jax.device_put(host, sharding)
    else:
        out = jax.device_put(host)
    if is_key(leaf):
        return out
    if getattr(leaf, "weak_type", False):
        from treemod._private_apis import convert_element_type

        out = convert_element_type(out, weak_type=True)
    return out


def _key_path_of(like: Any, node: Any) -> str:
    found = [
        jtu.keystr(p)
        for p, x in jtu.tree_flatten_with_path(like, is_leaf=lambda x: x is node)[0]
        if x is node
    ]
    if len(found) != 1:
        where_ = "is not a node of like" if not found else f"appears {len(found)} times in like"
        raise ValueError(
            f"load: the subtree that `where` selected {where_}, so its key path in the file is "
            "unknown. Pass prefix= (its key path in the file, e.g. '.backbone')."
        )
    return found[0]


def _prefix_hint(names: set[str], targets: list[tuple[str, Any]], prefix: str) -> str:
    """A hint naming the `prefix=` under which the file holds every entry of `like`, if any.

    Loading the model alone from a `{"model": ..., "opt_state": ...}` checkpoint finds the
    model's entries under `['model']`; only the error path pays for the search.
    """
    wanted = [n[len(prefix) :] for n, leaf in targets if n in names or kind(leaf) == "array"]
    if not wanted or not wanted[0]:
        return ""
    first = wanted[0]
    found = sorted(
        n[: -len(first)]
        for n in names
        if n.endswith(first)
        and n != prefix + first
        and all(n[: -len(first)] + w in names for w in wanted)
    )
    if not found:
        return ""
    return (
        f"\nThe file holds every entry of like under prefix={found[0]!r}: pass "
        f"prefix={found[0]!r} to load that part (say, the model alone from a checkpoint of "
        "{'model': ..., 'opt_state': ...})."
    )


def _eval_shape_hint(values: dict[str, Any], targets: list[tuple[str, Any]]) -> str:
    """A hint when `like` has a `jax.ShapeDtypeStruct` where the file holds a Python value:
    the mark of a skeleton from `jax.eval_shape`, whose Python numbers (a `Dropout`'s `p`,
    `inference` flags) became arrays, and which `is_param` then counts as parameters."""
    found = [n for n, leaf in targets if isinstance(leaf, jax.ShapeDtypeStruct) and n in values]
    if not found:
        return ""
    return (
        f"\nlike has a jax.ShapeDtypeStruct where the file holds a Python value ({found[0]}"
        f"{f' and {len(found) - 1} more' if len(found) > 1 else ''}): a skeleton from "
        "jax.eval_shape turns the model's Python numbers into arrays (and an optimiser state "
        "built from it gets entries for them). Build the skeleton with tm.filter_eval_shape, "
        "which keeps them as they are."
    )


def load(
    path_or_file: PathOrFile,
    like: Any,
    *,
    where: Callable[[Any], Any] | None = None,
    prefix: str | None = None,
    allow_foreign: bool = False,
) -> Any:
    """Load a checkpoint written by `save`, checked against `like`.

    `like` gives the structure, shapes and dtypes to expect: a tree like the saved one, such as
    a freshly initialised model, or an abstract one from `jax.eval_shape` (whose
    `jax.ShapeDtypeStruct` leaves allocate nothing). Every key path, shape, dtype and simple
    value type is checked first; all mismatches (missing, unexpected, wrong shape, dtype or type)
    are reported in one `CheckpointError`, and nothing is returned half-loaded. Each tensor's
    checksum is verified as it is read.

    Loaded arrays take the kind and placement of `like`'s leaves: a `jax.Array` or a
    `ShapeDtypeStruct` with a sharding gives an array with that sharding (`jax.device_put`), a
    NumPy array gives a NumPy array. Simple values (a step counter, say) are data: they come
    from the file, and need only match `like`'s in type. Static fields and non-data leaves
    (functions, objects) are taken from `like`.

    Arguments:
        path_or_file: a path, or a binary file opened for reading.
        like: the tree to fill (concrete or abstract).
        where: load only part of `like`: a function selecting one subtree, e.g.
            `lambda m: m.backbone`. The rest of `like` is returned unchanged, and entries of the
            file outside that subtree are ignored.
        prefix: the key path, in the file, of the part to load. By default the key path of the
            `where` selection (or `""`, the whole file). Use it to load a checkpoint of the
            backbone alone (`prefix=""`), or one saved under another name (`prefix=".encoder"`).
        allow_foreign: accept a safetensors file not written by treemod (e.g. converted from
            PyTorch); such files have no checksums. Their tensor names must be `like`'s key paths.

    Returns:
        A tree with `like`'s structure holding the file's data.

    Raises:
        CheckpointError: the file is damaged or not a checkpoint, or does not match `like`.

    Example:
        >>> import io, jax, jax.numpy as jnp, treemod as tm
        >>> class Net(tm.Module):
        ...     backbone: dict
        ...     head: jax.Array
        >>> buf = io.BytesIO()
        >>> tm.save(buf, Net({"w": jnp.full(2, 5.0)}, jnp.ones(1)))
        >>> abstract = jax.eval_shape(lambda: Net({"w": jnp.zeros(2)}, jnp.zeros(1)))
        >>> _ = buf.seek(0)
        >>> tm.load(buf, abstract).backbone["w"]
        Array([5., 5.], dtype=float32)
        >>> new = Net({"w": jnp.zeros(2)}, jnp.zeros(3))  # a new head: load only the backbone
        >>> _ = buf.seek(0)
        >>> tm.load(buf, new, where=lambda m: m.backbone).backbone["w"]
        Array([5., 5.], dtype=float32)
    """
    if prefix is not None and prefix and prefix[0] not in ".[":
        raise ValueError(
            f"load: prefix={prefix!r} is not a key path; key paths look like '.backbone', "
            '".layers[0]" or "[\'encoder\']" (jax.tree_util.keystr of the path).'
        )
    if where is not None:
        selected = where(like)
        if prefix is None:
            prefix = _key_path_of(like, selected)
        part = selected
    else:
        part = like
    prefix = prefix or ""

    leaves, treedef = jtu.tree_flatten_with_path(part)
    targets = []
    for path, leaf in leaves:
        name = prefix + jtu.keystr(path)
        _check_not_traced(name, leaf, "load")
        targets.append((name, leaf))
    with open_checkpoint(path_or_file, allow_foreign) as reader:
        raw_values = reader.json_metadata("treemod.values", {})
        values = {n: _decode(reader.label, n, e) for n, e in raw_values.items()}
        keys = reader.json_metadata("treemod.keys", {})
        problems = check(reader.tensors, values, keys, targets, prefix)
        if problems:
            shown = problems[:_MAX_LISTED]
            more = len(problems) - len(shown)
            raise CheckpointError(
                f"{reader.label} does not match like ({type(part).__name__}): "
                f"{len(problems)} mismatch{'es' if len(problems) != 1 else ''}\n  "
                + "\n  ".join(shown)
                + (f"\n  ... and {more} more" if more else "")
                + "\nNothing was loaded. Key paths are jax.tree_util.keystr paths. To load part "
                "of a model, pass where= (and prefix= if the file names it differently)."
                + _prefix_hint(set(reader.tensors) | set(values), targets, prefix)
                + _eval_shape_hint(values, targets)
            )
        new_leaves = []
        # Checksums are computed in a second thread while the next tensor is read and placed;
        # all are awaited (and the first failure raised) before anything is returned.
        with ThreadPoolExecutor(1) as checker:
            pending = []
            for name, leaf in targets:
                leaf_kind = kind(leaf)
                if leaf_kind == "array" and name in reader.tensors:
                    info = reader.tensors[name]
                    buf = reader.read_bytes(info)
                    pending.append(checker.submit(reader.check, info, buf))
                    host: Any = reader.as_array(info, buf)
                    if is_key(leaf):
                        host = wrap_key(reader.label, name, host, keys[name])
                    new_leaves.append(_to_like(host, leaf))
                elif leaf_kind == "value" and name in values:
                    new_leaves.append(as_like(reader.label, name, values[name], leaf))
                elif leaf_kind == "array" and name in values:
                    new_leaves.append(values[name])
                else:
                    new_leaves.append(leaf)
            for done in pending:
                done.result()
    loaded = jtu.tree_unflatten(treedef, new_leaves)
    if where is None:
        return loaded
    return tree_at(where, like, loaded)
