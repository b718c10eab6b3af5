"""Equinox's checkpoint format: `tree_serialise_leaves` and `tree_deserialise_leaves`.

An Equinox file is the tree's leaves, depth first, each written by `numpy.save` one after
another (no names, no header): `tree_serialise_leaves` here writes the same bytes as
`equinox.tree_serialise_leaves` for the same model, so files move both ways. treemod's layers
that hold their parameters differently from Equinox's are converted (`_layouts.py`), and state
is written as Equinox's `(model, state)` pair (`_serialisation_plan.py`). treemod's own
checkpoint system is `treemod.save`/`treemod.load`; this is Equinox's, for Equinox code.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import stat
from collections.abc import Callable
from typing import IO, Any

import jax
import jax.numpy as jnp
import numpy as np

from treemod import CheckpointError
from treemod._compat_api import (
    CheckpointNotFoundError,
    check_readable,
    check_writable,
    replace_atomically,
    seekable,
    spanning_error,
)

from ._serialisation_plan import Slot, plan

__all__ = [
    "default_deserialise_filter_spec",
    "default_serialise_filter_spec",
    "tree_deserialise_leaves",
    "tree_serialise_leaves",
]

PathOrFile = str | os.PathLike[str] | IO[bytes]
_NPY_MAGIC = b"\x93NUMPY"
_ARRAY_LIKE = (jax.Array, np.ndarray, np.generic, bool, int, float, complex)
# The record dtype kinds each Python scalar type reads without changing the value (`bool`
# before `int`: it is a subclass).
_SCALAR_KINDS = ((bool, "b"), (int, "iu"), (float, "f"), (complex, "c"))


class _EquinoxFileError(CheckpointError, RuntimeError):
    """A `CheckpointError` that is also the `RuntimeError` Equinox raises for a mismatch."""


class _ScalarMismatch(ValueError):
    """A scalar record whose dtype would change the value read into `like`'s scalar leaf."""

    def __init__(self, like: Any, raw: np.ndarray[Any, Any]) -> None:
        self.found = f"{raw.dtype.name} {raw.item()!r}"
        self.like = type(like).__name__
        super().__init__(
            f"the file holds {self.found} where `like` has a {self.like}: reading it would "
            "change the value (truncate it, or make it a bool)."
        )


def default_serialise_filter_spec(f: IO[bytes], x: Any) -> None:
    """Write one leaf as Equinox does: arrays and Python scalars by `numpy.save`, others not.

    Arguments:
        f: the binary file being written.
        x: the leaf.

    Example:
        >>> import io, numpy as np
        >>> import treemod.compat.equinox as eqx
        >>> buf = io.BytesIO()
        >>> eqx.default_serialise_filter_spec(buf, 1.5)
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
    and read nothing. A scalar is read only from a record that holds its kind of value (an
    `int` from an integer record, a `bool` from a boolean one, a NumPy scalar from its own
    dtype): a float read into an `int` would be truncated, so it is refused with a
    `ValueError` (Equinox converts it silently).

    Arguments:
        f: the binary file being read (seekable).
        x: the leaf of `like`.

    Returns:
        The loaded leaf.

    Example:
        >>> import io, numpy as np
        >>> import treemod.compat.equinox as eqx
        >>> buf = io.BytesIO()
        >>> np.save(buf, 7)
        >>> _ = buf.seek(0)
        >>> eqx.default_deserialise_filter_spec(buf, 0)
        7
    """
    if isinstance(x, jax.Array | jax.ShapeDtypeStruct):
        return jnp.load(f)  # restores bfloat16, which NumPy writes as raw 2-byte records
    if isinstance(x, np.ndarray):
        return np.load(f)
    if isinstance(x, _ARRAY_LIKE):
        raw = np.load(f)
        if isinstance(x, np.generic) and x.dtype == jnp.bfloat16 and raw.dtype.kind == "V":
            raw = raw.view(jnp.bfloat16)
        if isinstance(x, np.generic):
            same_kind = raw.dtype == x.dtype
        else:
            kinds = next(k for t, k in _SCALAR_KINDS if isinstance(x, t))
            same_kind = raw.dtype.kind in kinds
        if not same_kind and raw.ndim == 0:  # other shapes: `item` refuses them below
            raise _ScalarMismatch(x, raw)
        return type(x)(raw.item())
    return x


