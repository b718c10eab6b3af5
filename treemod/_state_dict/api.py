"""`state_dict` and `load_state_dict`: a treemod model's tensors under PyTorch's names.

`treemod/__init__.py` imports this file eagerly, so it imports nothing of treemod at module
level: the walk, the sources and the native hooks (which import `treemod.nn`) are imported at
the first call, keeping `import treemod` free of `treemod.nn`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

import jax
import jax.numpy as jnp
import numpy as np

from .report import StateDictReport, compare_tensors

if TYPE_CHECKING:
    from .sources import Source

__all__ = ["load_state_dict", "state_dict"]

_M = TypeVar("_M")

StateDictLike = Mapping[str, Any] | str | os.PathLike[str] | Iterable[str | os.PathLike[str]]


def state_dict(model: Any) -> dict[str, np.ndarray]:
    """The model's tensors under PyTorch's names, as NumPy arrays (host copies).

    Names follow one general rule: fields by attribute name, list and tuple items by index,
    dict entries by key, joined with dots (`features.0.weight`); a `State` (BatchNorm's
    running statistics) takes its field's name, and `None` (no bias) gives no name. Layers
    whose PyTorch twin stores its tensors differently map to PyTorch's names through per-type
    hooks: `nn.Stack` expands its layer axis (`layers.0.self_attn.q_proj.weight`),
    `nn.Sequential` numbers its layers, `nn.BatchNorm` adds `num_batches_tracked`,
    `nn.MultiheadAttention` packs `in_proj_weight`, `nn.LSTMCell`/`nn.GRUCell` give
    `bias_ih`/`bias_hh`, channels-last kernels are written channels-first, and so on (see
    "Mirroring your own PyTorch model" in the docs); `register_state_dict_hooks` adds your own.
    Arrays keep the model's dtypes.

    Arguments:
        model: a treemod model (any pytree of modules, lists, tuples and dicts).

    Returns:
        A dict from names to NumPy arrays, which `torch.nn.Module.load_state_dict` accepts
        after `torch.from_numpy` (or `safetensors.numpy.save_file` writes as a file).

    Example:
        >>> import jax, treemod as tm
        >>> model = tm.nn.Sequential([tm.nn.Linear(3, 4, key=jax.random.key(0)),
        ...                           tm.nn.BatchNorm(4)])
        >>> {k: v.shape for k, v in tm.state_dict(model).items()}  # doctest: +NORMALIZE_WHITESPACE
        {'0.weight': (4, 3), '0.bias': (4,), '1.weight': (4,), '1.bias': (4,),
         '1.running_mean': (4,), '1.running_var': (4,), '1.num_batches_tracked': ()}
    """
    from .layers import NATIVE_HOOKS
    from .walk import name_tensors

    tensors = name_tensors(model, NATIVE_HOOKS)
    out: dict[str, np.ndarray] = {}
    for name, value in tensors.items():
        if isinstance(value, jax.ShapeDtypeStruct) or isinstance(value, jax.core.Tracer):
            raise ValueError(
                f"state_dict: tensor {name!r} has no value ({value}); state_dict needs a "
                "concrete model (call it outside jit, on a model with arrays)."
            )
        out[name] = np.array(value)
    return out


@overload
def load_state_dict(
    model: _M, state_dict: StateDictLike, *, strict: Literal[True] = True
) -> _M: ...


@overload
def load_state_dict(
    model: _M, state_dict: StateDictLike, *, strict: Literal[False]
) -> tuple[_M, StateDictReport]: ...


@overload
def load_state_dict(
    model: _M, state_dict: StateDictLike, *, strict: bool
) -> _M | tuple[_M, StateDictReport]: ...


def load_state_dict(
    model: _M, state_dict: StateDictLike, *, strict: bool = True
) -> _M | tuple[_M, StateDictReport]:
    """A copy of `model` with its tensors loaded from a PyTorch-named state dict.

    The names are those of `treemod.state_dict` (see there), so a treemod model whose attribute
    names mirror a PyTorch model's loads that model's `state_dict()` with no mapping code.
    Values are cast to the model's dtypes (a bfloat16 file loads into a float32 model); a dtype
    of another kind (a float tensor for an integer one, an integer for a float) is refused.

    Strict (the default): every missing, unexpected, mis-shaped and dtype-incompatible tensor
    is named in one `treemod.CheckpointError` (with the file, for a path), and nothing is
    loaded. With `strict=False` the tensors that fit are loaded, the others keep the model's
    values, and a `StateDictReport` says what was left out.

    Arguments:
        model: the model to load into (it is not changed). It may be abstract (from
            `treemod.filter_eval_shape`, its arrays `jax.ShapeDtypeStruct`s): a strict load
            then fills every array without building the model's own first; a non-strict one
            leaves `jax.ShapeDtypeStruct`s where nothing loaded (the report names them).
        state_dict: a mapping from names to NumPy arrays, JAX arrays or torch tensors (torch is
            never imported by treemod; tensors are converted through NumPy), or the path of a
            `.safetensors` file (or a list of paths: a sharded checkpoint), read one tensor at a
            time.
        strict: refuse any mismatch (`True`), or load what fits and report the rest (`False`).

    Returns:
        The new model (strict), or `(new model, report)` with `strict=False`.

    Raises:
        CheckpointError: strict, and the state dict does not match the model; or a file is
            unreadable, or a hook refuses a value (the message names the layer).

    Example:
        >>> import jax, numpy as np, treemod as tm
        >>> fc = tm.nn.Linear(3, 2, key=jax.random.key(0))
        >>> weights = {"weight": np.ones((2, 3), np.float32), "bias": np.zeros(2, np.float32)}
        >>> tm.load_state_dict(fc, weights).weight
        Array([[1., 1., 1.],
               [1., 1., 1.]], dtype=float32)
        >>> try:
        ...     tm.load_state_dict(fc, {"weight": np.ones((3, 2), np.float32)})
        ... except tm.CheckpointError as e:
        ...     print(e)  # doctest: +ELLIPSIS
        load_state_dict(Linear): the state dict does not match the model:
          missing (1): bias
          mismatched: weight: found float32[3,2], the model needs float32[2,3]
        Nothing was loaded...
    """
    from treemod._saving.errors import CheckpointError

    from .layers import NATIVE_HOOKS
    from .sources import open_source
    from .walk import expected_tensors, name_tensors, rebuild

    source = open_source(state_dict)
    try:
        expected = expected_tensors(model, NATIVE_HOOKS)
        report, fits = _compare(expected, source)
        if strict and not report.complete:
            raise CheckpointError(_message(model, source, report))
        values: dict[str, Any] = {
            name: _convert(source.read(name), expected[name].dtype) for name in fits
        }
    finally:
        source.close()
    if not report.complete:
        # The model's own values where nothing loaded (abstract ones stay abstract).
        abstract = any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(model))
        current: Mapping[str, Any] = expected if abstract else name_tensors(model, NATIVE_HOOKS)
        values.update((name, current[name]) for name in expected if name not in values)
    new: _M = rebuild(model, values, NATIVE_HOOKS)
    return new if strict else (new, report)


def _compare(
    expected: Mapping[str, jax.ShapeDtypeStruct], source: Source
) -> tuple[StateDictReport, list[str]]:
    names = source.names()
    found = {name: source.info(name) for name in names if name in expected}
    missing, mismatched, fits = compare_tensors(expected, found)
    unexpected = tuple(sorted(n for n in names if n not in expected))
    return StateDictReport(missing, unexpected, tuple(mismatched), source.path), fits


def _message(model: Any, source: Source, report: StateDictReport) -> str:
    text = (
        f"load_state_dict({type(model).__name__}): {source.description} does not match the "
        f"model:\n{report.describe()}"
    )
    if source.path is None and source.description != "the state dict":
        files = [f"  {m.name} is in {source.where(m.name)}" for m in report.mismatched]
        files += [f"  {n} is in {source.where(n)}" for n in report.unexpected]
        text += "\n" + "\n".join(files)
    return text + (
        "\nNothing was loaded. Rename the tensors or the model's attributes so that they "
        "match (treemod.state_dict(model) lists the names the model expects), or pass "
        "strict=False to load the rest and get a report of what was left out."
    )


def _convert(value: Any, dtype: Any) -> jax.Array:
    if isinstance(value, jax.Array):
        return value if value.dtype == dtype else value.astype(dtype)
    return jnp.asarray(np.asarray(value).astype(dtype, copy=False))
