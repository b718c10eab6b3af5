"""Folding adapters into the weights, taking them out, and the trainable/frozen split."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import jax.tree_util as jtu

from treemod._tree.filters import is_inexact_array

from ._layers import LoRALayer
from ._modules_to_save import trainable_ids

__all__ = ["is_lora_layer", "merge", "trainable", "unload", "unmerge"]


def is_lora_layer(x: Any) -> bool:
    """Whether `x` is a LoRA layer (`LoRALinear` or `LoRAConv`)."""
    return isinstance(x, LoRALayer)


def _map_lora(model: Any, fn: Any) -> Any:
    return jtu.tree_map(lambda x: fn(x) if is_lora_layer(x) else x, model, is_leaf=is_lora_layer)


def _rebuilt(module: Any, **changes: Any) -> Any:
    """`module` with some fields changed, made as unflattening makes modules (a layer inside a
    `Stack` holds stacked arrays, which its own field checks would refuse)."""
    new = object.__new__(type(module))
    new.__dict__.update(module.__dict__)
    new.__dict__.update(changes)
    return new


def _with_weight(layer: LoRALayer, sign: float) -> Any:
    base = layer.base_layer
    if not jnp.issubdtype(base.weight.dtype, jnp.inexact):
        raise ValueError(
            f"merge: a {type(layer).__name__}'s base_layer is a {type(base).__name__} whose "
            f"weight holds {base.weight.dtype} (quantised) values, which cannot take the "
            "update exactly; call treemod.quant.dequantise(model) first, then merge."
        )
    delta = layer.delta_weight().astype(base.weight.dtype)
    return _rebuilt(base, weight=base.weight + sign * delta)


def _replace(layer: LoRALayer, base: Any, merged: bool) -> LoRALayer:
    new: LoRALayer = _rebuilt(layer, base_layer=base, merged=merged)
    return new


def merge(model: Any, *, keep_adapters: bool = False) -> Any:
    """Fold every adapter into its base weight: `W + scaling * B @ A` (PEFT's
    `merge_and_unload`, or with `keep_adapters=True` its `merge_adapter`).

    Arguments:
        model: a model with LoRA layers.
        keep_adapters: `False` (default): return plain layers (the adapters are gone; the
            model has the classes it had before `add_lora`). `True`: keep the LoRA layers,
            marked merged (their call then skips the adapter branch), so that `unmerge` can
            take the update out again.

    Returns:
        The merged model; its outputs equal the adapted model's up to rounding.

    Example:
        >>> import jax, jax.numpy as jnp, treemod as tm, treemod.nn as nn, treemod.lora as lora
        >>> mlp = nn.Sequential([nn.Linear(3, 3, key=jax.random.key(0))])
        >>> tuned = lora.add_lora(mlp, ["0"], r=1, alpha=1, key=jax.random.key(1))
        >>> tuned = tm.tree_at(lambda m: m.layers[0].lora_B.weight, tuned, jnp.ones((3, 1)))
        >>> merged = lora.merge(tuned)
        >>> type(merged.layers[0]).__name__
        'Linear'
        >>> bool(jnp.allclose(merged(jnp.ones(3)), tuned(jnp.ones(3))))
        True
    """
    if keep_adapters:
        return _map_lora(
            model, lambda m: m if m.merged else _replace(m, _with_weight(m, 1.0), True)
        )
    return _map_lora(model, lambda m: m.base_layer if m.merged else _with_weight(m, 1.0))


def unmerge(model: Any) -> Any:
    """Take the updates out of layers merged with `merge(model, keep_adapters=True)` (PEFT's
    `unmerge_adapter`): base weights are restored up to float rounding (`(W + d) - d`).

    Arguments:
        model: a model whose LoRA layers were merged with `keep_adapters=True` (layers not
            merged are left as they are).

    Returns:
        The model with unmerged LoRA layers (the adapter branch runs again).
    """
    return _map_lora(model, lambda m: _replace(m, _with_weight(m, -1.0), False) if m.merged else m)


def unload(model: Any) -> Any:
    """Remove the adapters without merging them (PEFT's `unload`): the base layers, with the
    weights they had before `add_lora` (a merged layer is unmerged first).

    Arguments:
        model: a model with LoRA layers.

    Returns:
        The model with plain layers.
    """
    return _map_lora(unmerge(model), lambda m: m.base_layer)


def trainable(model: Any, modules_to_save: Sequence[str] | None = None) -> Any:
    """A filter spec, the model's shape with `True` at the adapters' arrays (every `lora_A` and
    `lora_B` weight) and at the floating arrays of the modules trained whole
    (`modules_to_save`), and `False` everywhere else: pass it to `treemod.partition` to split
    the trainable arrays from the frozen weights, or use it as an optax mask.

    Arguments:
        model: a model with LoRA layers.
        modules_to_save: PEFT's `modules_to_save`: modules trained whole, each selected by a
            name or the end of one (`["classifier"]`); default: the head PEFT trains for the
            model's task (`classifier` or `score` of a `...ForSequenceClassification` or
            `...ForTokenClassification`), none for other models; `[]` for adapters only. Pass
            the same list to `save_adapter`.

    Returns:
        A pytree of bools of the model's structure.

    Example:
        >>> import jax, treemod as tm, treemod.nn as nn, treemod.lora as lora
        >>> mlp = nn.Sequential([nn.Linear(4, 4, key=jax.random.key(0))])
        >>> tuned = lora.add_lora(mlp, ["0"], r=2, alpha=2, key=jax.random.key(1))
        >>> adapters, frozen = tm.partition(tuned, lora.trainable(tuned))
        >>> [x.shape for x in jax.tree_util.tree_leaves(adapters)]
        [(2, 4), (4, 2)]
    """

    def mark(layer: LoRALayer) -> Any:
        children, treedef = jtu.tree_flatten(layer, is_leaf=lambda x: x is not layer)
        adapters = {id(layer.lora_A), id(layer.lora_B)}
        flags = [
            jtu.tree_map(is_inexact_array if id(c) in adapters else (lambda _: False), c)
            for c in children
        ]
        return jtu.tree_unflatten(treedef, flags)

    whole = trainable_ids(model, modules_to_save, "trainable")
    return jtu.tree_map(
        lambda x: mark(x) if is_lora_layer(x) else id(x) in whole and is_inexact_array(x),
        model,
        is_leaf=is_lora_layer,
    )
