"""Equinox's checkpoint format: `tree_serialise_leaves` and `tree_deserialise_leaves`.

An Equinox file is the tree's leaves, depth first, each written by `numpy.save` one after
another (no names, no header): `tree_serialise_leaves` here writes the same bytes as
`equinox.tree_serialise_leaves` for the same model, so files move both ways.

Layouts. Where a treemod layer holds its parameters differently from Equinox's layer of the
same name, the class converts with two methods (a class-level protocol any `Module` may define):

- `__equinox_leaves__(self) -> dict[str, Any]`: Equinox's fields of the layer, in Equinox's
  field order, each holding what Equinox's layer holds there (arrays in Equinox's shapes and
  orientation, Python scalars, nested modules, `None`). A value wrapped in `treemod.State` is
  a `StateIndex` of Equinox's: its value lives in Equinox's separate `State` object.
- `__from_equinox_leaves__(self, fields: dict[str, Any]) -> Self`: the layer rebuilt from such
  a dict (with the loaded values), `self` giving the static configuration.

Both must accept `jax.ShapeDtypeStruct` leaves (use `map_array`), as loading into an abstract
model does. Modules without the methods are saved as their own leaves.

State. treemod keeps state (`treemod.State` nodes: BatchNorm's statistics, SpectralNorm's
vectors) inside the model; Equinox keeps it in a separate `State` and saves the pair
`(model, state)`. A tree holding state is therefore written as Equinox writes
`(model, state)` made by `equinox.nn.make_with_state`: the model's leaves, then the state's
values in the order of the model's state indices. A tree without state is written as the
tree itself.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
from collections.abc import Callable
from typing import IO, Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from treemod._module.state import State
from treemod._saving.atomic_file import replace_atomically
from treemod._saving.errors import CheckpointError
from treemod._saving.multihost import spanning_error
from treemod._saving.safetensors_read import (
    CheckpointNotFoundError,
    check_readable,
    seekable,
)
from treemod._saving.safetensors_write import check_writable

__all__ = [
    "default_deserialise_filter_spec",
    "default_serialise_filter_spec",
    "map_array",
    "tree_deserialise_leaves",
    "tree_serialise_leaves",
]

PathOrFile = str | os.PathLike[str] | IO[bytes]
_NPY_MAGIC = b"\x93NUMPY"
_ARRAY_LIKE = (jax.Array, np.ndarray, np.generic, bool, int, float, complex)


class _EquinoxFileError(CheckpointError, RuntimeError):
    """A `CheckpointError` that is also the `RuntimeError` Equinox raises for a mismatch."""


def map_array(x: Any, fn: Callable[[Any], Any]) -> Any:
    """Apply `fn` to an array, or to the shape and dtype of a `jax.ShapeDtypeStruct`.

    Layers' `__equinox_leaves__`/`__from_equinox_leaves__` use it so that one conversion
    serves concrete models and abstract ones (from `filter_eval_shape`); `None` passes through.

    Arguments:
        x: an array, a `jax.ShapeDtypeStruct` or `None`.
        fn: a function of one array (a reshape, a flip, a transpose).

    Returns:
        `fn(x)`, or its `jax.ShapeDtypeStruct` if `x` is one.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod._saving.equinox_format import map_array
        >>> map_array(jax.ShapeDtypeStruct((3,), jnp.float32), lambda b: b.reshape(3, 1)).shape
        (3, 1)
    """
    if x is None:
        return None
    if isinstance(x, jax.ShapeDtypeStruct):
        return jax.eval_shape(fn, x)
    return fn(x)


def default_serialise_filter_spec(f: IO[bytes], x: Any) -> None:
    """Write one leaf as Equinox does: arrays and Python scalars by `numpy.save`, others not.

    Arguments:
        f: the binary file being written.
        x: the leaf.

    Example:
        >>> import io, numpy as np, treemod as tm
        >>> buf = io.BytesIO()
        >>> tm.default_serialise_filter_spec(buf, 1.5)
        >>> _ = buf.seek(0)
        >>> np.load(buf)
        array(1.5)
    """
    if isinstance(x, _ARRAY_LIKE):
        np.save(f, x)


def default_deserialise_filter_spec(f: IO[bytes], x: Any) -> Any:
    """Read the leaf that stands where `x` stands in `like`, as Equinox does.

    JAX arrays (and `jax.ShapeDtypeStruct`s) come back as JAX arrays, NumPy arrays as NumPy
    arrays, Python and NumPy scalars as their own type; other leaves are returned unchanged
    and read nothing.

    Arguments:
        f: the binary file being read (seekable).
        x: the leaf of `like`.

    Returns:
        The loaded leaf.

    Example:
        >>> import io, numpy as np, treemod as tm
        >>> buf = io.BytesIO()
        >>> np.save(buf, 7)
        >>> _ = buf.seek(0)
        >>> tm.default_deserialise_filter_spec(buf, 0)
        7
    """
    if isinstance(x, jax.Array | jax.ShapeDtypeStruct):
        return jnp.load(f)  # restores bfloat16, which NumPy writes as raw 2-byte records
    if isinstance(x, np.ndarray):
        return np.load(f)
    if isinstance(x, _ARRAY_LIKE):
        raw = np.load(f)
        if isinstance(x, jnp.bfloat16) and raw.dtype.kind == "V":
            raw = raw.view(jnp.bfloat16)
        return type(x)(raw.item())
    return x


# Equinox's view of a treemod tree: slots (one per leaf) and a function rebuilding the tree.


class _Slot:
    __slots__ = ("path", "leaf", "spec", "owner", "value")

    def __init__(self, path: jtu.KeyPath[Any], leaf: Any, spec: Any, owner: str | None) -> None:
        self.path, self.leaf, self.spec, self.owner, self.value = path, leaf, spec, owner, leaf

    def get(self) -> Any:
        return self.value

    def where(self) -> str:
        where = jtu.keystr(self.path) or "(root)"
        if self.owner:
            where += f" (in Equinox's layout of {self.owner})"
        return where


def _hooked(x: Any) -> bool:
    return hasattr(type(x), "__equinox_leaves__")


def _view(
    node: Any,
    path: jtu.KeyPath[Any],
    spec: Any,
    is_leaf: Any,
    model: list[_Slot],
    state: list[_Slot],
    owner: str | None = None,
) -> Callable[[], Any]:
    """Append `node`'s slots (Equinox's order) and return a function rebuilding `node`."""
    if is_leaf is not None and is_leaf(node):
        slot = _Slot(path, node, spec, owner)
        model.append(slot)
        return slot.get
    if isinstance(node, State):
        slots: list[_Slot] = []
        value_path = (*path, jtu.GetAttrKey("value"))
        inner = _view(node.value, value_path, spec, is_leaf, slots, slots, owner)
        state.extend(slots)
        return lambda: State(inner())
    if _hooked(node):
        fields = node.__equinox_leaves__()
        name = type(node).__name__
        parts = [
            (k, _view(v, (*path, jtu.GetAttrKey(k)), spec, is_leaf, model, state, name))
            for k, v in fields.items()
        ]
        return lambda: node.__from_equinox_leaves__({k: build() for k, build in parts})

    def stop(x: Any) -> bool:
        return x is not node and (
            isinstance(x, State) or _hooked(x) or (is_leaf is not None and is_leaf(x))
        )

    pairs, treedef = jtu.tree_flatten_with_path(node, is_leaf=stop)
    builders = []
    for p, x in pairs:
        where = (*path, *p)
        if x is not node and (isinstance(x, State) or _hooked(x)):
            builders.append(_view(x, where, spec, is_leaf, model, state, owner))
        else:
            slot = _Slot(where, x, spec, owner)
            model.append(slot)
            builders.append(slot.get)
    return lambda: jtu.tree_unflatten(treedef, [b() for b in builders])


def _plan(tree: Any, filter_spec: Any, is_leaf: Any) -> tuple[list[_Slot], Callable[[], Any]]:
    """All slots of `tree` in file order (model, then state) and the tree's rebuilder."""
    spec_pairs, spec_def_ = jtu.tree_flatten_with_path(filter_spec)
    spec_def: Any = spec_def_
    try:
        subtrees = spec_def.flatten_up_to(tree)
    except (ValueError, TypeError) as e:
        raise ValueError(
            "filter_spec must be a function, or a tree of functions whose structure is a prefix "
            f"of the tree's: {e}"
        ) from None
    model: list[_Slot] = []
    state: list[_Slot] = []
    builders = [
        _view(sub, tuple(p), spec, is_leaf, model, state)
        for (p, spec), sub in zip(spec_pairs, subtrees, strict=True)
    ]
    return model + state, lambda: jtu.tree_unflatten(spec_def, [b() for b in builders])


