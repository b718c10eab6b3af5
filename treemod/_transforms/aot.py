"""Ahead of time: save a compiled `filter_jit` step and run it in a new process without tracing.

`save_compiled` writes one file holding the compiled executable (JAX's
`jax.experimental.serialize_executable`), the arguments' tree structure, static leaves, array
shapes and dtypes, and the JAX version and devices it was compiled for. `load_compiled` reads
it back as a callable that checks each call's arguments against what was compiled (naming the
argument path that differs) and runs the executable: no tracing, lowering or compilation.

Given a `Lowered`, `save_compiled` compiles it with `LOAD_OPTIONS` for its platform. On the
CPU these turn off XLA's YNNPACK library fusions: loading an executable finds each fusion's
instruction by a scan of the whole program (quadratic in the program's size: 88 s of the 102 s
first step of a 48-block stack) and its first run builds every fusion's runtime.
"""

from __future__ import annotations

import importlib
import io
import os
import pickle
import sys
import types
from itertools import compress
from pathlib import Path
from typing import IO, Any

import jax
import jax.tree_util as jtu

from treemod._format.retrace import aval_of, explain, leaf_paths
from treemod._saving.atomic_file import replace_atomically
from treemod._transforms.jit import UNUSED_DONATION, Compiled, Lowered
from treemod._transforms.jit_cache import static_key
from treemod._transforms.leaves import unpack_output
from treemod._tree.filters import IS_ARRAY_TYPE

__all__ = ["LoadedCompiled", "load_compiled", "save_compiled"]

_FORMAT = "treemod compiled step"
_VERSION = 1

# XLA options `save_compiled` compiles a `Lowered` with, per platform: what loads fast.
LOAD_OPTIONS: dict[str, dict[str, Any]] = {"cpu": {"xla_cpu_experimental_ynn_fusion_type": ""}}


def _environment() -> dict[str, Any]:
    device = jax.devices()[0]
    return {
        "jax": jax.__version__,
        "jaxlib": jax.lib.__version__ if hasattr(jax.lib, "__version__") else jax.__version__,
        "platform": device.platform,
        "device_kind": device.device_kind,
    }


def _float_positions(static: tuple[Any, ...]) -> tuple[int, ...]:
    return tuple(i for i, x in enumerate(static) if isinstance(x, float | complex))


def save_compiled(
    path: str | os.PathLike[str], compiled: Compiled[Any, Any] | Lowered[Any, Any]
) -> Path:
    """Save an ahead-of-time compiled `filter_jit` function to one file.

    `compiled` comes from `treemod.filter_jit(f).lower(*args)`, compiled here with the options
    that make loading fast (`LOAD_OPTIONS`: on the CPU, no YNNPACK library fusions, whose load
    cost grows with the square of the program's size), or from `.lower(*args).compile()`,
    saved as it is. The file holds the executable, the arguments' structure, static values,
    shapes and dtypes, and the JAX version and devices; `load_compiled` runs it in another
    process without tracing. Static values are saved with `pickle` (functions and classes by
    name: they must be importable there).

    Arguments:
        path: the file to write, replaced atomically as `treemod.save` does (fsynced; an
            existing file keeps its permissions, a symbolic link is written through, and the
            temporaries of saves that were killed are removed).
        compiled: `.lower(...)` or `.lower(...).compile()` of a `filter_jit` function.

    Returns:
        The path written.

    Example:
        >>> import jax.numpy as jnp, tempfile, os, treemod as tm
        >>> step = tm.filter_jit(lambda x, n: x * n).lower(jnp.ones(2), 3)
        >>> path = tm.save_compiled(os.path.join(tempfile.mkdtemp(), "step.jaxexe"), step)
        >>> tm.load_compiled(path)(jnp.arange(2.0), 3)
        Array([0., 3.], dtype=float32)
    """
    if not isinstance(compiled, Compiled | Lowered):
        raise TypeError(
            "save_compiled expects what `treemod.filter_jit(f).lower(*args)` (or its "
            f"`.compile()`) returns; got {type(compiled).__name__}."
        )
    wrapper = compiled._wrapper
    if wrapper._fn_tree is not None:
        raise TypeError(
            f"save_compiled: {wrapper._name} holds arrays of its own (a Module, or a method "
            "bound to one), which the file would not contain. Compile a function that takes "
            "the module as an argument, e.g. filter_jit(type(model).__call__) or "
            "filter_jit(lambda model, x: model(x))."
        )
    if isinstance(compiled, Lowered):
        compiled = compiled.compile(LOAD_OPTIONS.get(jax.devices()[0].platform))
    from jax.experimental.serialize_executable import serialize

    try:
        payload, in_tree, out_tree = serialize(compiled._compiled)
    except (ValueError, NotImplementedError) as e:
        raise ValueError(f"save_compiled: JAX cannot serialise {wrapper._name}: {e}") from e
    treedef, mask, static, avals = compiled._signature
    devices = sorted(
        {d.id for s in jtu.tree_leaves(compiled._compiled.input_shardings) for d in s.device_set}
    )
    record = {
        "format": _FORMAT,
        "version": _VERSION,
        "name": wrapper._name,
        **_environment(),
        "devices": devices,
        "treedef": treedef,
        "mask": mask,
        "static": static,
        "avals": avals,
        "k": compiled._k,
        "in_tree": in_tree,
        "out_tree": out_tree,
        "payload": payload,
    }
    try:
        data = _dumps(record)
    except Exception as e:  # name the static value that cannot be saved
        for where, value in zip(_static_paths(treedef, mask), static, strict=True):
            try:
                _dumps(value)
            except Exception:
                raise TypeError(
                    f"save_compiled: the static value {value!r} at {where} cannot be saved "
                    f"({e}). Static values are pickled: use module-level functions and "
                    "classes, not lambdas or local ones."
                ) from e
        raise TypeError(f"save_compiled: {wrapper._name} cannot be saved: {e}") from e
    target = Path(path)

    def write(f: IO[bytes]) -> None:
        f.write(data)

    replace_atomically(os.fspath(target), write, "save_compiled")
    return target


