"""`from_pretrained(..., sharding=...)`: where each array of the model goes.

Two forms: a function `(path, shape, dtype) -> jax.sharding.Sharding`, or a pair
`(mesh, rules)` where `rules` maps regular expressions over the path to `PartitionSpec`s (the
first rule whose pattern `re.search`es the path wins; no match: replicated over the mesh). The
path is the checkpoint's tensor name, with `*` for an `nn.Stack`'s layer index
(`transformer.h.*.attn.c_attn.weight` for the stacked array of every layer's tensor).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = ["ShardingFunction", "ShardingLike", "sharding_for", "sharding_function"]

ShardingFunction = Callable[[str, tuple[int, ...], Any], jax.sharding.Sharding]
Rules = Mapping[str, PartitionSpec] | Sequence[tuple[str, PartitionSpec]]
ShardingLike = ShardingFunction | tuple[Mesh, Rules]


def sharding_function(sharding: ShardingLike) -> ShardingFunction:
    """`sharding=` as a function of (path, shape, dtype), with every rule checked up front."""
    if isinstance(sharding, tuple) and len(sharding) == 2 and isinstance(sharding[0], Mesh):
        mesh, rules = sharding
        pairs = list(rules.items()) if isinstance(rules, Mapping) else list(rules)
        compiled = []
        for pair in pairs:
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise TypeError(
                    f"from_pretrained(sharding=(mesh, rules)): each rule is (regex, "
                    f"PartitionSpec); got {pair!r}."
                )
            pattern, spec = pair
            if not isinstance(spec, PartitionSpec):
                raise TypeError(
                    f"from_pretrained(sharding=(mesh, rules)): rule {pattern!r} maps to "
                    f"{spec!r}, not a jax.sharding.PartitionSpec."
                )
            try:
                compiled.append((pattern, re.compile(pattern), spec))
            except re.error as e:
                raise ValueError(
                    f"from_pretrained(sharding=(mesh, rules)): rule {pattern!r} is not a "
                    f"regular expression ({e})."
                ) from None

        def by_rules(path: str, shape: tuple[int, ...], dtype: Any) -> jax.sharding.Sharding:
            for pattern, regex, spec in compiled:
                if regex.search(path):
                    if len(spec) > len(shape):
                        raise ValueError(
                            f"from_pretrained(sharding=...): rule {pattern!r} gives {spec} to "
                            f"{path} of shape {shape}, which has only {len(shape)} axes."
                        )
                    return _divides(NamedSharding(mesh, spec), path, shape, f"rule {pattern!r}")
            return NamedSharding(mesh, PartitionSpec())

        return by_rules
    if callable(sharding):
        return sharding
    raise TypeError(
        f"from_pretrained(sharding=...) takes a function (path, shape, dtype) -> Sharding or a "
        f"pair (mesh, {{regex: PartitionSpec}}); got {type(sharding).__name__}."
    )


def _divides(
    sharding: jax.sharding.Sharding, path: str, shape: tuple[int, ...], source: str
) -> jax.sharding.Sharding:
    try:
        sharding.shard_shape(shape)
    except ValueError as e:  # jax's IndivisibleError, naming neither tensor nor rule
        raise ValueError(
            f"from_pretrained(sharding=...): {source} gives {path} of shape {shape} the "
            f"sharding {sharding}, which does not divide it evenly ({e}). Change the rule or "
            f"the mesh so that each sharded axis is a multiple of its mesh axes' size."
        ) from None
    return sharding


def sharding_for(
    place: ShardingFunction, path: str, shape: tuple[int, ...], dtype: Any
) -> jax.sharding.Sharding:
    """`place`'s sharding for a tensor, checked to divide its shape (the error names both).

    Arguments:
        place: the sharding function (`sharding_function`'s result).
        path: the tensor's checkpoint name.
        shape: its shape.
        dtype: its dtype.

    Returns:
        The sharding.
    """
    return _divides(place(path, shape, dtype), path, shape, "the sharding function")