def _with_suffix(path: str | os.PathLike[str]) -> pathlib.Path:
    path = pathlib.Path(path)
    return path.with_suffix(".eqx") if path.suffix == "" else path


def _open(path: str | os.PathLike[str], label: str) -> IO[bytes]:
    """Open a file to read, with errors that name it (a missing file is also a
    `FileNotFoundError`, as Equinox raises)."""
    try:
        return open(_with_suffix(path), "rb")
    except FileNotFoundError:
        raise CheckpointNotFoundError(
            f"tree_deserialise_leaves: there is no file {label}."
        ) from None
    except IsADirectoryError:
        raise _EquinoxFileError(
            f"tree_deserialise_leaves: {label} is a directory, not a file in Equinox's format."
        ) from None
    except OSError as e:
        raise _EquinoxFileError(
            f"tree_deserialise_leaves: cannot open {label}: {e.strerror or e}."
        ) from e


def _label(path_or_file: Any) -> str:
    if isinstance(path_or_file, str | os.PathLike):
        return str(_with_suffix(path_or_file))
    name = getattr(path_or_file, "name", None)
    return name if isinstance(name, str) else f"<{type(path_or_file).__name__}>"


def tree_serialise_leaves(
    path_or_file: PathOrFile,
    pytree: Any,
    filter_spec: Any = default_serialise_filter_spec,
    is_leaf: Callable[[Any], bool] | None = None,
) -> None:
    """Save the leaves of a pytree in Equinox's format (the bytes `equinox.tree_serialise_leaves`
    writes).

    Each leaf, depth first, is passed to `filter_spec(file, leaf)`; the default writes arrays and
    Python `bool`/`int`/`float`/`complex` by `numpy.save` and skips the rest (functions, `None`,
    strings). treemod layers whose parameters Equinox holds differently (convolution biases,
    transposed-convolution kernels, PReLU, pools, BatchNorm, SpectralNorm) are written in
    Equinox's layout, and a model holding `treemod.State` is written as Equinox's
    `(model, state)` pair, so `equinox.tree_deserialise_leaves` loads the file into the same
    architecture built with Equinox. See "Equinox's format" on the concepts page "Saving and
    loading"; `save` writes treemod's own checked, named format.

    Writing to a path is atomic (a temporary file renamed over it); a path with no suffix gets
    `.eqx`, as in Equinox.

    Arguments:
        path_or_file: a path, or a binary file object opened for writing.
        pytree: the tree to save.
        filter_spec: how to write each leaf: a function `(file, leaf) -> None`, or a tree of
            such functions whose structure is a prefix of `pytree`'s.
        is_leaf: called on every node; `True` makes the node a leaf (passed to `filter_spec`
            whole).

    Example:
        >>> import io, jax.numpy as jnp, treemod as tm
        >>> buf = io.BytesIO()
        >>> tm.tree_serialise_leaves(buf, {"w": jnp.ones(2), "step": 3})
        >>> _ = buf.seek(0)
        >>> tm.tree_deserialise_leaves(buf, {"w": jnp.zeros(2), "step": 0})
        {'step': 3, 'w': Array([1., 1.], dtype=float32)}
    """
    slots, _ = _plan(pytree, filter_spec, is_leaf)
    for slot in slots:
        if isinstance(slot.leaf, jax.core.Tracer):
            raise TypeError(
                f"tree_serialise_leaves: the leaf at {slot.where()} is a tracer: files are "
                "written outside jit/grad/vmap. Return the values from the transformed "
                "function first."
            )
        if slot.spec is default_serialise_filter_spec:  # a spec of one's own may gather it
            spanning = spanning_error("tree_serialise_leaves", slot.where(), slot.leaf)
            if spanning is not None:
                raise RuntimeError(spanning)  # Equinox's type (JAX's, for such an array)
    if isinstance(path_or_file, str | os.PathLike):
        replace_atomically(
            str(_with_suffix(path_or_file)), lambda f: _write(f, slots), "tree_serialise_leaves"
        )
    else:
        check_writable(path_or_file, "tree_serialise_leaves")
        _write(path_or_file, slots)


