"""The rule table: logical axis names (or array paths) to mesh axes, and its presets.

A table is a sequence of pairs, tried in order:

- `(logical name, mesh axes)`: a dimension named `logical name` is split over `mesh axes` (a
  mesh axis name, a tuple of them, or `None` for not split). A name may have several rules:
  the first whose mesh axes this array does not use yet and whose size divides the dimension
  is taken, so `("mlp", "model"), ("mlp", None)` reads "split over `model` where it divides".
  When every rule of a name was refused and one for not dividing, the error names the array's
  path, the axis name and the rule.
- `(regular expression, PartitionSpec)`: an array whose dotted path (its state-dict name for
  models whose fields mirror PyTorch's, as `from_pretrained(sharding=(mesh, rules))` matches)
  is `re.search`ed by the pattern gets that spec, whatever its axis names.

A dimension without a name, or whose name no rule mentions, is not split.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from jax.sharding import Mesh, PartitionSpec

from treemod._sharding.axes import AxisNames

__all__ = [
    "MeshAxes",
    "Rules",
    "ShardingError",
    "check_rules",
    "fsdp_rules",
    "fsdp_tp_rules",
    "mesh_axes",
    "spec_for",
    "tensor_parallel_rules",
]

MeshAxes = str | tuple[str, ...] | None
Rules = Sequence[tuple[str, MeshAxes | PartitionSpec]]

# The names the `nn` layers declare (see each layer's `axis_names`), besides `layers`
# (`nn.Stack`'s layer axis), which no preset splits: `lax.scan` reads one layer per step.
WEIGHT_NAMES = ("embed", "mlp", "heads", "kv", "vocab", "experts", "conv_out", "conv_in", "norm")


class ShardingError(ValueError):
    """A rule table that cannot place an array: the message names its path, axis and rule."""


def fsdp_rules(axis: str = "data") -> tuple[tuple[str, MeshAxes], ...]:
    """Fully sharded data parallelism: every weight split over `axis` on one dimension.

    Each array is split on its first named dimension that `axis`'s size divides; an array
    with none stays replicated. Activations (`treemod.constrain`) are split by `batch`.

    Arguments:
        axis: the mesh axis the batch is split over.

    Returns:
        The rule table.

    Example:
        >>> import treemod as tm
        >>> tm.fsdp_rules()[:2]
        (('embed', 'data'), ('embed', None))
    """
    names = (*WEIGHT_NAMES, "batch")
    return tuple(rule for name in names for rule in ((name, axis), (name, None)))


def tensor_parallel_rules(axis: str = "model") -> tuple[tuple[str, MeshAxes], ...]:
    """Megatron-style tensor parallelism: hidden, head, vocabulary and channel axes split.

    An MLP's up projection is split by output (`mlp`), its down projection by input, attention
    by head (`heads`), embeddings by `vocab`; `embed` stays whole, so each block needs one
    all-reduce after its attention and one after its MLP.

    Arguments:
        axis: the mesh axis the model is split over.

    Returns:
        The rule table.

    Example:
        >>> import treemod as tm
        >>> tm.tensor_parallel_rules()[0]
        ('mlp', 'model')
    """
    return tuple(
        rule
        for name in ("mlp", "heads", "vocab", "conv_out")
        for rule in ((name, axis), (name, None))
    )


def fsdp_tp_rules(data: str = "data", model: str = "model") -> tuple[tuple[str, MeshAxes], ...]:
    """Tensor parallelism over `model` and, on the remaining dimensions, FSDP over `data`.

    Arguments:
        data: the mesh axis of FSDP (and of the batch).
        model: the mesh axis of tensor parallelism.

    Returns:
        The rule table.

    Example:
        >>> import treemod as tm
        >>> rules = tm.fsdp_tp_rules()
        >>> rules[0], ("embed", "data") in rules
        (('mlp', 'model'), True)
    """
    return tensor_parallel_rules(model) + fsdp_rules(data)


def mesh_axes(axes: MeshAxes) -> tuple[str, ...]:
    """The mesh axis names of a rule's target (`None`: none)."""
    return () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)


def check_rules(rules: Rules, mesh: Mesh) -> None:
    """Raise `ShardingError` for a malformed rule or one naming an axis `mesh` lacks."""
    for rule in rules:
        if not (isinstance(rule, tuple) and len(rule) == 2 and isinstance(rule[0], str)):
            raise ShardingError(f"each sharding rule is (name or regex, mesh axes); got {rule!r}.")
        if isinstance(rule[1], PartitionSpec):
            try:
                re.compile(rule[0])
            except re.error as e:
                raise ShardingError(f"rule {rule!r}: not a regular expression ({e}).") from None
            axes = [a for entry in rule[1] for a in mesh_axes(entry)]
        else:
            axes = list(mesh_axes(rule[1]))
        for axis in axes:
            if axis not in mesh.shape:
                raise ShardingError(
                    f"rule {rule!r} names mesh axis {axis!r}; the mesh has {tuple(mesh.shape)}."
                )


def spec_for(
    path: str, shape: tuple[int, ...], names: AxisNames, mesh: Mesh, rules: Rules
) -> PartitionSpec:
    """The `PartitionSpec` the rule table gives one array.

    Arguments:
        path: the array's dotted path (named in errors, matched by path rules).
        shape: its shape.
        names: its logical axis names (`()`: none declared).
        mesh: the device mesh.
        rules: the rule table.

    Returns:
        The spec, dividing `shape` on `mesh`.

    Raises:
        ShardingError: a path rule does not fit the array, or a named dimension has rules but
            none that divides it.
    """
    for pattern, target in rules:
        if isinstance(target, PartitionSpec) and re.search(pattern, path):
            if len(target) > len(shape):
                raise ShardingError(
                    f"{path}: rule {pattern!r} gives {target} to shape {shape}, which has "
                    f"only {len(shape)} axes."
                )
            for size, entry in zip(shape, target, strict=False):
                n = math.prod(mesh.shape[a] for a in mesh_axes(entry))
                if size % n:
                    raise ShardingError(
                        f"{path}: rule {pattern!r} splits a dimension of size {size} over "
                        f"{entry!r} ({n} devices), which does not divide it; change the rule "
                        f"or the mesh."
                    )
            return target
    if len(names) > len(shape):
        raise ShardingError(
            f"{path}: {len(names)} axis names {names} declared for an array of shape {shape}."
        )
    used: set[str] = set()
    spec: list[MeshAxes] = []
    for dim, (size, name) in enumerate(zip(shape, names, strict=False)):
        chosen: MeshAxes = None
        refused: tuple[str, Any] | None = None
        for rule_name, target in rules:
            if rule_name != name or isinstance(target, PartitionSpec):
                continue
            axes = mesh_axes(target)
            if used.intersection(axes):
                continue
            if size % math.prod(mesh.shape[a] for a in axes):
                refused = refused or (rule_name, target)
                continue
            chosen = target
            refused = None
            used.update(axes)
            break
        if refused is not None:
            n = math.prod(mesh.shape[a] for a in mesh_axes(refused[1]))
            raise ShardingError(
                f"{path}: dimension {dim} (axis {name!r}, size {size}) cannot be split by rule "
                f"{refused!r}: {n} devices do not divide {size}. Add a fallback rule "
                f"({name!r}, None) after it, or change the mesh."
            )
        spec.append(chosen)
    while spec and spec[-1] is None:
        spec.pop()
    return PartitionSpec(*spec)
