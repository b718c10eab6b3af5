"""`from_pretrained`: a Hugging Face checkpoint directory into the zoo model its config names.

The model is first built shape-only (`filter_eval_shape` of `from_config`: no weights
allocated), its tensor names and shapes are compared with the files' headers (every problem in
one error), and each array is then read from the files and placed where it belongs: on the
default device, or straight onto its shards with `jax.make_array_from_callback`, each process
reading only the slices its own devices hold. The host holds one tensor at a time besides the
model, so loading peaks near the checkpoint's size, not twice it.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from typing import Any, Literal, overload

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

import treemod.nn as nn
from treemod._saving.errors import CheckpointError
from treemod._saving.safetensors_files import FileTensor, aligned_empty
from treemod._state_dict.layers import NATIVE_HOOKS
from treemod._state_dict.report import StateDictMismatch, StateDictReport, compare_tensors
from treemod._state_dict.walk import expected_tensors, name_tensors, rebuild
from treemod._transforms.eval_shape import filter_eval_shape
from treemod._transforms.remat import RematPolicy
from treemod.models._base import PretrainedConfig, PretrainedModel, architecture_class
from treemod.models._files import (
    CONFIG,
    Checkpoint,
    directory_of,
    read_config,
    read_generation_config,
)
from treemod.models._names import base_prefix, ignored, model_names
from treemod.models._plan import Computed, Recipe, Stacked, Tensor, plan, recipe_path
from treemod.models._sharding import (
    ShardingFunction,
    ShardingLike,
    sharding_for,
    sharding_function,
)

__all__ = ["from_pretrained", "load_into"]


@overload
def from_pretrained(
    path: str | os.PathLike[str],
    *,
    dtype: Any = None,
    strict: Literal[True] = True,
    sharding: ShardingLike | None = None,
    key: Any = None,
    architecture: str | type[PretrainedModel] | None = None,
    remat: bool | RematPolicy = False,
) -> PretrainedModel: ...


@overload
def from_pretrained(
    path: str | os.PathLike[str],
    *,
    dtype: Any = None,
    strict: Literal[False],
    sharding: ShardingLike | None = None,
    key: Any = None,
    architecture: str | type[PretrainedModel] | None = None,
    remat: bool | RematPolicy = False,
) -> tuple[PretrainedModel, StateDictReport]: ...


def from_pretrained(
    path: str | os.PathLike[str],
    *,
    dtype: Any = None,
    strict: bool = True,
    sharding: ShardingLike | None = None,
    key: Any = None,
    architecture: str | type[PretrainedModel] | None = None,
    remat: bool | RematPolicy = False,
) -> PretrainedModel | tuple[PretrainedModel, StateDictReport]:
    """Load a local Hugging Face checkpoint directory into the treemod model its config names.

    The directory holds `config.json` and the weights as `model.safetensors`, or as shards
    listed by `model.safetensors.index.json` (what `save_pretrained` of `transformers` or of
    treemod writes). The class is the registered zoo model named by the config's
    `architectures[0]` (see `registered_architectures()`). Tensors are read one at a time with
    the `safetensors` library (PyTorch is not needed), so memory peaks near the checkpoint's
    size. Tied weights (`model.tied_weights()`) load as one array: a tied name in the file
    must equal the tensor it is tied to. A `config.json` with a `quantization_config`
    (bitsandbytes NF4 or int8, GPTQ, AWQ, compressed-tensors `pack-quantized`) loads into
    `treemod.quant`'s layers holding the stored packed arrays as they are.

    Arguments:
        path: the checkpoint directory.
        dtype: the floating dtype of the model (`jnp.bfloat16`, `"float32"`, ...); tensors are
            cast to it. Default: the dtype of the checkpoint's floating tensors.
        strict: with `True` (the default), every missing, unexpected and mis-shaped tensor is
            named in one `CheckpointError` and nothing is loaded. With `False`, the tensors
            that fit are loaded, the others keep `from_config`'s random values (drawn from
            `key`), and a `StateDictReport` says what was left out.
        sharding: where the arrays go: a function `(path, shape, dtype) -> Sharding`, or a pair
            `(mesh, {regex: PartitionSpec})` matched against the path (the first rule that
            `re.search`es it wins; none: replicated). The path is the tensor's name in the
            checkpoint, with `*` for an `nn.Stack`'s layer index
            (`transformer.h.*.mlp.c_fc.weight`). Each process reads only the bytes of the
            shards its devices hold. Default: the default device.
        key: the PRNG key for `from_config` when `strict=False` leaves tensors missing
            (default `jax.random.key(0)`).
        architecture: the class to build instead of the config's `architectures[0]`: a
            registered name (`"GPT2Model"`) or a `PretrainedModel` subclass. A checkpoint of a
            model with a head loads into its base model this way (the head's tensors are then
            unexpected: pass `strict=False`), and a base model's checkpoint into the model with
            a head (as `transformers`' `GPT2LMHeadModel.from_pretrained` does).
        remat: the rematerialisation policy of the model's layer stacks (`nn.Stack`), for
            training: `True` (save nothing), `"dots"`, checkpoint names, or a
            `jax.checkpoint_policies` function (see `nn.Stack`); default `False`.

    Returns:
        The model, or `(model, report)` with `strict=False`.

    Raises:
        CheckpointError: the directory has no `config.json` or weights, the architecture is
            not registered, a file is damaged or truncated, an index names a missing shard, or
            (strict) the tensors do not match the model. The message names the file and tensors.

    Example:
        >>> import tempfile, jax, jax.numpy as jnp
        >>> from treemod.models import from_pretrained, save_pretrained
        >>> from treemod.models.gpt2 import GPT2LMHeadModel
        >>> config = {"n_embd": 16, "n_layer": 2, "n_head": 2, "vocab_size": 50}
        >>> model = GPT2LMHeadModel.from_config(config, key=jax.random.key(0))
        >>> directory = tempfile.mkdtemp()
        >>> save_pretrained(model, directory)
        >>> loaded = from_pretrained(directory)
        >>> ids = jnp.array([[1, 2, 3]])
        >>> bool(jnp.allclose(loaded(input_ids=ids), model(input_ids=ids)))
        True
        >>> half = from_pretrained(directory, dtype=jnp.bfloat16)
        >>> half.transformer.wte.weight.dtype
        dtype(bfloat16)
    """
    directory = directory_of(path)
    config = read_config(directory)
    if isinstance(architecture, type):
        if not issubclass(architecture, PretrainedModel):
            raise TypeError(
                f"from_pretrained(architecture={architecture.__name__}): not a subclass of "
                f"treemod.models.PretrainedModel."
            )
        cls = architecture
    elif architecture is not None:
        cls = architecture_class(architecture, f"from_pretrained(architecture={architecture!r})")
    else:
        architectures = config.get("architectures")
        if not (isinstance(architectures, list) and architectures):
            raise CheckpointError(
                f"{directory / CONFIG} has no 'architectures' list naming the model class "
                f'(e.g. "architectures": ["GPT2LMHeadModel"]); add it, or pass '
                f"architecture='GPT2LMHeadModel' (or the class)."
            )
        cls = architecture_class(architectures[0], str(directory / CONFIG))
    checkpoint = Checkpoint(directory)
    model_dtype = jnp.dtype(dtype) if dtype is not None else _checkpoint_dtype(checkpoint)

    full_config = PretrainedConfig(config, generation=read_generation_config(directory))
    convert: Any = None
    if "quantization_config" in config:  # the stored packed arrays load into quantised layers
        from treemod.quant._hub import hub_loader

        where = str(directory / CONFIG)
        convert, checkpoint = hub_loader(config["quantization_config"], checkpoint, where)

    def build(k: Any) -> PretrainedModel:
        model = cls.from_config(full_config, key=k, dtype=model_dtype)
        return model if convert is None else convert(model)

    # An abstract key: making a concrete one compiles a program (~0.7 s), needed only when a
    # partial load leaves tensors to draw at random.
    abstract_key = jax.eval_shape(jax.random.key, 0) if key is None else key
    try:
        skeleton = filter_eval_shape(build, abstract_key)
    except CheckpointError as e:  # a refused config value: name the file it is in
        raise CheckpointError(f"{directory / CONFIG}: {e}") from None

    def build_concrete() -> PretrainedModel:
        return build(jax.random.key(0) if key is None else key)

    loaded, report = load_into(
        skeleton, checkpoint, strict=strict, sharding=sharding, build=build_concrete
    )
    if remat is not False:
        loaded = with_remat(loaded, remat)
    return loaded if strict else (loaded, report)


def with_remat(model: Any, remat: bool | RematPolicy) -> Any:
    """`model` with every `nn.Stack` in it rematerialising by `remat` (see `from_pretrained`)."""

    def one(x: Any) -> Any:
        return x.with_remat(remat) if isinstance(x, nn.Stack) else x

    return jax.tree.map(one, model, is_leaf=lambda x: isinstance(x, nn.Stack))


def _checkpoint_dtype(checkpoint: Checkpoint) -> Any:
    """The floating dtype most of the checkpoint's bytes are in (float32 if none)."""
    counts: Counter[Any] = Counter()
    for info in checkpoint.tensors.values():
        if jnp.issubdtype(info.dtype, jnp.floating):
            counts[info.dtype] += info.nbytes
    return counts.most_common(1)[0][0] if counts else jnp.dtype(jnp.float32)


def _compare(
    expected: Mapping[str, jax.ShapeDtypeStruct],
    files: Mapping[str, FileTensor],
    tied: Mapping[str, str],
    directory: str,
    model_cls: type,
) -> tuple[StateDictReport, dict[str, str], list[tuple[str, str]]]:
    """The report, which tensor each expected name reads, and the tied pairs to check (all by
    the model's names; `files` holds the checkpoint's tensors under the model's names)."""
    source_of: dict[str, str] = {n: n for n in expected if n in files}
    to_check: list[tuple[str, str]] = []
    for alias, target in tied.items():
        if target in expected and alias in files:
            if target in files:
                to_check.append((alias, target))
            else:  # only the alias was written: the tied array loads from it
                source_of[target] = alias
    used = set(source_of.values()) | {a for a, _ in to_check}
    unexpected = tuple(sorted(n for n in files if n not in used and not ignored(n, model_cls)))
    found = {n: (files[src].shape, files[src].dtype) for n, src in source_of.items()}
    missing, mismatched, fits = compare_tensors(expected, found, source_of)
    source_of = {name: source_of[name] for name in fits}
    for alias, target in list(to_check):
        info, needed = files[alias], expected[target]
        if info.shape != tuple(needed.shape):
            shape, dtype = tuple(needed.shape), str(needed.dtype)
            mismatched.append(StateDictMismatch(alias, shape, dtype, info.shape, str(info.dtype)))
            to_check.remove((alias, target))
    mismatched.sort(key=lambda m: m.name)
    report = StateDictReport(missing, unexpected, tuple(mismatched), directory)
    return report, source_of, to_check


def _message(model: Any, files: Mapping[str, FileTensor], report: StateDictReport) -> str:
    lines = [
        f"from_pretrained({type(model).__name__}): the tensors in {report.source} do "
        f"not match the model:",
        report.describe(),
    ]
    for m in report.mismatched:
        lines.append(f"  {m.name} is in {files[m.name].file.name}")
    for n in report.unexpected:
        lines.append(f"  {n} is in {files[n].file.name}")
    lines.append(
        "Nothing was loaded. The checkpoint was saved from another model or config, or is "
        "damaged; tm.state_dict(model) lists the names the model expects. Pass strict=False "
        "to load what fits and get a report of what was left out."
    )
    return "\n".join(lines)


def _tied_equal(checkpoint: Checkpoint, alias: str, target: str) -> bool:
    """Whether the tied tensors hold the same values, compared in row blocks of ~64 MB."""
    info = checkpoint.tensors[target]
    rows = info.shape[0] if info.shape else 1
    per_row = max(1, info.nbytes // max(rows, 1))
    step = max(1, (64 << 20) // per_row)
    for start in range(0, rows, step):
        index = None if not info.shape else [slice(start, min(rows, start + step))]
        a, b = checkpoint.read(alias, index), checkpoint.read(target, index)
        if a.dtype != b.dtype:
            a, b = a.astype(np.float64), b.astype(np.float64)
        if not np.array_equal(a, b):
            return False
    return True


def load_into(
    skeleton: Any,
    checkpoint: Checkpoint,
    *,
    strict: bool,
    sharding: ShardingLike | None,
    build: Any,
) -> tuple[Any, StateDictReport]:
    """Fill the shape-only `skeleton` from `checkpoint` (see `from_pretrained`).

    `build()` makes the model with its random initial values, called only when a partial load
    leaves tensors missing or mis-shaped.
    """
    expected = expected_tensors(skeleton, NATIVE_HOOKS)
    tied = skeleton.tied_weights() if isinstance(skeleton, PretrainedModel) else {}
    renames = type(skeleton).load_renames if isinstance(skeleton, PretrainedModel) else ()
    wanted = {**expected, **dict.fromkeys(tied)}
    names = model_names(checkpoint.tensors, wanted, renames, base_prefix(skeleton))
    files = {name: checkpoint.tensors[file] for name, file in names.items()}
    directory = str(checkpoint.directory)
    report, source_of, to_check = _compare(expected, files, tied, directory, type(skeleton))
    if strict and not report.complete:
        raise CheckpointError(_message(skeleton, files, report))
    source_of = {name: files[source].name for name, source in source_of.items()}
    for alias, target in to_check:
        if not _tied_equal(checkpoint, files[alias].name, files[target].name):
            if strict:
                raise CheckpointError(
                    f"from_pretrained({type(skeleton).__name__}): {alias} (in "
                    f"{files[alias].file.name}) is tied to {target} (in "
                    f"{files[target].file.name}) but holds other values; the "
                    f"model holds one array for both. Nothing was loaded."
                )
            report = StateDictReport(
                report.missing,
                tuple(sorted((*report.unexpected, alias))),
                report.mismatched,
                report.source,
            )
    place = sharding_function(sharding) if sharding is not None else None
    recipes = plan(skeleton, expected) if report.complete else None
    if recipes is None or any(isinstance(r, Computed) for r in recipes):
        return _load_by_mapping(skeleton, checkpoint, expected, source_of, place, build), report
    leaves, treedef = jtu.tree_flatten(skeleton)
    recipe_iter = iter(recipes)
    out = []
    for leaf in leaves:
        if isinstance(leaf, jax.ShapeDtypeStruct):
            recipe = next(recipe_iter)
            out.append(_materialise(recipe, leaf, checkpoint, source_of, place))
        else:
            out.append(leaf)
    return jtu.tree_unflatten(treedef, out), report


def _full(shape: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(slice(0, n) for n in shape)


def _normalise(index: tuple[Any, ...], shape: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(slice(*s.indices(n)[:2]) for s, n in zip(index, shape, strict=True))


def _fill(
    recipe: Recipe,
    index: tuple[slice, ...],
    out: np.ndarray,
    checkpoint: Checkpoint,
    source_of: Mapping[str, str],
) -> None:
    """Write the values of `recipe` at `index` (slices with explicit bounds) into `out`."""
    if isinstance(recipe, Tensor):
        checkpoint.read_into(source_of[recipe.name], index, out)
        return
    assert isinstance(recipe, Stacked)
    for i, layer in enumerate(range(len(recipe.parts))[index[0]]):
        # `out[i, ...]` is a view even where `out[i]` would be a scalar (a stacked 0-d tensor).
        _fill(recipe.parts[layer], index[1:], out[i, ...], checkpoint, source_of)


def _read(
    recipe: Recipe,
    index: tuple[slice, ...],
    dtype: Any,
    checkpoint: Checkpoint,
    source_of: Mapping[str, str],
) -> np.ndarray:
    out = aligned_empty(tuple(s.stop - s.start for s in index), dtype)
    _fill(recipe, index, out, checkpoint, source_of)
    return out


def _materialise(
    recipe: Recipe,
    leaf: jax.ShapeDtypeStruct,
    checkpoint: Checkpoint,
    source_of: Mapping[str, str],
    place: ShardingFunction | None,
) -> jax.Array:
    shape, dtype = tuple(leaf.shape), leaf.dtype
    if place is None:
        array: jax.Array = jax.device_put(_read(recipe, _full(shape), dtype, checkpoint, source_of))
        return array
    where = sharding_for(place, recipe_path(recipe, "?"), shape, dtype)
    done: dict[tuple[tuple[int, int], ...], np.ndarray] = {}

    def callback(index: tuple[slice, ...] | None) -> np.ndarray:
        bounds = _full(shape) if index is None else _normalise(index, shape)
        k = tuple((s.start, s.stop) for s in bounds)
        if k not in done:  # devices holding the same slice read it once
            done[k] = _read(recipe, bounds, dtype, checkpoint, source_of)
        return done[k]

    return jax.make_array_from_callback(shape, where, callback)


def _load_by_mapping(
    skeleton: Any,
    checkpoint: Checkpoint,
    expected: Mapping[str, jax.ShapeDtypeStruct],
    source_of: Mapping[str, str],
    place: ShardingFunction | None,
    build: Any,
) -> Any:
    """The general path: read every tensor whole and run the mapping on them.

    Taken for partial loads (the missing tensors come from the built model) and for models with
    hooks that compute arrays from several tensors; it holds the tensors and the model at once.
    """
    values: dict[str, Any] = {}
    for name, needed in expected.items():
        if name in source_of:
            values[name] = jnp.asarray(
                checkpoint.read(source_of[name]).astype(needed.dtype, copy=False)
            )
    base = skeleton
    if len(values) < len(expected):
        base = build()
        current = name_tensors(base, NATIVE_HOOKS)
        values.update((n, current[n]) for n in expected if n not in values)
    model = rebuild(base, values, NATIVE_HOOKS)
    del values
    if place is None:
        return model
    paths_leaves, treedef = jtu.tree_flatten_with_path(model)
    placed = []
    for path, leaf in paths_leaves:
        if isinstance(leaf, jax.Array):
            name = jtu.keystr(path, simple=True, separator=".")
            leaf = jax.device_put(leaf, sharding_for(place, name, tuple(leaf.shape), leaf.dtype))
        placed.append(leaf)
    return jtu.tree_unflatten(treedef, placed)