def _write(f: IO[bytes], slots: list[_Slot]) -> None:
    for slot in slots:
        try:
            slot.spec(f, slot.leaf)
        except Exception as e:
            raise RuntimeError(
                f"Error at leaf with path {slot.path}: tree_serialise_leaves could not write the "
                f"leaf at {slot.where()}: {type(e).__name__}: {e}"
            ) from e


def _check_header(f: IO[bytes], label: str, first: _Slot) -> None:
    """Refuse a file that is not a sequence of `.npy` records, saying what it is."""
    start = f.tell()
    head = f.read(9)
    f.seek(start)
    if not head or head[: len(_NPY_MAGIC)] == _NPY_MAGIC:
        return  # an empty file is reported when a leaf is missing
    if len(head) == 9 and head[8:9] == b"{":
        what = (
            "a safetensors file (treemod's own checkpoint format, written by tm.save): read it "
            "with tm.load(path, like)"
        )
    else:
        what = "not in Equinox's format (a sequence of NumPy .npy records)"
    raise _EquinoxFileError(
        f"tree_deserialise_leaves: {label} is {what}; nothing was loaded (first leaf: "
        f"{first.where()})."
    )


def _describe(x: Any) -> str:
    if isinstance(x, jax.Array | np.ndarray | jax.ShapeDtypeStruct):
        return f"{type(x).__name__} {np.dtype(x.dtype).name}{list(x.shape)}"
    return type(x).__name__


