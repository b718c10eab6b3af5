"""`treemod.precision`: mixed precision by layer type, and dynamic loss scaling for float16.

`apply_policy(model, jnp.bfloat16)` keeps parameters in float32, runs each layer's arithmetic
in bfloat16 (normalisation in float32) and returns float32; `DynamicLossScale` scales float16
losses, skips steps whose gradients are not finite and adjusts the scale.
"""

from treemod.precision._loss_scale import DynamicLossScale, all_finite, select_tree
from treemod.precision._policy import (
    FLOAT32_LAYERS,
    Policy,
    apply_policy,
    policy_of,
    remove_policy,
)

__all__ = [
    "FLOAT32_LAYERS",
    "DynamicLossScale",
    "Policy",
    "all_finite",
    "apply_policy",
    "policy_of",
    "remove_policy",
    "select_tree",
]