def _resolve(module: str, name: str) -> Any:
    """The object at `module`.`name` (dotted), importing the module."""
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _find(obj: Any) -> tuple[str, str] | None:
    """An importable `(module, name)` holding `obj` (public modules first), or `None`."""
    modules = sorted(sys.modules.items(), key=lambda kv: ("._" in kv[0], kv[0].count("."), kv[0]))
    for module_name, module in modules:
        if module_name.startswith("__main__") or module is None:
            continue
        try:
            items = list(vars(module).items())
        except TypeError:
            continue
        for name, value in items:
            if value is obj:
                return module_name, name
    return None


class _Pickler(pickle.Pickler):
    """Pickles functions by where they can be imported from, also when their own `__qualname__`
    names another object (`jax.nn.relu` is a wrapper of a function named `relu`)."""

    def reducer_override(self, obj: Any) -> Any:
        if not callable(obj) or isinstance(obj, type):
            return NotImplemented
        module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
        if isinstance(module, str) and isinstance(name, str) and "<" not in name:
            try:
                if _resolve(module, name) is obj:  # by reference, even if pickle would not
                    plain = isinstance(obj, types.FunctionType | types.BuiltinFunctionType)
                    return NotImplemented if plain else (_resolve, (module, name))
            except Exception:
                pass
        where = _find(obj)
        return NotImplemented if where is None else (_resolve, where)


def _dumps(obj: Any) -> bytes:
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


def _static_paths(treedef: Any, mask: tuple[bool, ...]) -> list[str]:
    return list(compress(leaf_paths(treedef, "fn"), (not m for m in mask)))