def _check_leaf(label: str, slot: _Slot, index: int, total: int) -> None:
    new, old = slot.value, slot.leaf
    old_is_jax = isinstance(old, jax.Array | jax.ShapeDtypeStruct)
    same_type = isinstance(new, jax.Array) if old_is_jax else type(new) is type(old)
    problem = None
    if not same_type:
        problem = f"type from {_describe(old)}", _describe(new)
    elif isinstance(new, jax.Array | np.ndarray):
        if new.shape != old.shape:
            problem = f"shape from {tuple(old.shape)}", str(tuple(new.shape))
        elif new.dtype != old.dtype:
            problem = f"dtype from {np.dtype(old.dtype).name}", np.dtype(new.dtype).name
    if problem:
        raise _EquinoxFileError(
            f"Deserialised leaf at path {slot.path} has changed {problem[0]} in `like` to "
            f"{problem[1]} on disk: tree_deserialise_leaves: {label}, leaf {index + 1} of "
            f"{total} at {slot.where()}. The file was saved from a different architecture or "
            "configuration than `like`; build `like` as the saved model was built."
        )


def tree_deserialise_leaves(
    path_or_file: PathOrFile,
    like: Any,
    filter_spec: Any = default_deserialise_filter_spec,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    """Load a file in Equinox's format into the structure of `like`.

    Reads what `tree_serialise_leaves` (treemod's or Equinox's) wrote: each leaf of `like`,
    depth first, is replaced by `filter_spec(file, leaf)`; by default arrays and Python
    scalars are read and other leaves kept. treemod layers that hold their parameters
    differently from Equinox's are converted from Equinox's layout, and a `like` holding
    `treemod.State` reads Equinox's `(model, state)` pair (see `tree_serialise_leaves`).
    Each leaf's type, shape and dtype are checked against `like`; a mismatch, a file that ends
    too early or (reading a path with the default `filter_spec`) holds more leaves than `like`
    raises an error naming the key path. `like` may be abstract (`filter_eval_shape`).

    Arguments:
        path_or_file: a path (`.eqx` is added when it has no suffix), or a binary file object
            opened for reading (seekable).
        like: a tree of the saved structure, e.g. a freshly built model.
        filter_spec: how to read each leaf: a function `(file, leaf) -> new_leaf`, or a tree of
            such functions whose structure is a prefix of `like`'s.
        is_leaf: called on every node; `True` makes the node a leaf.

    Returns:
        `like` with the loaded leaves.

    Raises:
        CheckpointError: the file does not match `like`, or is not in Equinox's format.

    Example:
        >>> import io, jax, jax.numpy as jnp, treemod as tm
        >>> conv = tm.nn.Conv2d(1, 2, 3, key=jax.random.key(0))
        >>> buf = io.BytesIO()
        >>> tm.tree_serialise_leaves(buf, conv)  # the bias goes out as Equinox's (2, 1, 1)
        >>> _ = buf.seek(0)
        >>> back = tm.tree_deserialise_leaves(buf, tm.nn.Conv2d(1, 2, 3, key=jax.random.key(1)))
        >>> bool((back.bias == conv.bias).all()), back.bias.shape
        (True, (2,))
    """
    slots, rebuild = _plan(like, filter_spec, is_leaf)
    label = _label(path_or_file)
    with contextlib.ExitStack() as stack:
        if isinstance(path_or_file, str | os.PathLike):
            f: IO[bytes] = stack.enter_context(_open(path_or_file, label))
            whole = True
        else:
            check_readable(path_or_file, label, "tree_deserialise_leaves")
            if not seekable(path_or_file):
                raise _EquinoxFileError(
                    f"tree_deserialise_leaves: {label} cannot seek (a pipe or a socket?), and "
                    "Equinox's format is read with seeks (NumPy's .npy reader). Read it into "
                    "memory first: tree_deserialise_leaves(io.BytesIO(f.read()), like)."
                )
            f, whole = path_or_file, False
        if slots and slots[0].spec is default_deserialise_filter_spec:
            _check_header(f, label, slots[0])
        total = len(slots)
        for i, slot in enumerate(slots):
            try:
                slot.value = slot.spec(f, slot.leaf)
            except CheckpointError:
                raise
            except EOFError:
                raise _EquinoxFileError(
                    f"Error at leaf with path {slot.path}: tree_deserialise_leaves: {label} "
                    f"ends before leaf {i + 1} of {total} "
                    f"({slot.where()}): the file holds fewer leaves than `like`. It was saved "
                    "from a smaller model, or from the model without its state (Equinox saves "
                    "`(model, state)` for stateful models)."
                ) from None
            except Exception as e:
                raise _EquinoxFileError(
                    f"Error at leaf with path {slot.path}: tree_deserialise_leaves: {label}, "
                    f"leaf {i + 1} of {total} at {slot.where()} could not be read: "
                    f"{type(e).__name__}: {e}"
                ) from e
            _check_leaf(label, slot, i, total)
        if whole and all(s.spec is default_deserialise_filter_spec for s in slots):
            rest = f.read(1)
            if rest:
                raise _EquinoxFileError(
                    f"tree_deserialise_leaves: {label} holds more data after the {total} "
                    "leaves `like` asked for: it was saved from a larger model (or with its "
                    "state while `like` has none). Nothing was loaded."
                )
    return rebuild()