def _with_suffix(path: str | os.PathLike[str]) -> pathlib.Path:
    path = pathlib.Path(path)
    return path.with_suffix(".eqx") if path.suffix == "" else path


_FILE_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _open(path: str | os.PathLike[str], label: str) -> IO[bytes]:
    """Open a regular file to read, with errors that name it (a missing file is also a
    `FileNotFoundError`, as Equinox raises). The file is opened without blocking, so a FIFO
    with no writer is refused rather than waited on."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(_with_suffix(path), flags)
    except FileNotFoundError:
        raise CheckpointNotFoundError(
            f"tree_deserialise_leaves: there is no file {label}."
        ) from None
    except IsADirectoryError:
        fd = -1
    except OSError as e:
        raise _EquinoxFileError(
            f"tree_deserialise_leaves: cannot open {label}: {e.strerror or e}."
        ) from e
    try:
        mode = os.fstat(fd).st_mode if fd >= 0 else stat.S_IFDIR
        if stat.S_ISDIR(mode):
            raise _EquinoxFileError(
                f"tree_deserialise_leaves: {label} is a directory, not a file in Equinox's format."
            )
        if not stat.S_ISREG(mode):
            what = next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")
            raise _EquinoxFileError(
                f"tree_deserialise_leaves: {label} is {what}, not a regular file, and Equinox's "
                "format is read with seeks (NumPy's .npy reader). Read it into memory first: "
                "tree_deserialise_leaves(io.BytesIO(open(path, 'rb').read()), like)."
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise


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
        >>> import io, jax.numpy as jnp
        >>> import treemod.compat.equinox as eqx
        >>> buf = io.BytesIO()
        >>> eqx.tree_serialise_leaves(buf, {"w": jnp.ones(2), "step": 3})
        >>> _ = buf.seek(0)
        >>> eqx.tree_deserialise_leaves(buf, {"w": jnp.zeros(2), "step": 0})
        {'step': 3, 'w': Array([1., 1.], dtype=float32)}
    """
    slots, _ = plan(pytree, filter_spec, is_leaf)
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


def _write(f: IO[bytes], slots: list[Slot]) -> None:
    for slot in slots:
        try:
            slot.spec(f, slot.leaf)
        except Exception as e:
            raise RuntimeError(
                f"Error at leaf with path {slot.path}: tree_serialise_leaves could not write the "
                f"leaf at {slot.where()}: {type(e).__name__}: {e}"
            ) from e


def _check_header(f: IO[bytes], label: str, first: Slot) -> None:
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


def _check_leaf(label: str, slot: Slot, index: int, total: int) -> None:
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
        raise _mismatch(label, slot, index, total, *problem)


def _mismatch(
    label: str, slot: Slot, index: int, total: int, what: str, found: str, note: str = ""
) -> _EquinoxFileError:
    return _EquinoxFileError(
        f"Deserialised leaf at path {slot.path} has changed {what} in `like` to {found} on "
        f"disk: tree_deserialise_leaves: {label}, leaf {index + 1} of {total} at "
        f"{slot.where()}.{note} The file was saved from a different architecture or "
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
        >>> import treemod.compat.equinox as eqx
        >>> conv = tm.nn.Conv2d(1, 2, 3, key=jax.random.key(0))
        >>> buf = io.BytesIO()
        >>> eqx.tree_serialise_leaves(buf, conv)  # the bias goes out as Equinox's (2, 1, 1)
        >>> _ = buf.seek(0)
        >>> back = eqx.tree_deserialise_leaves(buf, tm.nn.Conv2d(1, 2, 3, key=jax.random.key(1)))
        >>> bool((back.bias == conv.bias).all()), back.bias.shape
        (True, (2,))
    """
    slots, rebuild = plan(like, filter_spec, is_leaf)
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
            except _ScalarMismatch as e:
                note = " Reading it would change the value (truncate it, or make it a bool)."
                raise _mismatch(
                    label, slot, i, total, f"type from {e.like}", e.found, note
                ) from None
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
