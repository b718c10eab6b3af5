"""Which checkpoint tensors make each array of a model: the load plan.

`tm.load_state_dict`'s mapping (the general naming rule plus per-layer hooks) rebuilds a model
from a dict of named tensors. Running it on the loaded tensors would hold every tensor twice
where a hook combines them (an `nn.Stack` stacks its layers' tensors into one array), and would
read every tensor whole on every process. So the loader traces the mapping once on abstract
tensors and reads the program it produced: each array of the model is one tensor (`Tensor`) or
a stack of such along a new leading axis (`Stacked`, nested for a Stack of Stacks). Arrays made
any other way (a hook that packs or slices tensors) are `Computed`: the loader then runs the
mapping itself on the read tensors, for those models only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.tree_util as jtu

from treemod._state_dict.layers import NATIVE_HOOKS
from treemod._state_dict.walk import rebuild

__all__ = ["Computed", "Recipe", "Stacked", "Tensor", "plan", "recipe_names", "recipe_path"]


@dataclass(frozen=True)
class Tensor:
    """The array is the checkpoint tensor `name` (cast to the model's dtype)."""

    name: str


@dataclass(frozen=True)
class Stacked:
    """The array stacks `parts` along a new leading axis (an `nn.Stack`'s layers)."""

    parts: tuple[Recipe, ...]


@dataclass(frozen=True)
class Computed:
    """The array is computed from tensors by a hook (the loader runs the mapping for it)."""


Recipe = Tensor | Stacked | Computed


def plan(skeleton: Any, expected: Mapping[str, jax.ShapeDtypeStruct]) -> list[Recipe] | None:
    """The recipe of each array leaf of `skeleton`, in `jtu.tree_leaves` order.

    Arguments:
        skeleton: the model with `jax.ShapeDtypeStruct` leaves.
        expected: every tensor name the mapping reads, with its shape and dtype.

    Returns:
        One recipe per `ShapeDtypeStruct` leaf, or None when the mapping cannot be traced (a hook
        that looks at values): the loader then runs it on the read tensors.
    """
    names = list(expected)

    def build(*arrays: Any) -> list[Any]:
        rebuilt = rebuild(skeleton, dict(zip(names, arrays, strict=True)), NATIVE_HOOKS)
        return [leaf for leaf in jtu.tree_leaves(rebuilt) if isinstance(leaf, jax.Array)]

    try:
        closed = jax.make_jaxpr(build)(*expected.values())
    except Exception:  # a hook that needs concrete values; the loader's fallback handles it
        return None
    jaxpr = closed.jaxpr
    producer = {id(v): eqn for eqn in jaxpr.eqns for v in eqn.outvars}
    inputs = {id(v): name for v, name in zip(jaxpr.invars, names, strict=True)}

    def recipe(var: Any) -> Recipe:
        if id(var) in inputs:
            return Tensor(inputs[id(var)])
        eqn = producer.get(id(var))
        if eqn is not None and eqn.primitive.name == "stack" and eqn.params.get("axis") == 0:
            parts = tuple(recipe(v) for v in eqn.invars)
            if not any(isinstance(p, Computed) for p in parts):
                return Stacked(parts)
        return Computed()

    recipes = [recipe(v) for v in jaxpr.outvars]
    shapes = [leaf for leaf in jtu.tree_leaves(skeleton) if isinstance(leaf, jax.ShapeDtypeStruct)]
    if len(recipes) != len(shapes):
        return None  # the rebuilt model has another structure: let the mapping run itself
    return recipes


def recipe_names(recipe: Recipe) -> list[str]:
    """The tensor names a recipe reads, in order."""
    if isinstance(recipe, Tensor):
        return [recipe.name]
    if isinstance(recipe, Stacked):
        return [n for part in recipe.parts for n in recipe_names(part)]
    return []


def recipe_path(recipe: Recipe, fallback: str) -> str:
    """The name sharding rules see: the tensor's name, with `*` for a Stack's layer index.

    `transformer.h.0.attn.c_attn.weight` ... `transformer.h.11.attn.c_attn.weight` stacked into
    one array read `transformer.h.*.attn.c_attn.weight`.
    """
    names = recipe_names(recipe)
    if not names:
        return fallback
    split = [n.split(".") for n in names]
    if any(len(s) != len(split[0]) for s in split):
        return fallback
    return ".".join(parts[0] if len(set(parts)) == 1 else "*" for parts in zip(*split, strict=True))