def load_compiled(path: str | os.PathLike[str]) -> LoadedCompiled:
    """Load a step saved by `save_compiled`: a callable that runs it without tracing.

    The file is checked against this process first: the same JAX and jaxlib versions, the same
    platform and device kind, and the devices it was compiled for. Only load files you trust:
    like any pickle (and JAX's serialised executables), loading one can run code.

    Arguments:
        path: the file written by `save_compiled`.

    Returns:
        A `LoadedCompiled`, called like the original function with arguments of the same
        structure, static values, shapes, dtypes and shardings.
    """
    path = Path(path)
    with open(path, "rb") as f:
        try:
            record = pickle.load(f)  # noqa: S301 - documented: trusted files only
        except Exception as e:
            raise ValueError(
                f"load_compiled: {path} is not a step saved by treemod.save_compiled ({e})."
            ) from e
    if not isinstance(record, dict) or record.get("format") != _FORMAT:
        raise ValueError(f"load_compiled: {path} is not a step saved by treemod.save_compiled.")
    if record.get("version") != _VERSION:
        raise ValueError(
            f"load_compiled: {path} has format version {record.get('version')}; this treemod "
            f"reads version {_VERSION}. Compile and save the step again."
        )
    here = _environment()
    for what in ("jax", "jaxlib", "platform", "device_kind"):
        if record[what] != here[what]:
            raise RuntimeError(
                f"load_compiled: {path} was compiled for {what} {record[what]!r}, but this "
                f"process has {here[what]!r}. A compiled executable runs only where it was "
                "compiled: compile and save it again here (or use the persistent compilation "
                "cache, treemod.enable_compile_cache, which recompiles when this changes)."
            )
    by_id = {d.id: d for d in jax.devices()}
    missing = [i for i in record["devices"] if i not in by_id]
    if missing:
        raise RuntimeError(
            f"load_compiled: {path} was compiled for devices {record['devices']}, but this "
            f"process has no device with id {missing} (it has {sorted(by_id)}). Compile and "
            "save it again for these devices."
        )
    from jax.experimental.serialize_executable import deserialize_and_load

    executable = deserialize_and_load(
        record["payload"],
        record["in_tree"],
        record["out_tree"],
        backend=here["platform"],
        execution_devices=[by_id[i] for i in record["devices"]],
    )
    return LoadedCompiled(executable, record, str(path))


class LoadedCompiled:
    """A step loaded by `load_compiled`: call it like the function that was compiled."""

    def __init__(self, executable: Any, record: dict[str, Any], path: str) -> None:
        self._executable = executable
        self._treedef = record["treedef"]
        self._mask = record["mask"]
        self._static = record["static"]
        self._floats = _float_positions(self._static)
        self._static_key = static_key(self._static, self._floats)
        self._avals = record["avals"]
        self._k = record["k"]
        self._name = record["name"]
        self._path = path
        self._shardings = jtu.tree_leaves(executable.input_shardings)

    def __repr__(self) -> str:
        return f"load_compiled({self._path!r}: {self._name})"

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        leaves, treedef = jtu.tree_flatten((None, args, kwargs))
        mask = tuple(IS_ARRAY_TYPE[type(x)] for x in leaves)
        dynamic = list(compress(leaves, mask))
        static = tuple(compress(leaves, (not m for m in mask)))
        avals = tuple(aval_of(x) for x in dynamic)
        if (
            treedef != self._treedef
            or mask != self._mask
            or static_key(static, _float_positions(static)) != self._static_key
            or [a[:2] for a in avals] != [a[:2] for a in self._avals]
        ):
            self._refuse(treedef, mask, static, avals)
        for i, (x, expected) in enumerate(zip(dynamic, self._shardings, strict=True)):
            sharding = getattr(x, "sharding", None)
            if (
                sharding is not None
                and getattr(x, "committed", True)
                and not sharding.is_equivalent_to(expected, len(x.shape))
            ):
                where = self._dynamic_paths()[i]  # only for the message: paths cost a walk
                raise ValueError(
                    f"{self!r}: {where} has sharding {sharding}, but the step was compiled for "
                    f"{expected}. Place it with jax.device_put(x, sharding) (or "
                    "treemod.filter_shard), or compile and save the step for this sharding."
                )
        k = self._k
        if k is None:
            return unpack_output(self._executable(dynamic))
        import warnings

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=UNUSED_DONATION)
            return unpack_output(self._executable(dynamic[:k], dynamic[k:]))

    def _dynamic_paths(self) -> list[str]:
        return list(compress(leaf_paths(self._treedef, "fn"), self._mask))

    def _refuse(
        self, treedef: Any, mask: tuple[bool, ...], static: tuple[Any, ...], avals: tuple[Any, ...]
    ) -> None:
        old = (self._treedef, self._mask, self._static, self._avals)
        lines = explain(old, (treedef, mask, static, avals), "fn")
        raise TypeError(
            f"{self!r} was compiled for other arguments:\n  "
            + "\n  ".join(lines)
            + "\nCall it with arguments like those it was compiled for, or compile and save "
            "the step again for these."
        )
