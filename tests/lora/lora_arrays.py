"""LoRA test helpers that need no reference library (so that torch-free tests import them)."""

from __future__ import annotations

from typing import Any

import jax

import treemod as tm
import treemod.lora as lora


def randomise_b(model: Any, seed: int = 4) -> Any:
    """Random non-zero B in every LoRA layer (B starts at zero), so that adapters matter: the
    treemod side of `peft_reference.randomise_peft_b`."""
    keys = iter(jax.random.split(jax.random.key(seed), 1000))

    def one(layer: Any) -> Any:
        w = layer.lora_B.weight
        return tm.tree_at(
            lambda m: m.lora_B.weight, layer, 0.3 * jax.random.normal(next(keys), w.shape)
        )

    with tm.shape_checks(False):  # a LoRA layer of a Stack holds stacked arrays
        return jax.tree_util.tree_map(
            lambda x: one(x) if lora.is_lora_layer(x) else x, model, is_leaf=lora.is_lora_layer
        )
